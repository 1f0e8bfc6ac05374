"""Bounded probes of configs the model is unsure about, paid from a time
budget that accrues as a share of the time served and shrinks with every probe."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..config.controller import ControllerSettings
from ..speculative import SpecConfig
from .decision import Verdict, ms, relative_gain
from .estimator import Estimator, Plan
from .events import EventLog
from .observation import Observation
from .policy import Banned, SwitchTimes, Warm, trusted


@dataclass
class Probe:
    engine: SpecConfig
    incumbent_tpot_s: float | None
    """Predicted TPOT of the engine the probe replaced, for its regret."""
    started_at: float | None = None
    """None until the server applied it."""
    requests: int = 0
    regret_s: float = 0.0
    """Seconds the probe's requests took beyond the incumbent's prediction."""


class Exploration:
    def __init__(self, settings: ControllerSettings, events: EventLog, now: float) -> None:
        ex = settings.exploration
        self.settings = settings
        self.events = events
        self.probe: Probe | None = None
        self.bank_s = ex.initial_allowance_s
        """Seconds of probing affordable now."""
        self.share = ex.max_share
        """Share of the time served that accrues to the bank."""
        self.spent_s = 0.0
        self.regret_s = 0.0
        self.probes = 0
        self._accrued_at = now

    # -- inputs ---------------------------------------------------------------
    def accrue(self, now: float) -> None:
        dt = max(0.0, now - self._accrued_at)
        self._accrued_at = max(self._accrued_at, now)
        self.bank_s = min(self.settings.exploration.bank_cap_s, self.bank_s + self.share * dt)

    def observe(self, obs: Observation) -> None:
        """A finished request: counts for the running probe if it ran there."""
        p = self.probe
        if p is None or p.started_at is None or obs.config != p.engine:
            return
        p.requests += 1
        if p.incumbent_tpot_s is not None and obs.output_tokens > 1:
            p.regret_s += max(0.0, obs.tpot_s - p.incumbent_tpot_s) * (obs.output_tokens - 1)

    def started(self, now: float) -> None:
        """The server now runs the probe."""
        if self.probe is not None:
            self.probe.started_at = now

    def cancel(self) -> None:
        self.probe = None

    # -- a running probe ----------------------------------------------------------
    def running(self, now: float) -> Verdict | None:
        """A hold while the running probe has too few requests or seconds."""
        p = self.probe
        if p is None or p.started_at is None:
            return None
        ex = self.settings.exploration
        elapsed = now - p.started_at
        if (p.requests >= ex.min_requests and elapsed >= ex.min_s) or elapsed >= ex.max_s:
            return None
        return Verdict.hold("probe_running", f"probing {p.engine.label()}: {p.requests}/{ex.min_requests} "
                                             f"requests, {elapsed:.0f} s")

    def finish(self, estimator: Estimator, now: float, load: float) -> str | None:
        """End a probe that ran long enough; its summary (None: none ended)."""
        p = self.probe
        if p is None or p.started_at is None:
            return None
        elapsed = now - p.started_at
        self.bank_s -= elapsed
        self.spent_s += elapsed
        self.regret_s += p.regret_s
        measured = estimator.predict(p.engine, load)
        summary = (f"probe of {p.engine.label()} done after {p.requests} requests "
                   f"(model now {ms(measured.tpot_s)})")
        self.events.add(now, "probe_done", summary, note=False)
        self.probe = None
        return summary

    # -- a new probe ------------------------------------------------------------
    def propose(self, estimator: Estimator, now: float, load: float, active: Plan, hold: Verdict, times: SwitchTimes,
                *, warm: Warm, k_cap: int | None, banned: Banned) -> Verdict:
        """A probe if one is worth it and affordable, else ``hold``: the
        candidate whose optimistic TPOT (acceptance at the top of its band,
        less an optimism bonus that shrinks with its samples) beats the active
        engine by the hysteresis margin, among those not measured near this load."""
        st = self.settings
        ex = st.exploration
        a_tpot = active.prediction.tpot_s
        if (not ex.enabled or k_cap is not None or self.probe is not None
                or now - times.switched_at < st.hysteresis.min_dwell_s
                or now - times.load_changed_at < ex.stable_load_s
                or a_tpot is None or self.bank_s < ex.min_s):
            return hold
        best_cfg, best_opt, best_pred = None, None, None
        for cfg in st.candidates:
            if cfg == active.config or banned(cfg):
                continue
            pred = estimator.predict(cfg, load)
            if pred.tpot_optimistic_s is None or not pred.feasible:
                continue
            if trusted(st, estimator, cfg.mode) and pred.samples >= ex.min_samples_near_load:
                continue  # measured near this load already: the model's word stands
            opt = pred.tpot_optimistic_s * (1.0 - ex.optimism / math.sqrt(1.0 + pred.samples))
            if opt < a_tpot * (1.0 - st.hysteresis.margin) and (best_opt is None or opt < best_opt):
                best_cfg, best_opt, best_pred = cfg, opt, pred
        if best_cfg is None or best_pred is None:
            return hold
        instant = best_cfg in warm  # a live switch or a standby engine: no build to pay for
        cost = 0.0 if instant else 2 * ex.rebuild_cost_s  # there and back
        if self.bank_s < cost + ex.min_s:
            return hold
        if not instant and load > ex.max_load_for_build:
            # every running stream would pay for the build
            return Verdict.hold(hold.code, f"{hold.reason}; a probe of {best_cfg.label()} waits for at most "
                                           f"{ex.max_load_for_build:g} running requests (it needs a new engine)")
        self.probe = Probe(best_cfg, a_tpot)
        self.bank_s -= cost
        self.spent_s += cost
        self.probes += 1
        self.share = max(ex.min_share, self.share * ex.share_decay)
        return Verdict("explore", "explore",
                       f"probing {best_cfg.label()}: {best_pred.samples:.0f} requests near load {load:.1f}, "
                       f"optimistic TPOT {ms(best_opt)} vs {ms(a_tpot)} now (model {ms(best_pred.tpot_s)}); "
                       f"exploration budget {self.bank_s:.0f} s left",
                       Plan(best_cfg, best_pred), relative_gain(a_tpot, best_pred.tpot_s))
