"""What decide() returns, and the bounded log of them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from .spec import KSchedule, SpecConfig, engine_speculative_config

Action = Literal["hold", "switch", "explore", "fallback"]


@dataclass(frozen=True)
class Decision:
    """One controller decision. For anything but "hold" the server should
    bring up an engine running ``target``/``schedule`` and then call
    ``Controller.applied(decision)`` (or ``apply_failed``)."""

    action: Action
    """"hold": keep the engine; "switch": the model predicts a better config;
    "explore": a bounded probe of an uncertain config; "fallback": a safety
    move (KV pressure, acceptance collapse) that skipped hysteresis."""
    current: SpecConfig
    """Config in effect at the current load before this decision."""
    target: SpecConfig
    """Config the engine should run at the current load (mode + K)."""
    schedule: KSchedule | None
    """Per-batch-size K for the target's engine; None when speculation is off."""
    predicted_gain: float
    """Predicted TPOT saving of target over current at the current load,
    as a fraction of the current TPOT (negative for fallbacks that cost speed)."""
    reason: str
    """Human-readable; log it and export it."""
    reason_code: str
    """Stable short code for metrics labels: "no_data", "best", "within_margin",
    "sustaining", "dwell", "pending", "probe_running", "probe_done", "probe_kept",
    "better", "explore", "kv_pressure", "acceptance_collapse", "slo", "disabled",
    "cooldown", "rebuild_cost"."""
    timestamp: float
    """Controller clock (unix seconds by default)."""
    load: float = 1.0
    """Running requests the decision was made for."""
    predicted_tpot_s: float | None = None
    """Predicted TPOT of the target at ``load``."""
    current_tpot_s: float | None = None
    """Predicted TPOT of the current config at ``load``."""

    @property
    def requires_change(self) -> bool:
        return self.action != "hold"

    def speculative_config(self, *, drafter: str, method: str = "eagle3") -> dict | None:
        """vLLM ``speculative_config`` for the target engine (None: no speculation).
        Pick ``drafter`` by mode: parallel needs a P-EAGLE head."""
        return engine_speculative_config(self.target, self.schedule, drafter=drafter, method=method)

    def to_dict(self) -> dict:
        """Plain data; keys follow the proto's ControllerDecision, plus extras."""
        return {
            "unix_time": self.timestamp,
            "action": self.action,
            "from_config": self.current.label(),
            "to_config": self.schedule.label() if self.schedule is not None else self.target.label(),
            "reason": self.reason,
            "reason_code": self.reason_code,
            "predicted_gain": round(self.predicted_gain, 4),
            "load": round(self.load, 3),
            "predicted_tpot_ms": None if self.predicted_tpot_s is None else round(self.predicted_tpot_s * 1e3, 4),
            "current_tpot_ms": None if self.current_tpot_s is None else round(self.current_tpot_s * 1e3, 4),
        }


# hold reasons that mean the same thing for the history: steady, waiting, building up
_HOLD_FAMILY = {
    "best": "steady", "within_margin": "steady", "probe_kept": "steady", "rebuild_cost": "steady",
    "pending": "waiting", "probe_running": "waiting",
    "sustaining": "building", "dwell": "building",
}


class DecisionLog:
    """Bounded history. Every non-hold decision is kept; a hold only when its
    kind differs from the previous kept decision's (so a steady state does not
    push the interesting entries out)."""

    def __init__(self, size: int) -> None:
        self._items: deque[Decision] = deque(maxlen=size)

    def add(self, d: Decision) -> None:
        if d.action == "hold" and self._items:
            last = self._items[-1]
            fam = _HOLD_FAMILY.get(d.reason_code, d.reason_code)
            if last.action == "hold" and _HOLD_FAMILY.get(last.reason_code, last.reason_code) == fam:
                return
        self._items.append(d)

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def last(self, n: int | None = None) -> list[Decision]:
        items = list(self._items)
        return items if n is None else items[-n:]
