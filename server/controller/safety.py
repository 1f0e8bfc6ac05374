"""Moves that skip the hysteresis: a lower K under KV-cache pressure,
speculation off when acceptance collapses, and a cool-down for a config whose
engine failed to start."""

from __future__ import annotations

import math

from ..config.controller import ControllerSettings
from ..speculative import SpecConfig
from .decision import Verdict, relative_gain
from .estimator import Estimator, Plan
from .events import EventLog
from .load import LoadTracker


class Safety:
    def __init__(self, settings: ControllerSettings, events: EventLog) -> None:
        self.settings = settings
        self.events = events
        self.k_cap: int | None = None
        """Largest K allowed while the KV cache is under pressure (None: no cap)."""
        self.reason = ""
        """Why the last fallback was made."""
        self._speculation_blocked_until = -math.inf
        self._failed_until: dict[SpecConfig, float] = {}
        self._pressure_at = -math.inf
        self._kv_low_since: float | None = None
        self._release_wait_s = settings.fallback.kv_release_s
        self._released_at = -math.inf
        self._preemptions = 0

    # -- inputs ---------------------------------------------------------------
    def observe_preemptions(self, count: int) -> None:
        self._preemptions += count

    def failed(self, config: SpecConfig, now: float) -> None:
        """An engine for ``config`` failed to start: leave it alone for a while."""
        self._failed_until[config] = now + self.settings.hysteresis.failed_config_cooldown_s

    # -- queries --------------------------------------------------------------
    def banned(self, config: SpecConfig, now: float) -> bool:
        """Whether ``config`` may not be chosen now."""
        if config.enabled and now < self._speculation_blocked_until:
            return True
        if self.k_cap is not None and config.k > self.k_cap:
            return True
        return self._failed_until.get(config, -math.inf) > now

    def speculation_blocked_for_s(self, now: float) -> float:
        return max(0.0, self._speculation_blocked_until - now)

    # -- checks ---------------------------------------------------------------
    def check_collapse(self, estimator: Estimator, active: Plan, now: float, load: float) -> Verdict | None:
        """Speculation off when the active mode's recent acceptance collapsed."""
        fb = self.settings.fallback
        mode = active.mode
        if not active.engine.enabled:
            return None
        length, drafts, reqs = estimator.acceptance.recent_acceptance_length(mode)
        if drafts < fb.collapse_min_drafts or reqs < fb.collapse_min_requests or length >= fb.collapse_acceptance_length:
            return None
        self._speculation_blocked_until = now + fb.collapse_cooldown_s
        self.reason = (
            f"acceptance collapsed: {mode} mean accepted length {length:.2f} tokens/step over {drafts} "
            f"drafts in {reqs} requests (threshold {fb.collapse_acceptance_length:.2f}); speculation off "
            f"for {fb.collapse_cooldown_s:.0f} s")
        estimator.acceptance.clear_recent()  # judge any retry on fresh data only
        self.k_cap = None
        off = estimator.plan(SpecConfig.off(), load)
        gain = relative_gain(active.prediction.tpot_s, off.prediction.tpot_s)
        return Verdict("fallback", "acceptance_collapse", self.reason, off, gain)

    def check_kv(self, tracker: LoadTracker, estimator: Estimator, active: Plan, now: float,
                 load: float) -> Verdict | None:
        """One candidate K lower under KV-cache pressure (or preemptions), at
        most every ``pressure_min_interval_s`` unless critical; the cap is
        lifted once the cache stayed low for a while."""
        fb = self.settings.fallback
        if not tracker.snapshots_fresh(now):
            return None
        kv = tracker.kv_usage
        preempted, self._preemptions = self._preemptions, 0
        if kv < fb.kv_low:
            self._maybe_release(now)
            return None
        self._kv_low_since = None
        if kv < fb.kv_high and not preempted:
            return None
        engine = active.engine
        k_now = engine.k_for(load)
        if k_now <= 0:
            return None
        if now - self._pressure_at < fb.pressure_min_interval_s and kv < fb.kv_critical:
            return None
        lower = [c.k for c in self.settings.candidates if c.enabled and c.parallel == engine.parallel and c.k < k_now]
        new_cap = max(lower) if lower else 0
        if now - self._released_at < 4 * fb.kv_release_s:
            # pressure came back soon after the last release: wait longer next time
            self._release_wait_s = min(self._release_wait_s * 2, 16 * fb.kv_release_s)
        elif self.k_cap is None:
            self._release_wait_s = fb.kv_release_s
        self.k_cap = new_cap if self.k_cap is None else min(self.k_cap, new_cap)
        self._pressure_at = now
        plan = estimator.plan(engine.capped(new_cap), load)
        what = f"KV cache {kv:.0%}" + (f", {preempted} preemptions" if preempted else "")
        self.reason = (f"{what} (limit {fb.kv_high:.0%}): reducing K {k_now} -> {new_cap}"
                       + (" (speculation off)" if new_cap == 0 else ""))
        gain = relative_gain(active.prediction.tpot_s, plan.prediction.tpot_s)
        return Verdict("fallback", "kv_pressure", self.reason, plan, gain)

    def _maybe_release(self, now: float) -> None:
        """Lift the cap in one go (stepping up would rebuild once per step)."""
        fb = self.settings.fallback
        if self._kv_low_since is None:
            self._kv_low_since = now
        if self.k_cap is not None and now - self._kv_low_since >= self._release_wait_s:
            old, self.k_cap = self.k_cap, None
            self._released_at = now
            self.events.add(now, "kv_release", f"KV cache below {fb.kv_low:.0%} for "
                            f"{self._release_wait_s:.0f} s: K cap {old} lifted")
