"""TTFT model for the SLO constraint.

A new request waits for the running step to end (on average half a step) and
then rides the next step, which carries its prefill next to everyone else's
decode tokens; other requests' prefills get in its way too, more of them the
more requests run. So::

    TTFT(class, config, B) ~ (t_class + kappa * step(config, B) + theta * (B - 1)) * (1 + residual)

``t_class`` (prefill, network) is fitted per latency class, ``kappa`` and
``theta`` are shared (both >= 0; ``kappa`` has a prior, since it is only
identified when configs with different step times ran at the same load); the
quantile is the fitted mean times one plus the empirical quantile of the
class's recent relative residuals. Configs never run get a TTFT through the
step-time model.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..config.controller import SLOSettings
from ..speculative import OFF, Mode
from ._linalg import median, quantile
from .observation import LATENCY_CLASSES, Observation

StepFn = Callable[[Mode, int, float], "float | None"]


@dataclass(frozen=True)
class TTFTFit:
    intercept: dict[str, float]
    """Seconds of TTFT at zero step time, per latency class."""
    kappa: float
    """Seconds of TTFT per second of step time (shared)."""
    theta: float
    """Seconds of TTFT per additional running request (shared)."""
    resid_q: dict[str, float]
    """Quantile of relative residuals per class (the SLO's quantile) ..."""
    resid_q_load: dict[tuple[str, int], float]
    """... per (class, load bucket): the median over configs measured there of
    their own quantiles (TTFT spreads more at higher load; the median keeps
    one disturbed measurement from setting everyone's spread) ..."""
    resid_q_cell: dict[tuple[str, Mode, int, int], tuple[float, int]]
    """... and (quantile, samples) per (class, mode, K, load bucket) where that
    config was measured; blended with the load bucket's by sample count."""
    samples: dict[str, int]
    min_samples: int = 12
    """Samples at which a config's own quantile gets half the weight."""

    def residual_quantile(self, latency_class: str, batch: float, mode: Mode | None = None, k: int = 0) -> float:
        """The most specific residual quantile with enough data behind it."""
        bucket = load_bucket(batch)
        general = self.resid_q_load.get((latency_class, bucket), self.resid_q[latency_class])
        if mode is not None:
            v = self.resid_q_cell.get((latency_class, mode, k if mode != OFF else 0, bucket))
            if v is not None:
                w = v[1] / (v[1] + self.min_samples)
                return w * v[0] + (1.0 - w) * general
        return general


_BUCKETS: dict[float, int] = {}


def load_bucket(batch: float) -> int:
    """Half-doublings of the batch size: 1, 1.4, 2, 2.8, 4, ..."""
    b = _BUCKETS.get(batch)
    if b is None:
        b = int(round(math.log2(max(1.0, batch)) * 2))
        if len(_BUCKETS) < 4096:  # batches are mostly small integers; bound the memo
            _BUCKETS[batch] = b
    return b


class _Cell:
    """Recent (ttft, batch) of one (class, mode, K, load bucket), with running
    sums so a fit costs O(cells) plus one pass for the residual quantiles."""

    __slots__ = ("ring", "n", "sx", "sy", "sxx", "sxy")

    def __init__(self, size: int) -> None:
        self.ring: deque[tuple[float, float]] = deque(maxlen=size)
        self.n = 0
        self.sx = self.sy = self.sxx = self.sxy = 0.0  # x = batch - 1, y = ttft

    def add(self, ttft: float, batch: float) -> bool:
        """Append; True if the ring grew (nothing was evicted)."""
        grew = len(self.ring) < self.ring.maxlen
        if not grew:
            self._sub(*self.ring[0])
        self.ring.append((ttft, batch))
        x = batch - 1.0
        self.n += 1
        self.sx += x
        self.sy += ttft
        self.sxx += x * x
        self.sxy += x * ttft
        return grew

    def _sub(self, ttft: float, batch: float) -> None:
        x = batch - 1.0
        self.n -= 1
        self.sx -= x
        self.sy -= ttft
        self.sxx -= x * x
        self.sxy -= x * ttft


class TTFTModel:
    def __init__(self, settings: SLOSettings) -> None:
        self.s = settings
        # per (class, mode, K, load bucket): a config keeps its TTFT record
        # while others run (one shared window would forget it)
        self._cells: dict[tuple[str, Mode, int, int], _Cell] = {}
        self._fit: TTFTFit | None = None
        self._dirty = True
        self._new = 0
        self._total = 0

    def observe(self, obs: Observation) -> None:
        mode = obs.config.mode
        k = int(round(obs.mean_k)) if mode != OFF else 0
        b = max(1.0, obs.ttft_batch_size if obs.ttft_batch_size is not None else obs.batch_size)
        key = (obs.latency_class, mode, k, load_bucket(b))
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _Cell(self.s.window)
        self._total += cell.add(obs.ttft_s, b)
        self._new += 1
        # a quantile over many samples moves little per request (and the step
        # model behind it little per refit): refit after 16 new samples, or 2%
        # of what is held once that is more
        if self._fit is None or self._new >= max(16, self._total // 50):
            self._dirty = True

    def invalidate(self) -> None:
        """Refit on next use (its data were replaced)."""
        self._dirty = True

    def fit(self, step: StepFn) -> TTFTFit | None:
        if not self._dirty:
            return self._fit
        self._dirty = False
        self._new = 0
        # one step-time prediction per cell, at its mean batch (batches in a
        # bucket are within 20% of each other; each sample's batch still
        # enters through theta)
        cells: list[tuple[tuple[str, Mode, int, int], _Cell, float]] = []
        for key, cell in self._cells.items():
            if cell.n:
                st = step(key[1], key[2], 1.0 + cell.sx / cell.n)
                if st is not None:
                    cells.append((key, cell, st))
        by_class: dict[str, list[tuple[tuple[str, Mode, int, int], _Cell, float]]] = {}
        for item in cells:
            by_class.setdefault(item[0][0], []).append(item)
        by_class = {c: items for c, items in by_class.items() if sum(i[1].n for i in items) >= 3}
        if not by_class:
            self._fit = None
            return None
        # ANCOVA in closed form: an intercept per class; shared slopes on step
        # time (x1: kappa) and on the other running requests (x2: theta),
        # from the cells' running sums (x1 is constant within a cell)
        s11 = s12 = s22 = s1y = s2y = 0.0
        means: dict[str, tuple[float, float, float]] = {}
        x1s: list[tuple[float, int]] = []
        for c, items in by_class.items():
            n = sum(cl.n for _, cl, _ in items)
            m1 = sum(cl.n * st for _, cl, st in items) / n
            m2 = sum(cl.sx for _, cl, _ in items) / n
            my = sum(cl.sy for _, cl, _ in items) / n
            means[c] = (m1, m2, my)
            for _, cl, st in items:
                d1 = st - m1
                s11 += cl.n * d1 * d1
                # sums of centred products: sum((x - m)(y - my)) = sxy - n m_x m_y etc.
                s12 += d1 * (cl.sx - cl.n * m2)
                s1y += d1 * (cl.sy - cl.n * my)
                s22 += cl.sxx - 2 * m2 * cl.sx + cl.n * m2 * m2
                s2y += cl.sxy - m2 * cl.sy - my * cl.sx + cl.n * m2 * my
                x1s.append((st, cl.n))
        # prior on kappa, worth one observation in eight, at a typical step's scale
        n_all = sum(n for _, n in x1s)
        x1s.sort()
        acc, x_typ = 0, x1s[-1][0]
        for st, n in x1s:
            acc += n
            if acc * 2 >= n_all:
                x_typ = st
                break
        x_typ = x_typ or 1e-3
        lam = max(1.0, n_all / 8.0) * x_typ * x_typ
        k0 = self.s.kappa_prior
        a11, a22 = s11 + lam, max(s22, 0.0) + 1e-9 * (abs(s22) + 1.0)
        b1, b2 = s1y + lam * k0, s2y
        det = a11 * a22 - s12 * s12
        kappa = (b1 * a22 - s12 * b2) / det if det > 0 else b1 / a11
        theta = (a11 * b2 - s12 * b1) / det if det > 0 else 0.0
        # costs cannot be negative: pin the offender at zero, refit the other
        if theta < 0:
            theta, kappa = 0.0, b1 / a11
        if kappa < 0:
            kappa, theta = 0.0, max(0.0, b2 / a22)
        intercept = {c: max(0.0, my - kappa * m1 - theta * m2) for c, (m1, m2, my) in means.items()}
        # relative residuals: TTFT spread grows with its level (waiting for a
        # longer step varies more), so the quantile is a factor on the mean
        q = self.s.quantile
        resid: dict[str, list[float]] = {}
        resid_q_cell: dict[tuple[str, Mode, int, int], tuple[float, int]] = {}
        for c, items in by_class.items():
            rs_c = resid.setdefault(c, [])
            a = intercept[c]
            for key, cl, st in items:
                base = a + kappa * st - theta
                rs = [y / max(base + theta * b, 1e-9) - 1.0 for y, b in cl.ring]
                rs_c.extend(rs)
                if len(rs) >= self.s.min_samples:
                    resid_q_cell[key] = (quantile(rs, q), len(rs))
        pooled = [r for rs in resid.values() for r in rs]
        resid_q = {c: quantile(rs if len(rs) >= self.s.min_samples else pooled, q) for c, rs in resid.items()}
        per_load: dict[tuple[str, int], list[float]] = {}
        for (c, _m, _k, bucket), (v, _n) in resid_q_cell.items():
            per_load.setdefault((c, bucket), []).append(v)
        resid_q_load = {key: median(vs) for key, vs in per_load.items()}
        self._fit = TTFTFit(intercept, kappa, theta, resid_q, resid_q_load, resid_q_cell,
                            {c: len(rs) for c, rs in resid.items()}, self.s.min_samples)
        return self._fit

    def predict(self, latency_class: str, step_s: float | None, batch: float, step: StepFn,
                mode: Mode | None = None, k: int = 0) -> float | None:
        """Predicted TTFT quantile (seconds) of (mode, K) at ``batch`` running
        requests, or None while the class has too few samples to say."""
        fit = self.fit(step)
        if fit is None or step_s is None or fit.samples.get(latency_class, 0) < self.s.min_samples:
            return None
        mean = fit.intercept[latency_class] + fit.kappa * step_s + fit.theta * (max(1.0, batch) - 1.0)
        return max(0.0, mean * (1.0 + fit.residual_quantile(latency_class, batch, mode, k)))

    def samples(self, latency_class: str) -> int:
        return sum(cl.n for (c, *_), cl in self._cells.items() if c == latency_class)

    def to_dict(self) -> dict:
        out: dict[str, list] = {c: [] for c in LATENCY_CLASSES}
        for (c, m, k, _b), cl in self._cells.items():
            out[c].extend([round(t, 6), m, k, round(b, 3)] for t, b in cl.ring)
        return out

    def load_dict(self, d: dict) -> None:
        cells: dict[tuple[str, Mode, int, int], _Cell] = {}
        for c, entries in d.items():
            if c not in LATENCY_CLASSES:
                raise ValueError(f"unknown latency class {c!r} in TTFT samples")
            for t, m, k, b in entries:
                if float(t) < 0 or m not in ("off", "autoregressive", "parallel") or float(b) < 0:
                    raise ValueError("bad TTFT sample")
                b = max(1.0, float(b))
                key = (c, m, int(k), load_bucket(b))
                cells.setdefault(key, _Cell(self.s.window)).add(float(t), b)
        self._cells = cells
        self._total = sum(cl.n for cl in cells.values())
        self._dirty = True
        self._fit = None
