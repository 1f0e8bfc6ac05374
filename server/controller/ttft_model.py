"""TTFT model for the SLO constraint.

A new request waits for the running step to end (on average half a step) and
then rides the next step, which carries its prefill next to everyone else's
decode tokens, so::

    TTFT(class, config, B) ~ t_class + kappa * step(config, B) + residual

``t_class`` (prefill, queueing, network) is fitted per latency class, ``kappa``
is shared; the quantile is the fitted mean plus the empirical quantile of the
class's recent residuals. Configs never run get a TTFT through the step-time
model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from ._linalg import quantile
from .observation import LATENCY_CLASSES, Observation
from .settings import SLOSettings
from .spec import OFF, Mode

StepFn = Callable[[Mode, int, float], "float | None"]


@dataclass(frozen=True)
class TTFTFit:
    intercept: dict[str, float]
    kappa: float
    resid_q: dict[str, float]
    samples: dict[str, int]


class TTFTModel:
    def __init__(self, settings: SLOSettings) -> None:
        self.s = settings
        # per class: (ttft, mode, k, batch)
        self._rings: dict[str, deque[tuple[float, Mode, int, float]]] = {
            c: deque(maxlen=settings.window) for c in LATENCY_CLASSES
        }
        self._fit: TTFTFit | None = None
        self._dirty = True

    def observe(self, obs: Observation) -> None:
        mode = obs.config.mode
        k = int(round(obs.mean_k)) if mode != OFF else 0
        self._rings[obs.latency_class].append((obs.ttft_s, mode, k, max(1.0, obs.batch_size)))
        self._dirty = True

    def invalidate(self) -> None:
        """The step model changed; refit on next use."""
        self._dirty = True

    def fit(self, step: StepFn) -> TTFTFit | None:
        if not self._dirty:
            return self._fit
        self._dirty = False
        classes = [c for c in LATENCY_CLASSES if len(self._rings[c]) >= 3]
        if not classes:
            self._fit = None
            return None
        # one-way ANCOVA in closed form: an intercept per class, a shared kappa
        data: dict[str, list[tuple[float, float]]] = {}
        memo: dict[tuple[Mode, int, float], float | None] = {}
        for c in classes:
            pts = []
            for ttft, mode, k, b in self._rings[c]:
                key = (mode, k, b)
                if key not in memo:
                    memo[key] = step(mode, k, b)
                st = memo[key]
                if st is not None:
                    pts.append((st, ttft))
            if pts:
                data[c] = pts
        if not data:
            self._fit = None
            return None
        sxx = sxy = 0.0
        means: dict[str, tuple[float, float]] = {}
        all_x = []
        for c, pts in data.items():
            mx = sum(p[0] for p in pts) / len(pts)
            my = sum(p[1] for p in pts) / len(pts)
            means[c] = (mx, my)
            for x, y in pts:
                sxx += (x - mx) ** 2
                sxy += (x - mx) * (y - my)
                all_x.append(x)
        # prior on kappa, worth one observation in eight, at a typical step's scale
        n = len(all_x)
        x_typ = sorted(all_x)[n // 2] or 1e-3
        lam = max(1.0, n / 8.0) * x_typ * x_typ
        kappa = max(0.0, (sxy + lam * self.s.kappa_prior) / (sxx + lam))
        intercept = {c: max(0.0, my - kappa * mx) for c, (mx, my) in means.items()}
        resid: dict[str, list[float]] = {
            c: [y - intercept[c] - kappa * x for x, y in pts] for c, pts in data.items()}
        classes = list(data)
        pooled = [r for rs in resid.values() for r in rs]
        q = self.s.quantile
        resid_q = {
            c: quantile(rs if len(rs) >= self.s.min_samples else pooled, q) for c, rs in resid.items()
        }
        self._fit = TTFTFit(intercept, kappa, resid_q, {c: len(resid[c]) for c in classes})
        return self._fit

    def predict(self, latency_class: str, step_s: float | None, step: StepFn) -> float | None:
        """Predicted TTFT quantile (seconds), or None while the class has too
        few samples to say."""
        fit = self.fit(step)
        if fit is None or step_s is None or fit.samples.get(latency_class, 0) < self.s.min_samples:
            return None
        return max(0.0, fit.intercept[latency_class] + fit.kappa * step_s + fit.resid_q[latency_class])

    def samples(self, latency_class: str) -> int:
        return len(self._rings[latency_class])

    def to_dict(self) -> dict:
        return {c: [[round(t, 6), m, k, round(b, 3)] for t, m, k, b in ring] for c, ring in self._rings.items()}

    def load_dict(self, d: dict) -> None:
        for c, entries in d.items():
            if c not in self._rings:
                raise ValueError(f"unknown latency class {c!r} in TTFT samples")
            ring = self._rings[c]
            ring.clear()
            for t, m, k, b in entries:
                if float(t) < 0 or m not in ("off", "autoregressive", "parallel"):
                    raise ValueError("bad TTFT sample")
                ring.append((float(t), m, int(k), float(b)))
        self._dirty = True
