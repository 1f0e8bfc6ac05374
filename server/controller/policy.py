"""Which engine setting is best at a load, and whether moving to it is worth
it: the hysteresis (margin, uncertainty, a sustained winner, a minimum dwell),
warm standby engines, and what a rebuild costs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from ..config.controller import ControllerSettings
from ..speculative import Mode, SpecConfig
from .decision import Verdict, ms
from .estimator import Estimator, Plan, Prediction
from .rebuild_cost import RebuildCost

STREAK_LOAD_BAND = math.log(1.2)
"""A streak restarts when the load moves more than 20%."""

Banned = Callable[[SpecConfig], bool]



class Warm:
    """Settings the server can move to without building an engine: those a
    warm standby engine runs, and those the serving engine can switch to
    live (server/vllm_live.py). Membership answers "is this instant?";
    iterating gives the standby engines, the ones worth comparing with the
    best plan (every live setting is already among the plans)."""

    def __init__(self, standby: Iterable[SpecConfig] = (), live: Callable[[SpecConfig], bool] | None = None):
        self.standby = tuple(standby)
        self.live = live

    def __contains__(self, engine: object) -> bool:
        return engine in self.standby or (self.live is not None and isinstance(engine, SpecConfig) and self.live(engine))

    def __iter__(self) -> Iterator[SpecConfig]:
        return iter(self.standby)

    def __len__(self) -> int:
        return len(self.standby)

@dataclass
class SwitchTimes:
    """When the engine last changed, a change was last decided, and the load last changed."""

    switched_at: float
    decided_at: float
    load_changed_at: float = -math.inf


@dataclass
class Streak:
    """The same winner, decisions in a row, at a steady load."""

    key: tuple | None = None
    count: int = 0
    since: float = 0.0
    load: float = 1.0

    def reset(self, now: float) -> None:
        self.key, self.count, self.since = None, 0, now

    def extend(self, key: tuple, load: float, now: float) -> None:
        if self.key != key or abs(math.log(load / self.load)) > STREAK_LOAD_BAND:
            self.key, self.count, self.since, self.load = key, 0, now, load
        self.count += 1


def trusted(settings: ControllerSettings, estimator: Estimator, mode: Mode) -> bool:
    """Whether the model's word on ``mode`` stands without a probe."""
    ex = settings.exploration
    if not ex.enabled:
        return True  # without probes the model's word is all there is
    return estimator.step.samples(mode) >= ex.min_samples_trusted


def pick(plans: Sequence[Plan]) -> Plan:
    """Feasible before infeasible (least SLO excess first), then lowest TPOT."""
    def key(plan: Plan) -> tuple[float, float]:
        p = plan.prediction
        return (0.0 if p.feasible else p.slo_excess, p.tpot_s if p.tpot_s is not None else math.inf)
    return min(plans, key=key)


