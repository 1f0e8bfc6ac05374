"""What decide() returns, what the controller's parts propose, and the bounded
log of decisions."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator, Literal

from ..speculative import SpecConfig
from .estimator import Plan

Action = Literal["hold", "switch", "explore", "fallback"]


@dataclass(frozen=True)
class Decision:
    """One controller decision. For anything but "hold" the server should
    bring up an engine running ``engine`` and then call
    ``Controller.applied(decision)`` (or ``apply_failed``)."""

    action: Action
    """"hold": keep the engine; "switch": the model predicts a better config;
    "explore": a bounded probe of an uncertain config; "fallback": a safety
    move (KV pressure, acceptance collapse) that skipped hysteresis."""
    current: SpecConfig
    """Per-step setting in effect at the decision's load before this decision."""
    target: SpecConfig
    """Per-step setting the engine should run at the decision's load (mode and K)."""
    engine: SpecConfig
    """What the engine should run, its per-batch-size K schedule included
    (``SpecConfig.off()`` when speculation is off)."""
    predicted_gain: float
    """Predicted TPOT saving of target over current at the current load,
    as a fraction of the current TPOT (negative for fallbacks that cost speed)."""
    reason: str
    """Human-readable; log it and export it."""
    reason_code: str
    """Stable short code for metrics labels: "no_data", "best", "within_margin",
    "sustaining", "dwell", "pending", "probe_running", "probe_done", "probe_kept",
    "better", "explore", "kv_pressure", "acceptance_collapse", "slo", "disabled",
    "rebuild_cost"; measured.py's "measuring", "load_moving", "probe", "probe_abandoned", "back"."""
    timestamp: float
    """Controller clock (unix seconds by default)."""
    load: float = 1.0
    """Running requests the decision was made for."""
    predicted_tpot_s: float | None = None
    """Predicted TPOT of the target at ``load``."""
    current_tpot_s: float | None = None
    """Predicted TPOT of the current config at ``load``."""


@dataclass(frozen=True)
class Verdict:
    """What one part of the controller (policy, exploration, safety) proposes;
    the controller turns it into a :class:`Decision`."""

    action: Action
    code: str
    """The decision's ``reason_code``."""
    reason: str
    plan: Plan | None = None
    """The engine to move to (None for a hold)."""
    gain: float = 0.0
    """Predicted TPOT saving of ``plan`` over the active engine, a fraction."""
    may_explore: bool = False
    """A hold after which a probe may be worth it."""

    @classmethod
    def hold(cls, code: str, reason: str, *, may_explore: bool = False) -> "Verdict":
        return cls("hold", code, reason, may_explore=may_explore)


def relative_gain(current_s: float | None, new_s: float | None) -> float:
    """TPOT saved by ``new_s`` over ``current_s``, as a fraction of ``current_s``
    (0 when either is unknown)."""
    if not current_s or new_s is None:
        return 0.0
    return (current_s - new_s) / current_s


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds for a reason text ("?" when unknown)."""
    return "?" if seconds is None else f"{seconds * 1e3:.2f} ms"


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

    @property
    def size(self) -> int:
        """Most decisions kept."""
        return self._items.maxlen or 0

    def add(self, d: Decision) -> None:
        if d.action == "hold" and self._items:
            last = self._items[-1]
            fam = _HOLD_FAMILY.get(d.reason_code, d.reason_code)
            if last.action == "hold" and _HOLD_FAMILY.get(last.reason_code, last.reason_code) == fam:
                return
        self._items.append(d)

    def __iter__(self) -> Iterator[Decision]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def last(self, n: int | None = None) -> list[Decision]:
        items = list(self._items)
        return items if n is None else items[-n:]
