"""The adaptive speculation controller: observe, decide, report.

Deterministic given its inputs and clock; no threads, no I/O (profiles are
read and written by ``profile.ProfileStore`` when the server asks). The
controller ties the parts together: the policy (policy.py) picks the best
engine setting and applies the hysteresis, exploration (exploration.py)
probes configs the model is unsure about, safety (safety.py) makes the
fallbacks that skip the hysteresis, and rebuild_cost.py prices a switch.
Where every candidate is a live switch away, measured.py decides instead of
the policy and exploration: it measures each config at the load at hand.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Iterable

from ..config.controller import ControllerSettings
from ..speculative import AUTOREGRESSIVE, PARALLEL, SPEC_MODES, Mode, SpecConfig
from . import profile
from .decision import Decision, DecisionLog, Verdict
from .estimator import Estimator, Plan, Prediction
from .events import EventLog
from .exploration import Exploration
from .load import LoadTracker
from .measured import MeasuredPolicy, Window
from .observation import EngineSnapshot, Observation
from .policy import Policy, SwitchTimes, Warm, pick
from .rebuild_cost import RebuildCost
from .safety import Safety
from .state import AcceptanceView, ControllerState, ExplorationView, FallbackView, LoadView, MeasuredView

log = logging.getLogger(__name__)


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
        now = clock()
        self.estimator = Estimator(st)
        self.load = LoadTracker(st.load)
        self.decisions = DecisionLog(st.history_size)
        self.events = EventLog()
        self.rebuild = RebuildCost(st.exploration.rebuild_cost_s)
        self.policy = Policy(st, self.rebuild)
        self.exploration = Exploration(st, self.events, now)
        self.safety = Safety(st, self.events)
        self.measured = MeasuredPolicy(st)
        self.times = SwitchTimes(switched_at=now, decided_at=now)
        self._engine = st.initial
        self._last_good = st.initial
        self._warm = Warm()
        self._pending: Decision | None = None
        self._pending_since = now
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
        self.exploration.observe(obs)

    def observe_window(self, window: Window, now: float | None = None) -> None:
        """Record what the engine served since the last window (measured.py)."""
        now = self.clock() if now is None else now
        self.measured.observe(window, now)

    def observe_engine(self, snap: EngineSnapshot, now: float | None = None) -> None:
        """Record engine gauges (running/waiting requests, KV-cache usage)."""
        now = self.clock() if now is None else now
        self.load.observe_snapshot(snap, now)
        self.safety.observe_preemptions(snap.preemptions)

    def activate(self, engine: SpecConfig, *, now: float | None = None, rebuilt: bool = False) -> None:
        """Tell the controller what the engine runs (at start, or after a change
        the controller did not propose); it becomes the last good setting."""
        now = self.clock() if now is None else now
        self._engine = self._last_good = engine
        self.times.switched_at = now
        self._pending = None
        self.exploration.cancel()
        if rebuilt:
            self.engine_rebuilds += 1

    def set_warm(self, engines: Iterable[SpecConfig], live: Callable[[SpecConfig], bool] | None = None) -> None:
        """What the server can move to without building an engine: ``engines``
        built and waiting beside the serving one (standby), and the settings
        for which ``live`` is true (the serving engine switches to them
        between two steps). Moving there is instant, so it needs only
        ``hysteresis.warm_margin``, pays no rebuild, and a probe there costs
        no build and may run at any load."""
        self._warm = Warm(engines, live)

    def applied(self, decision: Decision, *, now: float | None = None, rebuilt: bool = True) -> None:
        """The engine now runs ``decision.engine`` (``rebuilt``: it took a new engine)."""
        now = self.clock() if now is None else now
        if self._pending is not decision:
            log.warning("applied() for a decision that is not pending: %s", decision.reason)
        self._pending = None
        self._engine = decision.engine
        self.times.switched_at = now
        self.switches += 1
        if rebuilt:
            self.engine_rebuilds += 1
            self.rebuild.observe_build(now - self._pending_since)
        if decision.action == "explore":
            self.exploration.started(now)
        elif decision.action == "switch" or decision.reason_code == "acceptance_collapse":
            # a KV-pressure cut is transient and a probe unproven: neither is "good"
            self._last_good = decision.engine

    def observe_build(self, seconds: float) -> None:
        """An engine build beside the serving one took ``seconds`` (a rebuild, or
        a standby engine built under load)."""
        self.rebuild.observe_build(seconds)

    def observe_during_build(self, tpot_s: float, batch_size: float) -> None:
        """A request served while another engine was being built: its TPOT
        against the model's for the serving engine updates the build slowdown."""
        if not self.estimator.ready:
            return
        expected = self.estimator.plan(self._engine, max(1.0, batch_size)).prediction.tpot_s
        if expected:
            self.rebuild.observe_slowdown(tpot_s, expected)

    def apply_failed(self, decision: Decision, error: str = "", *, now: float | None = None) -> None:
        """The switch could not be made; the old engine still serves."""
        now = self.clock() if now is None else now
        self._pending = None
        if decision.action == "explore":
            self.exploration.cancel()
        self.safety.failed(decision.target, now)
        self.events.add(now, "apply_failed", f"could not switch to {decision.target.label()}: {error}")

    def reset_load(self) -> None:
        """Forget the load history (e.g. after a calibration sweep, whose
        concurrency says nothing about the traffic to come)."""
        self.load = LoadTracker(self.settings.load)

    # ------------------------------------------------------------------ queries
    @property
    def measuring(self) -> bool:
        """Whether decisions among the settings the serving engine can switch
        to live are made by measurement (measured.py): enabled, and at least
        two candidates are live."""
        live = self._warm.live
        return (self.settings.measure.enabled and live is not None
                and sum(1 for c in self.settings.candidates if live(c)) >= 2)

    @property
    def active_engine(self) -> SpecConfig:
        """What the serving engine runs, its K schedule included."""
        return self._engine

    def active_config(self, batch: float | None = None) -> SpecConfig:
        """The per-step setting at ``batch`` running requests (default: the current load)."""
        return self._engine.at(self.load.current if batch is None else batch)

    def start_config(self) -> SpecConfig:
        """What to build the first engine with: the profile's last good setting
        if one was loaded, else ``settings.initial``."""
        return self._last_good

    def candidates(self, load: float | None = None) -> list[Prediction]:
        """Predictions for every candidate config at ``load`` (default: current)."""
        load = self.load.current if load is None else load
        self.estimator.refit()
        return [self.estimator.predict(c, load) for c in self.settings.candidates]

    def recommend(self, load: float) -> Plan:
        """The model's pick at ``load`` ignoring hysteresis, trust and budgets
        (used by the calibration sweep and tests)."""
        self.estimator.refit()
        now = self.clock()
        return pick(self.policy.plans(self.estimator, load, k_cap=self.safety.k_cap,
                                      banned=lambda c: self.safety.banned(c, now)))

    # ---------------------------------------------------------------- decide
    def decide(self, now: float | None = None) -> Decision:
        """Refit lazily and decide. Call every few seconds (e.g. 1-2 s)."""
        now = self.clock() if now is None else now
        st = self.settings
        est = self.estimator
        self.exploration.accrue(now)
        load = self.load.current
        self._notice_load_change(now)
        self._notice_acceptance_shift(now)

        if not st.enabled:
            return self._hold(now, load, Verdict.hold("disabled", "controller disabled by settings"))
        if self._pending is not None:
            if now - self._pending_since <= st.hysteresis.pending_timeout_s:
                return self._hold(now, load, Verdict.hold(
                    "pending", f"waiting for the engine to run {self._pending.target.label()}"))
            dropped, self._pending = self._pending, None
            if dropped.action == "explore":
                self.exploration.cancel()
            self.events.add(now, "pending_timeout", f"switch to {dropped.target.label()} not confirmed; dropped")

        active = est.plan(self._engine, load)
        fallback = (self.safety.check_collapse(est, active, now, load)
                    or self.safety.check_kv(self.load, est, active, now, load))
        if fallback is not None:
            self.exploration.cancel()
            return self._emit(now, load, fallback, active)

        def banned(c: SpecConfig) -> bool:
            return self.safety.banned(c, now)

        running = self.exploration.running(now)  # a probe on another engine runs its course
        for_the_model = banned
        if self.measuring and running is None:
            live = self._warm.live
            assert live is not None
            verdict = self.measured.judge(now, lambda c: banned(c) or not live(c))
            if verdict.action != "hold":
                return self._emit(now, load, verdict, self.measured.active_plan(now) or active)
            if verdict.code != "best" or all(live(c) for c in st.candidates):
                return self._hold(now, load, verdict, active)

            # Settled among the live settings; a setting that needs another
            # engine (another drafter, a larger K) is still the model's call.
            def for_the_model(c: SpecConfig) -> bool:
                return banned(c) or live(c)

        if not est.ready:
            return self._hold(now, load, Verdict.hold("no_data", "no measurements yet"))
        if running is not None:
            return self._hold(now, load, running)
        probe_note = self.exploration.finish(est, now, load)
        verdict = self.policy.judge(est, now, load, active, self.times, warm=self._warm, k_cap=self.safety.k_cap,
                                    banned=for_the_model, probe_note=probe_note)
        if verdict.may_explore:
            verdict = self.exploration.propose(est, now, load, active, verdict, self.times, warm=self._warm,
                                               k_cap=self.safety.k_cap, banned=for_the_model)
        if verdict.action == "hold":
            return self._hold(now, load, verdict, active)
        return self._emit(now, load, verdict, active)

    def _notice_load_change(self, now: float) -> None:
        change = self.load.detect_change(now)
        if change is not None:
            self.times.load_changed_at = now
            self.policy.streak.reset(now)
            self.events.add(now, "load_change", f"load {change.before:.1f} -> {change.after:.1f} running requests")

    def _notice_acceptance_shift(self, now: float) -> None:
        """Down-weight old acceptance data when the serving mode's recent
        acceptance moved: what shifted one drafter usually shifts the other."""
        if not self._engine.enabled:
            return
        acceptance, keep = self.estimator.acceptance, self.settings.acceptance
        mode = self._engine.mode
        shift = acceptance.detect_shift(mode)
        if shift is None:
            return
        other = PARALLEL if mode == AUTOREGRESSIVE else AUTOREGRESSIVE
        acceptance.forget(keep.shift_keep, modes=(mode,))
        acceptance.forget(keep.shift_keep_other, modes=(other,))
        # The measured TPOTs stay: each is scored at the pooled acceptance,
        # which the windows after the shift now set.
        self.measured.acceptance.forget(keep.shift_keep)
        self.estimator.invalidate()
        self.policy.streak.reset(now)
        self.events.add(now, "acceptance_shift",
                        f"{mode} position-1 acceptance {shift.recent_rate:.2f} recently vs "
                        f"{shift.long_rate:.2f} before; old acceptance data down-weighted")

    def _hold(self, now: float, load: float, verdict: Verdict, active: Plan | None = None) -> Decision:
        current = self._engine.at(load)
        tpot = active.prediction.tpot_s if active is not None else None
        d = Decision("hold", current, current, self._engine, 0.0, self.events.with_notes(verdict.reason),
                     verdict.code, now, load, tpot, tpot)
        self.decisions.add(d)
        return d

    def _emit(self, now: float, load: float, verdict: Verdict, active: Plan) -> Decision:
        plan = verdict.plan
        assert plan is not None, f"a {verdict.action} needs an engine to move to"
        d = Decision(verdict.action, active.config, plan.engine.at(load), plan.engine, verdict.gain,
                     self.events.with_notes(verdict.reason), verdict.code, now, load,
                     plan.prediction.tpot_s, active.prediction.tpot_s)
        self._pending = d
        self._pending_since = now
        self.times.decided_at = now
        self.policy.streak.reset(now)
        log.info("controller %s: %s", d.action, d.reason)
        self.decisions.add(d)
        return d

    # ------------------------------------------------------------ reporting
    def state(self, *, decisions: int = 16) -> ControllerState:
        """What the controller knows and did, for GetControllerState and logs."""
        now = self.clock()
        load = self.load.current
        est = self.estimator
        est.refit()
        step_fit = est.step.fit()
        probe = self.exploration.probe
        return ControllerState(
            enabled=self.settings.enabled,
            engine=self._engine,
            config=self._engine.at(load),
            load=LoadView(load, self.load.slow or load, self.load.kv_usage, self.load.waiting),
            candidates=self.settings.candidates,
            predictions=tuple(est.predict(c, load) for c in self.settings.candidates) if est.ready else (),
            decisions=tuple(self.decisions.last(decisions)),
            pending=self._pending,
            last_good=self._last_good,
            acceptance={m: self._acceptance_view(m) for m in SPEC_MODES},
            step_model=step_fit,
            ttft_model=est.ttft_fit() if step_fit is not None else None,
            slo_ttft_s=dict(self.settings.slo.ttft_s),
            rebuild=dataclasses.replace(self.rebuild),
            fallback=FallbackView(self.safety.k_cap, self.safety.speculation_blocked_for_s(now), self.safety.reason),
            exploration=ExplorationView(self.exploration.bank_s, self.exploration.share, self.exploration.spent_s,
                                        self.exploration.regret_s, self.exploration.probes,
                                        None if probe is None else dataclasses.replace(probe)),
            events=tuple(self.events),
            engine_rebuilds=self.engine_rebuilds,
            switches=self.switches,
            observations=self.observations,
            profile_path=self.profile_path,
            measuring=self.measuring,
            measured=tuple(MeasuredView(self.measured.table.load_of(lvl), c, self.measured.tpot(c, cell, lvl), len(cell.windows),
                                        now - cell.measured_at)
                           for (lvl, c), cell in sorted(self.measured.table.cells.items()) if cell.windows),
        )

    def _acceptance_view(self, mode: Mode) -> AcceptanceView:
        acc = self.estimator.acceptance
        pos = acc.positions(mode)
        return AcceptanceView(tuple(p.mean for p in pos), tuple(p.low for p in pos), tuple(p.high for p in pos),
                              tuple(acc.marginal(mode)), tuple(p.trials for p in pos))

    # ------------------------------------------------------------ profiles
    def profile_dict(self) -> dict:
        """Everything a restart needs: the last good setting and the models' data."""
        data = profile.encode(self._last_good, self.estimator, self.rebuild.to_dict(), self.clock())
        data["measured"] = self.measured.table.to_list(self.measured.tpot)
        return data

    def restore(self, data: dict) -> None:
        """Load a profile (raises ValueError if it is unusable; nothing changes then)."""
        start, estimator = profile.decode(data, self.settings)
        self.estimator = estimator
        self.rebuild.load_dict(data)
        measured = MeasuredPolicy(self.settings)
        measured.table.load_list(data.get("measured", []), self.clock())
        self.measured = measured
        self._engine = self._last_good = start