class Policy:
    def __init__(self, settings: ControllerSettings, rebuild: RebuildCost) -> None:
        self.settings = settings
        self.rebuild = rebuild
        self.streak = Streak()

    def plans(self, estimator: Estimator, load: float, *, k_cap: int | None, banned: Banned) -> list[Plan]:
        """Speculation off, and per drafting mode the best K schedule allowed."""
        excluded = frozenset(c for c in self.settings.candidates if banned(c))
        out = [estimator.plan(SpecConfig.off(), load)]
        for parallel in (False, True):
            engine = estimator.best_schedule(parallel, load=load, k_cap=k_cap, banned=excluded)
            if engine is not None:
                out.append(estimator.plan(engine, load))
        return out

    def judge(self, estimator: Estimator, now: float, load: float, active: Plan, times: SwitchTimes, *,
              warm: Warm, k_cap: int | None, banned: Banned, probe_note: str | None = None) -> Verdict:
        """Hold or switch, at ``load`` with ``active`` serving. ``probe_note``
        (a probe just ended; "" without a summary) keeps the probed config
        only if it is within the exploration's tolerance of the best."""
        st = self.settings
        hy = st.hysteresis
        after_probe = probe_note is not None
        note = f"{probe_note}; " if probe_note else ""
        trusted_plans = [pl for pl in self.plans(estimator, load, k_cap=k_cap, banned=banned)
                         if trusted(st, estimator, pl.mode) or pl.mode == active.mode]
        best = pick(trusted_plans) if trusted_plans else active
        best = self.prefer_warm(estimator, load, best, active, warm=warm, k_cap=k_cap, banned=banned)
        a_pred, b_pred = active.prediction, best.prediction
        a_tpot, b_tpot = a_pred.tpot_s, b_pred.tpot_s
        same = best.mode == active.mode and best.config == active.config
        gain = 0.0 if (a_tpot is None or b_tpot is None) else (a_tpot - b_tpot) / a_tpot
        # leave for the SLO only when clearly missing it (hysteresis on a noisy quantile)
        slo_fix = a_pred.slo_excess > 1.0 + hy.slo_margin and b_pred.feasible

        if same or a_tpot is None or b_tpot is None or (gain <= 0 and not slo_fix):
            self.streak.reset(now)
            others = [pl for pl in trusted_plans if pl.mode != best.mode]
            runner = pick(others) if len(trusted_plans) > 1 and others else None
            extra = (f"; next best {runner.config.label()} {ms(runner.prediction.tpot_s)}"
                     if runner is not None and runner.prediction.tpot_s is not None else "")
            return Verdict.hold("probe_kept" if after_probe else "best",
                                f"{note}{active.config.label()} is predicted best at load {load:.1f} "
                                f"(TPOT {ms(a_tpot)}){extra}", may_explore=True)

        warm_engine = best.engine in warm  # an instant switch: no rebuild to pay for
        margin = min(hy.warm_margin, hy.margin) if warm_engine else hy.margin
        if after_probe:
            threshold = st.exploration.keep_tolerance
        else:
            threshold = margin + hy.confidence_z * self.gain_error(estimator, active, best, load)
        if (gain >= threshold and not slo_fix and not after_probe and not warm_engine
                and self.rebuild.tpot_if_rebuilt(a_tpot, b_tpot, hy.load_horizon_s) >= a_tpot):
            self.streak.reset(now)
            return Verdict.hold("rebuild_cost",
                                f"{best.config.label()} predicted {gain:.0%} faster than {active.config.label()}, but a "
                                f"{self.rebuild.seconds:.0f}-s rebuild, serving {self.rebuild.slowdown:.1f}x slower "
                                f"meanwhile, would not pay back within {hy.load_horizon_s:.0f} s")
        if gain >= threshold or slo_fix:
            self.streak.extend((best.mode, best.config.k), load, now)
            why = (f"{best.config.label()} meets the TTFT SLO and {active.config.label()} does not"
                   if slo_fix else
                   f"{best.config.label()} predicted {gain:.0%} faster than {active.config.label()} "
                   f"at load {load:.1f} (TPOT {ms(b_tpot)} vs {ms(a_tpot)})")
            if after_probe:
                return Verdict("switch", "probe_done", note + why, best, gain)
            if self.streak.count < hy.sustain_decisions or now - self.streak.since < hy.sustain_s:
                return Verdict.hold("sustaining", f"{why}; sustained {self.streak.count}/{hy.sustain_decisions} decisions")
            # A load change since the last switch is not noise: a shorter dwell
            # applies. Not to leaving for the SLO: that judges the engine just
            # switched to on its first requests, slow while its prefix cache is cold.
            dwell = hy.min_dwell_s
            if times.load_changed_at > times.decided_at and not slo_fix:
                dwell = min(dwell, hy.min_dwell_after_load_change_s)
            if now - times.switched_at < dwell:
                return Verdict.hold("dwell", f"{why}; last switch {now - times.switched_at:.0f} s ago "
                                             f"(min dwell {dwell:.0f} s)")
            return Verdict("switch", "slo" if slo_fix else "better", why, best, gain)

        self.streak.reset(now)
        return Verdict.hold("probe_kept" if after_probe else "within_margin",
                            f"{note}{best.config.label()} predicted {gain:.1%} faster than "
                            f"{active.config.label()}, below the {threshold:.0%} needed (margin "
                            f"{margin:.0%}{' for a warm engine' if warm_engine else ''} "
                            f"+ uncertainty)", may_explore=True)

    def prefer_warm(self, estimator: Estimator, load: float, best: Plan, active: Plan, *,
                    warm: Warm, k_cap: int | None, banned: Banned) -> Plan:
        """``best``, or a warm engine's plan (meeting the SLOs if ``best``
        does) that is predicted within the hysteresis margin of it, or whose
        instant switch serves the load's horizon faster than building
        ``best`` while the active engine keeps serving, slowed by the build:

            H * warm  <=  R * s * active + (H - R) * best
            (R: rebuild time, s: build slowdown, H: load_horizon_s)

        On 2 CPU cores a rebuild takes 40-48 s and the serving engine runs
        2-3x slower meanwhile, so building a config a few percent better than
        a warm one loses most of a minute's serving."""
        b_tpot = best.prediction.tpot_s
        if b_tpot is None or (best.mode == active.mode and best.config == active.config):
            return best
        hy = self.settings.hysteresis
        limit = b_tpot * (1.0 + hy.margin)
        a_tpot = active.prediction.tpot_s
        if a_tpot is not None:
            limit = max(limit, self.rebuild.tpot_if_rebuilt(a_tpot, b_tpot, hy.load_horizon_s))
        chosen = None
        for engine in warm:
            if engine == active.engine:
                continue  # the serving engine itself
            plan = estimator.plan(engine, load)
            p = plan.prediction
            if (p.tpot_s is None or p.tpot_s > limit or (best.prediction.feasible and not p.feasible)
                    or (engine.enabled and not trusted(self.settings, estimator, plan.mode))
                    or banned(plan.config) or (k_cap is not None and engine.max_k > k_cap)):
                continue
            if chosen is None or p.tpot_s < chosen.prediction.tpot_s:
                chosen = plan
        return chosen or best

    def gain_error(self, estimator: Estimator, a: Plan, b: Plan, load: float) -> float:
        """Standard error of the predicted relative TPOT gain of b over a."""
        return math.sqrt(self._tpot_error(estimator, a.prediction, load) ** 2
                         + self._tpot_error(estimator, b.prediction, load) ** 2)

    def _tpot_error(self, estimator: Estimator, p: Prediction, load: float) -> float:
        step_se = estimator.step.relative_error(p.config.mode, p.config.k, load)
        z = self.settings.acceptance.credible_z
        el_se = (p.acceptance_length_high - p.acceptance_length_low) / (2 * z * p.acceptance_length) if z else 0.0
        return math.sqrt(step_se ** 2 + el_se ** 2)
