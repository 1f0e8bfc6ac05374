"""The adaptive speculation controller: observe, decide, report.

Deterministic given its inputs and clock; no threads, no I/O (profiles are
read and written by ``profile.ProfileStore`` when the server asks).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from .decision import Action, Decision, DecisionLog
from .estimator import Estimator, Prediction
from .load import LoadTracker
from .observation import EngineSnapshot, Observation
from .settings import ControllerSettings
from .spec import AUTOREGRESSIVE, OFF, PARALLEL, SPEC_MODES, KSchedule, Mode, SpecConfig

log = logging.getLogger(__name__)

PROFILE_SCHEMA = 1
_STREAK_LOAD_BAND = math.log(1.2)  # a streak restarts when the load moves more than 20%


@dataclass
class _Probe:
    config: SpecConfig
    schedule: KSchedule | None
    incumbent_tpot_s: float | None
    started_at: float | None = None  # None until the server applied it
    requests: int = 0
    regret_s: float = 0.0


@dataclass
class _ModePlan:
    mode: Mode
    schedule: KSchedule | None
    prediction: Prediction  # at the current load

    @property
    def config(self) -> SpecConfig:
        return self.prediction.config


class Controller:
    """Chooses drafting mode, K and a per-batch-size K schedule.

    Call :meth:`observe` per finished request, :meth:`observe_engine` with
    engine gauges, :meth:`decide` every few seconds; act on non-"hold"
    decisions and confirm with :meth:`applied` / :meth:`apply_failed`.
    """

    def __init__(
        self,
        settings: ControllerSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        profile_path: str = "",
    ) -> None:
        self.settings = settings or ControllerSettings()
        self.clock = clock
        self.profile_path = profile_path
        st = self.settings
        self.estimator = Estimator(st)
        self.load = LoadTracker(st.load)
        self.decisions = DecisionLog(st.history_size)
        self.events: deque[dict] = deque(maxlen=32)
        now = clock()
        self._started_at = now
        self._schedule: KSchedule | None = None
        self._set_active(st.initial, None)
        self._last_good: tuple[SpecConfig, KSchedule | None] = (st.initial, self._schedule)
        self._last_switch_at = now
        self._last_switch_decided_at = now
        self._pending: Decision | None = None
        self._pending_since = now
        self.rebuild_s = st.exploration.rebuild_cost_s
        """Seconds a rebuild takes here: the setting until one was measured (by
        ``quickdraft tune``, restored with the profile, or live), then a running mean."""
        self._rebuild_measured = False
        self.build_slowdown = 1.0
        """How much slower the serving engine's requests run while another
        engine is built beside it (their TPOT over the model's prediction):
        1.0 until measured. On 2 CPU cores the build takes the serving engine's
        CPU (2-3x in the phases runs of 2026-12-03); on a GPU it should be near 1."""
        self._slowdown_samples = 0
        self._streak_key: tuple | None = None
        self._streak_count = 0
        self._streak_since = now
        self._streak_load = 1.0
        self._probe: _Probe | None = None
        self._last_probe_summary = ""
        self._bank = st.exploration.initial_allowance_s
        self._share = st.exploration.max_share
        self._last_accrual = now
        self._explore_spent_s = 0.0
        self._explore_regret_s = 0.0
        self._probes = 0
        self._k_cap: int | None = None
        self._last_pressure_at = -math.inf
        self._kv_low_since: float | None = None
        self._kv_release_wait = st.fallback.kv_release_s
        self._last_kv_release_at = -math.inf
        self._preempted = 0
        self._spec_blocked_until = -math.inf
        self._fallback_reason = ""
        self._cooldown: dict[SpecConfig, float] = {}
        self._last_load_change_at = -math.inf
        self._notes: list[str] = []  # events to mention in the next decision
        self._warm: tuple[KSchedule | None, ...] = ()  # None: an engine with speculation off
        self.engine_rebuilds = 0
        self.switches = 0
        self.observations = 0

    # ------------------------------------------------------------------ inputs
    def observe(self, obs: Observation, now: float | None = None) -> None:
        """Record one finished request. Cheap: counters and windows only."""
        now = self.clock() if now is None else now
        self.observations += 1
        self.estimator.observe(obs)
        self.load.observe_request(obs.batch_size, now)
        p = self._probe
        if p is not None and p.started_at is not None and obs.config == p.config:
            p.requests += 1
            if p.incumbent_tpot_s is not None and obs.output_tokens > 1:
                p.regret_s += max(0.0, obs.tpot_s - p.incumbent_tpot_s) * (obs.output_tokens - 1)

    def observe_engine(self, snap: EngineSnapshot, now: float | None = None) -> None:
        """Record engine gauges (running/waiting requests, KV-cache usage)."""
        now = self.clock() if now is None else now
        self.load.observe_snapshot(snap, now)
        self._preempted += snap.preemptions

    def activate(self, config: SpecConfig, schedule: KSchedule | None = None, *,
                 now: float | None = None, rebuilt: bool = False) -> None:
        """Tell the controller what the engine runs (at start, or after a change
        the controller did not propose); it becomes the last good config."""
        now = self.clock() if now is None else now
        self._set_active(config, schedule)
        self._last_good = (config, self._schedule)
        self._last_switch_at = now
        self._pending = None
        self._probe = None
        if rebuilt:
            self.engine_rebuilds += 1

    def set_warm(self, engines: Iterable[tuple[SpecConfig, KSchedule | None]]) -> None:
        """Engines already built and waiting beside the serving one (standby):
        moving to one is instant, so one predicted within the hysteresis margin
        of the best is chosen instead of building the best."""
        max_batch = self.settings.schedule.max_batch
        self._warm = tuple(None if not cfg.enabled else (sched or KSchedule.uniform(cfg, max_batch))
                           for cfg, sched in engines)

    def applied(self, decision: Decision, *, now: float | None = None, rebuilt: bool = True) -> None:
        """The engine now runs ``decision``'s target (``rebuilt``: it took a new engine)."""
        now = self.clock() if now is None else now
        if self._pending is not decision:
            log.warning("applied() for a decision that is not pending: %s", decision.reason)
        self._pending = None
        self._set_active(decision.target, decision.schedule)
        self._last_switch_at = now
        self.switches += 1
        if rebuilt:
            self.engine_rebuilds += 1
            self.observe_build(now - self._pending_since)
        if decision.action == "explore" and self._probe is not None:
            self._probe.started_at = now
        elif decision.action == "switch" or decision.reason_code == "acceptance_collapse":
            # a KV-pressure cut is transient and a probe unproven: neither is "good"
            self._last_good = (self._active_config_base(), self._schedule)

    def observe_build(self, seconds: float) -> None:
        """An engine build beside the serving one took ``seconds`` (a rebuild, or
        a standby engine built under load)."""
        if seconds > 0:
            self.rebuild_s = 0.5 * (self.rebuild_s + seconds) if self._rebuild_measured else seconds
            self._rebuild_measured = True

    def observe_during_build(self, tpot_s: float, batch_size: float) -> None:
        """A request served while another engine was being built: its TPOT
        against the model's for the serving config updates ``build_slowdown``
        (a mean over the last ~20 such requests)."""
        expected = self._plan_of(self._schedule, max(1.0, batch_size)).prediction.tpot_s if self.estimator.ready else None
        if not expected or tpot_s <= 0:
            return
        ratio = min(10.0, max(0.5, tpot_s / expected))
        self._slowdown_samples += 1
        weight = 1.0 / min(self._slowdown_samples, 20)
        self.build_slowdown += weight * (ratio - self.build_slowdown)

    def apply_failed(self, decision: Decision, error: str = "", *, now: float | None = None) -> None:
        """The switch could not be made; the old engine still serves."""
        now = self.clock() if now is None else now
        self._pending = None
        if decision.action == "explore":
            self._probe = None
        self._cooldown[decision.target] = now + self.settings.hysteresis.failed_config_cooldown_s
        self._event(now, "apply_failed", f"could not switch to {decision.target.label()}: {error}")

    # ------------------------------------------------------------------ queries
    @property
    def active_schedule(self) -> KSchedule | None:
        """Schedule of the running engine; None when speculation is off."""
        return self._schedule

    def active_config(self, batch: float | None = None) -> SpecConfig:
        """Config in effect at ``batch`` running requests (default: the current load)."""
        if self._schedule is None:
            return SpecConfig.off()
        return self._schedule.config_at(self.load.current if batch is None else batch)

    def reset_load(self) -> None:
        """Forget the load history (e.g. after a calibration sweep, whose
        concurrency says nothing about the traffic to come)."""
        self.load = LoadTracker(self.settings.load)

    def start_config(self) -> tuple[SpecConfig, KSchedule | None]:
        """What to build the first engine with: the profile's last good config
        if one was loaded, else ``settings.initial``."""
        return self._last_good

    @property
    def pending(self) -> Decision | None:
        return self._pending

    # ---------------------------------------------------------------- decide
    def decide(self, now: float | None = None) -> Decision:
        """Refit lazily and decide. Call every few seconds (e.g. 1-2 s)."""
        now = self.clock() if now is None else now
        st = self.settings
        self._accrue(now)
        load = self.load.current

        change = self.load.detect_change(now)
        if change is not None:
            self._last_load_change_at = now
            self._reset_streak(now)
            self._event(now, "load_change", f"load {change.before:.1f} -> {change.after:.1f} running requests")
        mode = self._mode
        if mode != OFF:
            shift = self.estimator.acceptance.detect_shift(mode)
            if shift is not None:
                other = PARALLEL if mode == AUTOREGRESSIVE else AUTOREGRESSIVE
                self.estimator.acceptance.forget(st.acceptance.shift_keep, modes=(mode,))
                self.estimator.acceptance.forget(st.acceptance.shift_keep_other, modes=(other,))
                self.estimator.invalidate()
                self._reset_streak(now)
                self._event(now, "acceptance_shift",
                            f"{mode} position-1 acceptance {shift.recent_rate:.2f} recently vs "
                            f"{shift.long_rate:.2f} before; old acceptance data down-weighted")

        if not st.enabled:
            return self._hold(now, load, "disabled", "controller disabled by settings")

        if self._pending is not None:
            if now - self._pending_since > st.hysteresis.pending_timeout_s:
                d = self._pending
                self._pending = None
                if d.action == "explore":
                    self._probe = None
                self._event(now, "pending_timeout", f"switch to {d.target.label()} not confirmed; dropped")
            else:
                return self._hold(now, load, "pending", f"waiting for the engine to run {self._pending.target.label()}")

        d = self._check_collapse(now, load)
        if d is None:
            d = self._check_kv(now, load)
        if d is not None:
            return d

        self.estimator.refit()
        if not self.estimator.ready:
            return self._hold(now, load, "no_data", "no measurements yet")

        after_probe = False
        p = self._probe
        if p is not None and p.started_at is not None:
            elapsed = now - p.started_at
            ex = st.exploration
            if not ((p.requests >= ex.min_requests and elapsed >= ex.min_s) or elapsed >= ex.max_s):
                return self._hold(now, load, "probe_running",
                                  f"probing {p.config.label()}: {p.requests}/{ex.min_requests} requests, {elapsed:.0f} s")
            self._finish_probe(now)
            after_probe = True

        return self._optimise(now, load, after_probe)

    # ------------------------------------------------------------ the policy
    def _optimise(self, now: float, load: float, after_probe: bool) -> Decision:
        st = self.settings
        hy = st.hysteresis
        plans = self._plans(now, load)
        active = self._active_plan(load)
        trusted = [pl for pl in plans if self._trusted(pl.mode) or pl.mode == active.mode]
        best = _pick(trusted) if trusted else active
        best = self._prefer_warm(now, load, best, active)
        a_pred, b_pred = active.prediction, best.prediction
        a_tpot, b_tpot = a_pred.tpot_s, b_pred.tpot_s
        same = best.mode == active.mode and best.config == active.config
        gain = 0.0 if (a_tpot is None or b_tpot is None) else (a_tpot - b_tpot) / a_tpot
        # leave for the SLO only when clearly missing it (hysteresis on a noisy quantile)
        slo_fix = a_pred.slo_excess > 1.0 + hy.slo_margin and b_pred.feasible
        probe_note = ""
        if after_probe and self._last_probe_summary:
            probe_note = self._last_probe_summary + "; "

        if same or a_tpot is None or b_tpot is None or (gain <= 0 and not slo_fix):
            self._reset_streak(now)
            runner = _pick([pl for pl in trusted if pl.mode != best.mode]) if len(trusted) > 1 else None
            extra = (f"; next best {runner.config.label()} {_ms(runner.prediction.tpot_s)}"
                     if runner is not None and runner.prediction.tpot_s is not None else "")
            d = self._hold(now, load, "probe_kept" if after_probe else "best",
                           f"{probe_note}{active.config.label()} is predicted best at load {load:.1f} "
                           f"(TPOT {_ms(a_tpot)}){extra}", plan=active, record=False)
            return self._maybe_explore(now, load, d, active)

        warm = best.schedule in self._warm  # an instant switch: no rebuild to pay for
        margin = min(hy.warm_margin, hy.margin) if warm else hy.margin
        if after_probe:
            threshold = st.exploration.keep_tolerance
        else:
            threshold = margin + hy.confidence_z * self._gain_error(active, best, load)
        if (gain >= threshold and not slo_fix and not after_probe and not warm
                and self._tpot_if_rebuilt(a_tpot, b_tpot) >= a_tpot):
            self._reset_streak(now)
            return self._hold(now, load, "rebuild_cost",
                              f"{best.config.label()} predicted {gain:.0%} faster than {active.config.label()}, but a "
                              f"{self.rebuild_s:.0f}-s rebuild, serving {self.build_slowdown:.1f}x slower meanwhile, would not "
                              f"pay back within {hy.load_horizon_s:.0f} s", plan=active)
        if gain >= threshold or slo_fix:
            key = (best.mode, best.config.k)
            # the streak needs the same winner at a steady load (not a ramp)
            if self._streak_key != key or abs(math.log(load / self._streak_load)) > _STREAK_LOAD_BAND:
                self._streak_key, self._streak_count, self._streak_since = key, 0, now
                self._streak_load = load
            self._streak_count += 1
            why = (f"{best.config.label()} meets the TTFT SLO and {active.config.label()} does not"
                   if slo_fix else
                   f"{best.config.label()} predicted {gain:.0%} faster than {active.config.label()} "
                   f"at load {load:.1f} (TPOT {_ms(b_tpot)} vs {_ms(a_tpot)})")
            if after_probe:
                return self._emit("switch", now, load, best, gain, probe_note + why, "probe_done", active)
            if self._streak_count < hy.sustain_decisions or now - self._streak_since < hy.sustain_s:
                return self._hold(now, load, "sustaining",
                                  f"{why}; sustained {self._streak_count}/{hy.sustain_decisions} decisions", plan=active)
            # a load change since the last switch is not noise: a shorter dwell
            # applies. Not to leaving for the SLO: that judges the engine just
            # switched to on its first requests, slow while its prefix cache is
            # cold (tenth phases run: off judged over the SLO 16 s after the
            # switch to it, then a rebuild under full load, 56 ms TPOT).
            dwell = hy.min_dwell_s
            if self._last_load_change_at > self._last_switch_decided_at and not slo_fix:
                dwell = min(dwell, hy.min_dwell_after_load_change_s)
            if now - self._last_switch_at < dwell:
                return self._hold(now, load, "dwell",
                                  f"{why}; last switch {now - self._last_switch_at:.0f} s ago "
                                  f"(min dwell {dwell:.0f} s)", plan=active)
            return self._emit("switch", now, load, best, gain, why, "slo" if slo_fix else "better", active)

        self._reset_streak(now)
        d = self._hold(now, load, "probe_kept" if after_probe else "within_margin",
                       f"{probe_note}{best.config.label()} predicted {gain:.1%} faster than "
                       f"{active.config.label()}, below the {threshold:.0%} needed (margin "
                       f"{margin:.0%}{' for a warm engine' if warm else ''} "
                       f"+ uncertainty)", plan=active, record=False)
        return self._maybe_explore(now, load, d, active)

    def _maybe_explore(self, now: float, load: float, hold: Decision, active: _ModePlan) -> Decision:
        """A probe if one is worth it and affordable, else ``hold`` (recorded)."""
        st = self.settings
        ex = st.exploration
        if (not ex.enabled or self._k_cap is not None or self._probe is not None
                or now - self._last_switch_at < st.hysteresis.min_dwell_s
                or now - self._last_load_change_at < ex.stable_load_s
                or active.prediction.tpot_s is None):
            return self._record(hold)
        planned_cost = 2 * ex.rebuild_cost_s + ex.min_s
        if self._bank < planned_cost:
            return self._record(hold)
        a_tpot = active.prediction.tpot_s
        best_cfg, best_opt, best_pred = None, None, None
        for cfg in st.candidates:
            if cfg == active.config or self._banned(cfg, now):
                continue
            pred = self.estimator.predict(cfg, load)
            if pred.tpot_optimistic_s is None or not pred.feasible:
                continue
            if self._trusted(cfg.mode) and pred.samples >= ex.min_samples_near_load:
                continue  # measured near this load already: the model's word stands
            opt = pred.tpot_optimistic_s * (1.0 - ex.optimism / math.sqrt(1.0 + pred.samples))
            if opt < a_tpot * (1.0 - st.hysteresis.margin) and (best_opt is None or opt < best_opt):
                best_cfg, best_opt, best_pred = cfg, opt, pred
        if best_cfg is None:
            return self._record(hold)
        sched = KSchedule.uniform(best_cfg, st.schedule.max_batch) if best_cfg.enabled else None
        if sched not in self._warm and load > ex.max_load_for_build:
            # every running stream would pay for the build
            return self._record(dataclasses.replace(hold, reason=(
                f"{hold.reason}; a probe of {best_cfg.label()} waits for at most "
                f"{ex.max_load_for_build:g} running requests (it needs a new engine)")))
        self._probe = _Probe(best_cfg, sched, a_tpot)
        self._bank -= 2 * ex.rebuild_cost_s
        self._explore_spent_s += 2 * ex.rebuild_cost_s
        self._probes += 1
        self._share = max(ex.min_share, self._share * ex.share_decay)
        gain = (a_tpot - best_pred.tpot_s) / a_tpot if best_pred.tpot_s else 0.0
        plan = _ModePlan(best_cfg.mode, sched, best_pred)
        return self._emit(
            "explore", now, load, plan, gain,
            f"probing {best_cfg.label()}: {best_pred.samples:.0f} requests near load {load:.1f}, "
            f"optimistic TPOT {_ms(best_opt)} vs {_ms(a_tpot)} now (model {_ms(best_pred.tpot_s)}); "
            f"exploration budget {self._bank:.0f} s left", "explore", active)

    def _finish_probe(self, now: float) -> None:
        p = self._probe
        assert p is not None and p.started_at is not None
        elapsed = now - p.started_at
        self._bank -= elapsed
        self._explore_spent_s += elapsed
        self._explore_regret_s += p.regret_s
        measured = self.estimator.predict(p.config, self.load.current)
        self._last_probe_summary = (f"probe of {p.config.label()} done after {p.requests} requests "
                                    f"(model now {_ms(measured.tpot_s)})")
        self._event(now, "probe_done", self._last_probe_summary, note=False)
        self._probe = None

    # ------------------------------------------------------------ fallbacks
    def _check_collapse(self, now: float, load: float) -> Decision | None:
        fb = self.settings.fallback
        mode = self._mode
        if mode == OFF:
            return None
        length, drafts, reqs = self.estimator.acceptance.recent_acceptance_length(mode)
        if drafts < fb.collapse_min_drafts or reqs < fb.collapse_min_requests or length >= fb.collapse_acceptance_length:
            return None
        self._spec_blocked_until = now + fb.collapse_cooldown_s
        self._fallback_reason = (
            f"acceptance collapsed: {mode} mean accepted length {length:.2f} tokens/step over {drafts} "
            f"drafts in {reqs} requests (threshold {fb.collapse_acceptance_length:.2f}); speculation off "
            f"for {fb.collapse_cooldown_s:.0f} s")
        self.estimator.acceptance.clear_recent()  # judge any retry on fresh data only
        self._probe = None
        self._k_cap = None
        active = self._active_plan(load)
        off = _ModePlan(OFF, None, self.estimator.predict(SpecConfig.off(), load))
        gain = _gain(active.prediction.tpot_s, off.prediction.tpot_s)
        return self._emit("fallback", now, load, off, gain, self._fallback_reason, "acceptance_collapse", active)

    def _check_kv(self, now: float, load: float) -> Decision | None:
        fb = self.settings.fallback
        tr = self.load
        if not tr.snapshots_fresh(now):
            return None
        kv = tr.kv_usage
        preempted, self._preempted = self._preempted, 0
        if kv < fb.kv_low:
            self._kv_low_since = self._kv_low_since if self._kv_low_since is not None else now
            if self._k_cap is not None and now - self._kv_low_since >= self._kv_release_wait:
                # lift the cap in one go (stepping up would rebuild once per step);
                # if pressure comes back soon, the next release waits longer
                old = self._k_cap
                self._k_cap = None
                self._last_kv_release_at = now
                self._event(now, "kv_release", f"KV cache below {fb.kv_low:.0%} for "
                            f"{self._kv_release_wait:.0f} s: K cap {old} lifted")
            return None
        self._kv_low_since = None
        if kv < fb.kv_high and not preempted:
            return None
        k_now = self._schedule.k_for(load) if self._schedule is not None else 0
        if k_now <= 0:
            return None
        if now - self._last_pressure_at < fb.pressure_min_interval_s and kv < fb.kv_critical:
            return None
        lower = [c.k for c in self.settings.candidates if c.enabled and c.parallel == self._schedule.parallel and c.k < k_now]
        new_cap = max(lower) if lower else 0
        if now - self._last_kv_release_at < 4 * fb.kv_release_s:
            self._kv_release_wait = min(self._kv_release_wait * 2, 16 * fb.kv_release_s)
        elif self._k_cap is None:
            self._kv_release_wait = fb.kv_release_s
        self._k_cap = new_cap if self._k_cap is None else min(self._k_cap, new_cap)
        self._last_pressure_at = now
        self._probe = None
        active = self._active_plan(load)
        sched = self._schedule.capped(new_cap)
        cfg = sched.config_at(load) if sched is not None else SpecConfig.off()
        plan = _ModePlan(cfg.mode, sched, self.estimator.predict(cfg, load))
        what = f"KV cache {kv:.0%}" + (f", {preempted} preemptions" if preempted else "")
        self._fallback_reason = (f"{what} (limit {fb.kv_high:.0%}): reducing K {k_now} -> {new_cap}"
                                 + (" (speculation off)" if new_cap == 0 else ""))
        return self._emit("fallback", now, load, plan, _gain(active.prediction.tpot_s, plan.prediction.tpot_s),
                          self._fallback_reason, "kv_pressure", active)

    # ------------------------------------------------------------ planning
    def _plans(self, now: float, load: float) -> list[_ModePlan]:
        est = self.estimator
        banned = frozenset(c for c in self.settings.candidates if self._banned(c, now))
        out = [_ModePlan(OFF, None, est.predict(SpecConfig.off(), load))]
        for parallel in (False, True):
            sched = est.best_schedule(parallel, load=load, k_cap=self._k_cap, banned=banned)
            if sched is None:
                continue
            cfg = sched.config_at(load)
            if not cfg.enabled:  # K=0 at this load inside a speculative engine
                pred = est._off_in_mode(parallel, load)
            else:
                pred = est.predict(cfg, load)
            out.append(_ModePlan(cfg.mode if cfg.enabled else (PARALLEL if parallel else AUTOREGRESSIVE), sched, pred))
        return out

    def _active_plan(self, load: float) -> _ModePlan:
        return self._plan_of(self._schedule, load)

    def _plan_of(self, schedule: KSchedule | None, load: float) -> _ModePlan:
        """The plan of an engine running ``schedule`` (None: speculation off) at ``load``."""
        if schedule is None:
            return _ModePlan(OFF, None, self.estimator.predict(SpecConfig.off(), load))
        cfg = schedule.config_at(load)
        # K=0 at this load inside a speculative engine: the mode's model at K=0
        pred = self.estimator.predict(cfg, load) if cfg.enabled else self.estimator._off_in_mode(schedule.parallel, load)
        return _ModePlan(PARALLEL if schedule.parallel else AUTOREGRESSIVE, schedule, pred)

    def _prefer_warm(self, now: float, load: float, best: _ModePlan, active: _ModePlan) -> _ModePlan:
        """``best``, or a warm engine's plan (meeting the SLOs if ``best``
        does) that is predicted within the hysteresis margin of it, or whose
        instant switch serves the load's horizon faster than building
        ``best`` while the active engine keeps serving, slowed by the build:

            H * warm  <=  R * s * active + (H - R) * best
            (R: rebuild time, s: build_slowdown, H: load_horizon_s)

        On 2 CPU cores a rebuild takes 40-48 s and the serving engine runs
        2-3x slower meanwhile: phases runs rebuilt to a config 2-10%
        better than a warm one and served most of a 60-s phase at 20-31 ms
        against 9 ms."""
        b_tpot = best.prediction.tpot_s
        if b_tpot is None or (best.mode == active.mode and best.config == active.config):
            return best
        limit = b_tpot * (1.0 + self.settings.hysteresis.margin)
        a_tpot = active.prediction.tpot_s
        if a_tpot is not None:
            limit = max(limit, self._tpot_if_rebuilt(a_tpot, b_tpot))
        chosen = None
        for sched in self._warm:
            if sched == self._schedule:
                continue  # the serving engine itself
            plan = self._plan_of(sched, load)
            p = plan.prediction
            if (p.tpot_s is None or p.tpot_s > limit or (best.prediction.feasible and not p.feasible)
                    or not (plan.mode == OFF or self._trusted(plan.mode)) or self._banned(plan.config, now)
                    or (self._k_cap is not None and sched is not None and sched.max_k > self._k_cap)):
                continue
            if chosen is None or p.tpot_s < chosen.prediction.tpot_s:
                chosen = plan
        return chosen or best

    def _tpot_if_rebuilt(self, active_tpot: float, best_tpot: float) -> float:
        """Mean TPOT over the load's horizon H if the best is built now: the
        active engine serves the R seconds of the build s times slower, then
        the best serves the rest, (R * s * active + (H - R) * best) / H. A
        warm engine below it wins over the build (``_prefer_warm``); a build
        not below ``active_tpot`` does not pay (with s = 1 any gain pays; with
        R = 38 s and s = 2 it takes about half the TPOT)."""
        share = min(1.0, self.rebuild_s / self.settings.hysteresis.load_horizon_s)
        return share * self.build_slowdown * active_tpot + (1.0 - share) * best_tpot

    def _gain_error(self, a: _ModePlan, b: _ModePlan, load: float) -> float:
        """Standard error of the predicted relative TPOT gain of b over a."""
        return math.sqrt(self._tpot_error(a.prediction, load) ** 2 + self._tpot_error(b.prediction, load) ** 2)

    def _tpot_error(self, p: Prediction, load: float) -> float:
        step_se = self.estimator.step.relative_error(p.config.mode, p.config.k, load)
        z = self.settings.acceptance.credible_z
        el_se = (p.acceptance_length_high - p.acceptance_length_low) / (2 * z * p.acceptance_length) if z else 0.0
        return math.sqrt(step_se ** 2 + el_se ** 2)

    def _banned(self, cfg: SpecConfig, now: float) -> bool:
        if cfg.enabled and now < self._spec_blocked_until:
            return True
        if self._k_cap is not None and cfg.k > self._k_cap:
            return True
        return self._cooldown.get(cfg, -math.inf) > now

    def _trusted(self, mode: Mode) -> bool:
        ex = self.settings.exploration
        if not ex.enabled:
            return True  # without probes the model's word is all there is
        return self.estimator.step.samples(mode) >= ex.min_samples_trusted

    # ------------------------------------------------------------ helpers
    @property
    def _mode(self) -> Mode:
        if self._schedule is None:
            return OFF
        return PARALLEL if self._schedule.parallel else AUTOREGRESSIVE

    def _set_active(self, config: SpecConfig, schedule: KSchedule | None) -> None:
        if schedule is None and config.enabled:
            schedule = KSchedule.uniform(config, self.settings.schedule.max_batch)
        if schedule is not None and config.enabled and schedule.parallel != config.parallel:
            raise ValueError(f"schedule {schedule.label()} does not match config {config.label()}")
        self._schedule = schedule if (config.enabled or schedule is not None) else None

    def _active_config_base(self) -> SpecConfig:
        if self._schedule is None:
            return SpecConfig.off()
        return SpecConfig(self._schedule.parallel, self._schedule.max_k)

    def _accrue(self, now: float) -> None:
        ex = self.settings.exploration
        dt = max(0.0, now - self._last_accrual)
        self._last_accrual = max(self._last_accrual, now)
        self._bank = min(ex.bank_cap_s, self._bank + self._share * dt)

    def _reset_streak(self, now: float) -> None:
        self._streak_key, self._streak_count, self._streak_since = None, 0, now

    def _event(self, now: float, kind: str, detail: str, *, note: bool = True) -> None:
        self.events.append({"unix_time": now, "kind": kind, "detail": detail})
        if note:  # also prefix the next decision's reason, so the log says why
            self._notes.append(detail)
        log.info("controller %s: %s", kind, detail)

    def _hold(self, now: float, load: float, code: str, reason: str, *, plan: _ModePlan | None = None,
              record: bool = True) -> Decision:
        cur = self.active_config(load)
        tpot = plan.prediction.tpot_s if plan is not None else None
        d = Decision("hold", cur, cur, self._schedule, 0.0, self._with_notes(reason), code, now, load, tpot, tpot)
        return self._record(d) if record else d

    def _emit(self, action: Action, now: float, load: float, plan: _ModePlan, gain: float,
              reason: str, code: str, active: _ModePlan) -> Decision:
        target = plan.config if plan.schedule is None else plan.schedule.config_at(load)
        d = Decision(action, active.config, target, plan.schedule, gain, self._with_notes(reason), code,
                     now, load, plan.prediction.tpot_s, active.prediction.tpot_s)
        self._pending = d
        self._pending_since = now
        self._last_switch_decided_at = now
        self._reset_streak(now)
        log.info("controller %s: %s", action, d.reason)
        return self._record(d)

    def _with_notes(self, reason: str) -> str:
        if not self._notes:
            return reason
        notes, self._notes = self._notes, []
        return "; ".join(notes) + "; " + reason

    def _record(self, d: Decision) -> Decision:
        self.decisions.add(d)
        return d

    # ------------------------------------------------------------ reporting
    def candidates(self, load: float | None = None) -> list[Prediction]:
        """Predictions for every candidate config at ``load`` (default: current)."""
        load = self.load.current if load is None else load
        self.estimator.refit()
        return [self.estimator.predict(c, load) for c in self.settings.candidates]

    def recommend(self, load: float) -> tuple[SpecConfig, KSchedule | None, Prediction]:
        """The model's pick at ``load`` ignoring hysteresis, trust and budgets
        (used by the calibration sweep and tests)."""
        self.estimator.refit()
        now = self.clock()
        best = _pick(self._plans(now, load))
        return best.config, best.schedule, best.prediction

    def state(self, *, decisions: int = 16) -> dict:
        """Plain dict for the GetControllerState RPC (keys follow the proto's
        ControllerState; extra keys carry detail for logs and debugging)."""
        now = self.clock()
        load = self.load.current
        est = self.estimator
        est.refit()
        sched = self._schedule
        cfg = self.active_config(load)
        cands = []
        for p in (est.predict(c, load) for c in self.settings.candidates) if est.ready else ():
            cands.append(_candidate_dict(p, self.settings))
        if not est.ready:
            cands = [{"config": c.label(), "parallel_drafting": c.parallel, "num_speculative_tokens": c.k,
                      "samples": 0} for c in self.settings.candidates]
        acc = {}
        for m in SPEC_MODES:
            pos = est.acceptance.positions(m)
            acc[m] = {
                "conditional": [round(p.mean, 4) for p in pos],
                "conditional_low": [round(p.low, 4) for p in pos],
                "conditional_high": [round(p.high, 4) for p in pos],
                "marginal": [round(v, 4) for v in est.acceptance.marginal(m)],
                "trials": [round(p.trials, 1) for p in pos],
            }
        shown_mode = self._mode if self._mode != OFF else AUTOREGRESSIVE
        shown_k = sched.max_k if sched is not None else 7
        fit = est.step.fit()
        ttft_fit = est.ttft.fit(est._step_fn) if fit is not None else None
        probe = self._probe
        return {
            "enabled": self.settings.enabled,
            "active": {
                "config": cfg.label(),
                "method": "eagle3" if sched is not None else "",
                "parallel_drafting": sched.parallel if sched is not None else False,
                "num_speculative_tokens": sched.max_k if sched is not None else 0,
                "per_batch_size": ([{"min_batch_size": a, "max_batch_size": b, "num_speculative_tokens": k}
                                    for a, b, k in sched.ranges] if sched is not None else []),
                "schedule": sched.label() if sched is not None else "off",
            },
            "candidates": cands,
            "decisions": [d.to_dict() for d in self.decisions.last(decisions)],
            "acceptance_per_position": acc[shown_mode]["marginal"][:shown_k],
            "running_requests": round(load, 3),
            "profile_path": self.profile_path,
            "engine_rebuilds": self.engine_rebuilds,
            # extras
            "acceptance": acc,
            "step_model": fit.as_dict() if fit is not None else None,
            "ttft_model": (None if ttft_fit is None else {
                "intercept_s": ttft_fit.intercept, "kappa": ttft_fit.kappa, "theta_s": ttft_fit.theta,
                "residual_quantile_s": ttft_fit.resid_q, "samples": ttft_fit.samples}),
            "slo_ttft_s": dict(self.settings.slo.ttft_s),
            "rebuild": {"seconds": round(self.rebuild_s, 2), "measured": self._rebuild_measured,
                        "serving_slowdown": round(self.build_slowdown, 3), "slowdown_samples": self._slowdown_samples},
            "load": {"current": round(load, 3), "reference": round(self.load.slow or load, 3),
                     "kv_cache_usage": self.load.kv_usage, "waiting": self.load.waiting},
            "fallback": {"k_cap": self._k_cap,
                         "speculation_blocked_for_s": max(0.0, self._spec_blocked_until - now),
                         "reason": self._fallback_reason},
            "exploration": {"bank_s": round(self._bank, 2), "share": round(self._share, 4),
                            "spent_s": round(self._explore_spent_s, 2),
                            "regret_s": round(self._explore_regret_s, 4), "probes": self._probes,
                            "probe": None if probe is None else {
                                "config": probe.config.label(), "requests": probe.requests,
                                "started": probe.started_at is not None}},
            "pending": None if self._pending is None else self._pending.to_dict(),
            "last_good": (self._last_good[1].label() if self._last_good[1] is not None
                          else self._last_good[0].label()),
            "switches": self.switches,
            "observations": self.observations,
            "events": list(self.events),
        }

    # ------------------------------------------------------------ profiles
    def profile_dict(self) -> dict:
        """Everything a restart needs: last good config and the models' data."""
        cfg, sched = self._last_good
        return {
            "schema": PROFILE_SCHEMA,
            "saved_at": self.clock(),
            "config": cfg.label(),
            "schedule": sched.to_dict() if sched is not None else None,
            "acceptance": self.estimator.acceptance.to_dict(),
            "step_model": self.estimator.step.to_dict(),
            "ttft": self.estimator.ttft.to_dict(),
            "rebuild_s": self.rebuild_s,
            "build_slowdown": self.build_slowdown,
        }

    def restore(self, profile: dict) -> None:
        """Load a profile (raises ValueError if it is unusable; nothing changes then)."""
        if not isinstance(profile, dict) or profile.get("schema") != PROFILE_SCHEMA:
            raise ValueError(f"profile schema {profile.get('schema') if isinstance(profile, dict) else None!r} "
                             f"is not {PROFILE_SCHEMA}")
        cfg = SpecConfig.parse(profile["config"])
        sched = KSchedule.from_dict(profile["schedule"]) if profile.get("schedule") else None
        if cfg.enabled and sched is not None and sched.parallel != cfg.parallel:
            raise ValueError("profile schedule and config disagree on the drafting mode")
        fresh = Estimator(self.settings)
        fresh.acceptance.load_dict(profile.get("acceptance", {}))
        fresh.step.load_dict(profile.get("step_model", {}))
        fresh.ttft.load_dict(profile.get("ttft", {}))
        self.estimator = fresh
        if isinstance(profile.get("rebuild_s"), (int, float)) and profile["rebuild_s"] > 0:
            self.rebuild_s = float(profile["rebuild_s"])  # measured on this hardware last time
            self._rebuild_measured = True
        if isinstance(profile.get("build_slowdown"), (int, float)) and profile["build_slowdown"] > 0:
            self.build_slowdown = float(profile["build_slowdown"])
            self._slowdown_samples = 1  # the next measurement moves it halfway
        self._set_active(cfg, sched)
        self._last_good = (cfg, self._schedule)


def _pick(plans: list[_ModePlan]) -> _ModePlan:
    """Feasible before infeasible (least SLO excess first), then lowest TPOT."""
    def key(pl: _ModePlan):
        p = pl.prediction
        return (0.0 if p.feasible else p.slo_excess, p.tpot_s if p.tpot_s is not None else math.inf)
    return min(plans, key=key)


def _gain(cur: float | None, new: float | None) -> float:
    if not cur or new is None:
        return 0.0
    return (cur - new) / cur


def _ms(v: float | None) -> str:
    return "?" if v is None else f"{v * 1e3:.2f} ms"


def _candidate_dict(p: Prediction, settings: ControllerSettings) -> dict:
    ttft_ms = {c: (None if v is None else round(v * 1e3, 3)) for c, v in p.ttft_s.items()}
    shown = next((ttft_ms[c] for c in ("inline", "chat", "batch") if ttft_ms.get(c) is not None), None)
    return {
        "config": p.config.label(),
        "parallel_drafting": p.config.parallel,
        "num_speculative_tokens": p.config.k,
        "predicted_tpot_ms": None if p.tpot_s is None else round(p.tpot_s * 1e3, 4),
        "predicted_ttft_ms": shown,
        "expected_acceptance_length": round(p.acceptance_length, 4),
        "samples": p.count,
        "expected_acceptance_length_low": round(p.acceptance_length_low, 4),
        "expected_acceptance_length_high": round(p.acceptance_length_high, 4),
        "predicted_step_ms": None if p.step_s is None else round(p.step_s * 1e3, 4),
        "predicted_ttft_ms_by_class": ttft_ms,
        "meets_slo": p.feasible,
        "slo_excess": round(p.slo_excess, 4),
        "effective_samples": round(p.samples, 2),
    }
