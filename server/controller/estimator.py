"""Predictions for any setting at any load, from the three models.

``TPOT(config, B) = step_time(mode, K, B) / E[L](mode, K)`` and a TTFT
quantile per latency class; plus the best per-batch-size K schedule of a mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config.controller import ControllerSettings
from ..speculative import AUTOREGRESSIVE, PARALLEL, Mode, SpecConfig
from .acceptance import AcceptanceModel
from .observation import LATENCY_CLASSES, Observation
from .step_model import StepTimeModel
from .ttft_model import TTFTFit, TTFTModel


@dataclass(frozen=True)
class Prediction:
    """The model's view of one config at one load."""

    config: SpecConfig
    batch: float
    step_s: float | None
    """Seconds per engine step."""
    acceptance_length: float
    """E[L]: tokens per step, bonus included (posterior mean)."""
    acceptance_length_low: float
    acceptance_length_high: float
    tpot_s: float | None
    """Predicted mean TPOT; None before any step-time data."""
    ttft_s: dict[str, float | None] = field(default_factory=dict)
    """Predicted TTFT quantile per latency class (None: not enough data)."""
    slo_excess: float = 0.0
    """max over constrained classes of predicted TTFT / limit (<= 1: meets SLOs)."""
    samples: float = 0.0
    """Effective requests measured under this config near this load."""
    count: int = 0
    """Requests ever measured under this config."""

    @property
    def feasible(self) -> bool:
        return self.slo_excess <= 1.0

    @property
    def tpot_optimistic_s(self) -> float | None:
        """TPOT with acceptance at the top of its credible band."""
        if self.tpot_s is None or self.step_s is None:
            return None
        return self.step_s / self.acceptance_length_high


@dataclass(frozen=True)
class Plan:
    """An engine setting (its K schedule included) and the model's view of it
    at one load."""

    engine: SpecConfig
    prediction: Prediction

    @property
    def mode(self) -> Mode:
        """The engine's drafting mode (a schedule with K=0 at this load keeps it)."""
        return self.engine.mode

    @property
    def config(self) -> SpecConfig:
        """The per-step setting at the load."""
        return self.prediction.config


