"""Things the controller noticed (a load change, an acceptance shift, a lifted
K cap), kept for its state and mentioned in the next decision's reason."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Iterator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    at: float
    """Controller clock (unix seconds by default)."""
    kind: str
    """"load_change", "acceptance_shift", "kv_release", "probe_done",
    "pending_timeout" or "apply_failed"."""
    detail: str


class EventLog:
    def __init__(self, size: int = 32) -> None:
        self._items: deque[Event] = deque(maxlen=size)
        self._notes: list[str] = []

    def add(self, now: float, kind: str, detail: str, *, note: bool = True) -> None:
        """Record an event; with ``note`` its detail also starts the next
        decision's reason, so the decision log says why."""
        self._items.append(Event(now, kind, detail))
        if note:
            self._notes.append(detail)
        log.info("controller %s: %s", kind, detail)

    def with_notes(self, reason: str) -> str:
        """``reason`` after the details noted since the last call."""
        if not self._notes:
            return reason
        notes, self._notes = self._notes, []
        return "; ".join(notes) + "; " + reason

    def __iter__(self) -> Iterator[Event]:
        return iter(self._items)