class Estimator:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.acceptance = AcceptanceModel(settings.acceptance)
        self.step = StepTimeModel(settings.step_model)
        self.ttft = TTFTModel(settings.slo)
        self._version = 0  # bumped by anything that changes the data
        self._fitted = -1
        self._el: dict[tuple[Mode, int, str], float] = {}
        self._sched_cache: dict[tuple, SpecConfig | None] = {}

    # -- updates --------------------------------------------------------------
    def observe(self, obs: Observation) -> None:
        """Cheap: appends to windows and updates counts; no fitting."""
        self.acceptance.observe(obs)
        self.step.observe(obs)
        self.ttft.observe(obs)
        self._version += 1

    def invalidate(self) -> None:
        """Data changed behind the models' backs (e.g. forgetting); refit on next use."""
        self._version += 1

    def refit(self) -> None:
        """Refit if anything changed since the last fit (one int compare otherwise)."""
        if self._fitted == self._version:
            return
        self._fitted = self._version
        self._el.clear()
        self._sched_cache.clear()
        self.step.fit()
        self.ttft.fit(self._step_fn)

    def expected_length(self, mode: Mode, k: int, bound: str = "mean") -> float:
        key = (mode, k, bound)
        v = self._el.get(key)
        if v is None:
            v = self._el[key] = self.acceptance.expected_length(mode, k, bound)
        return v

    def _step_fn(self, mode: Mode, k: int, batch: float) -> float | None:
        return self.step.predict(mode, k, batch)

    @property
    def ready(self) -> bool:
        return self.step.fit() is not None

    def ttft_fit(self) -> TTFTFit | None:
        """The TTFT model's current fit (None before enough data)."""
        return self.ttft.fit(self._step_fn)

    # -- predictions ------------------------------------------------------------
    def predict(self, config: SpecConfig, batch: float, *, step_s: float | None = None) -> Prediction:
        """``step_s`` overrides the step-time model (K=0 inside a speculative engine)."""
        self.refit()
        mode, k = config.mode, config.k
        if step_s is None:
            step_s = self.step.predict(mode, k, batch)
        el = self.expected_length(mode, k)
        lo = self.expected_length(mode, k, "low")
        hi = self.expected_length(mode, k, "high")
        tpot = step_s / el if step_s is not None else None
        ttft: dict[str, float | None] = {}
        excess = 0.0
        for cls in LATENCY_CLASSES:
            q = self.ttft.predict(cls, step_s, batch, self._step_fn, mode, k)
            ttft[cls] = q
            limit = self.settings.slo.ttft_s.get(cls)
            if q is not None and limit:
                excess = max(excess, q / limit)
        return Prediction(
            config, batch, step_s, el, lo, hi, tpot, ttft, excess,
            self.step.samples(mode, k, batch), self.step.count(mode, k),
        )

    def plan(self, engine: SpecConfig, load: float) -> Plan:
        """The prediction for an engine running ``engine`` at ``load``: its
        per-step setting there, and where its schedule drafts nothing at this
        load (K=0 inside a speculative engine), the mode's step time at K=0."""
        config = engine.at(load)
        if engine.enabled and not config.enabled:
            mode: Mode = PARALLEL if engine.parallel else AUTOREGRESSIVE
            step_s = self.step.predict(mode, 0, load, local=False)
            return Plan(engine, self.predict(config, load, step_s=step_s))
        return Plan(engine, self.predict(config, load))

    def best_schedule(
        self,
        parallel: bool,
        *,
        load: float = 1.0,
        k_cap: int | None = None,
        banned: frozenset[SpecConfig] = frozenset(),
    ) -> SpecConfig | None:
        """Per batch size, the candidate K with the lowest predicted TPOT that
        meets the TTFT SLOs (the least violating when none does), capped at
        ``k_cap``; non-increasing in the batch size if the settings say so.
        With schedules disabled, one K: the best at ``load``. None if no K of
        this mode is allowed."""
        self.refit()
        sched = self.settings.schedule
        uniform_at = None if sched.enabled and (sched.parallel or not parallel) else max(1, int(round(load)))
        key = (parallel, k_cap, banned, uniform_at)
        if key in self._sched_cache:
            return self._sched_cache[key]
        out = self._best_schedule(parallel, k_cap, banned, uniform_at)
        self._sched_cache[key] = out
        return out

    def _slo_lines(self, batch: float, mode: Mode, k: int, constrained) -> list[tuple[float, float, float]]:
        """(TTFT at zero step time, per step second, limit) per constrained
        class, at ``batch``: there the predicted TTFT quantile is linear in
        step time. ``constrained`` = (fit, [(class, limit)]) from _constrained()."""
        fit, classes = constrained
        out = []
        for cls, limit in classes:
            f = 1.0 + fit.residual_quantile(cls, batch, mode, k)
            out.append(((fit.intercept[cls] + fit.theta * (max(1.0, batch) - 1.0)) * f, fit.kappa * f, limit))
        return out

    def _constrained(self):
        """The TTFT fit and the latency classes whose SLO it can judge."""
        fit = self.ttft.fit(self._step_fn)
        if fit is None:
            return fit, []
        return fit, [(cls, limit) for cls, limit in self.settings.slo.ttft_s.items()
                     if limit and fit.samples.get(cls, 0) >= self.settings.slo.min_samples]

    def _best_schedule(self, parallel: bool, k_cap: int | None, banned: frozenset[SpecConfig],
                       uniform_at: int | None) -> SpecConfig | None:
        st = self.settings
        mode: Mode = PARALLEL if parallel else AUTOREGRESSIVE
        ks = [k for k in st.ks(parallel) if (k_cap is None or k <= k_cap)
              and SpecConfig(parallel, k) not in banned]
        if st.schedule.allow_zero_k:
            ks = [0] + ks
        if not ks or max(ks) == 0:
            return None
        grid = _batch_grid(st.schedule.max_batch) if uniform_at is None else [uniform_at]
        step = self.step.predict
        el = {k: self.expected_length(mode, k) for k in ks}
        constrained = self._constrained()
        chosen: list[int] = []
        for b in grid:
            best_k, best_val = ks[0], None
            vals: dict[int, tuple[float, float]] = {}
            for k in ks:
                lines = self._slo_lines(b, mode, k, constrained) if constrained[1] else ()
                st_s = step(mode, k, b, local=k > 0)
                if st_s is None:
                    continue
                excess = max([(a + kappa * st_s) / limit for a, kappa, limit in lines], default=0.0)
                # infeasible configs sort after feasible ones, by how far they miss
                val = vals[k] = (0.0 if excess <= 1.0 else excess, st_s / el[k])
                if best_val is None or val[0] < best_val[0] or (
                    val[0] == best_val[0] and val[1] < best_val[1] * (1.0 - st.schedule.k_tie_tolerance)
                ):
                    best_k, best_val = k, val
            # the smaller batch's K carries on unless another is clearly faster (no zig-zag on noise)
            prev = vals.get(chosen[-1]) if chosen else None
            if (prev is not None and best_val is not None and prev[0] == best_val[0]
                    and prev[1] <= best_val[1] * (1.0 + st.schedule.k_change_tolerance)):
                best_k = chosen[-1]
            chosen.append(best_k)
        if st.schedule.non_increasing:
            for i in range(1, len(chosen)):
                chosen[i] = min(chosen[i], chosen[i - 1])
        if max(chosen) == 0:
            return None
        if uniform_at is not None:
            return SpecConfig(parallel, chosen[0])
        # expand the grid to ranges; between grid points vLLM carries K forward
        ranges: list[tuple[int, int, int]] = []
        for i, b in enumerate(grid):
            end = grid[i + 1] - 1 if i + 1 < len(grid) else st.schedule.max_batch
            if ranges and ranges[-1][2] == chosen[i]:
                ranges[-1] = (ranges[-1][0], end, chosen[i])
            else:
                ranges.append((b, end, chosen[i]))
        return SpecConfig.scheduled(parallel, ranges)


def _batch_grid(max_batch: int) -> list[int]:
    """Batch sizes the schedule is planned at: every size to 8, then ~x1.25 steps."""
    out = list(range(1, min(8, max_batch) + 1))
    b = 8
    while b < max_batch:
        b = min(max_batch, max(b + 1, int(round(b * 1.25))))
        out.append(b)
    return out
