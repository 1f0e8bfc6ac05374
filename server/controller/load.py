"""Load level (running requests) and memory pressure, tracked over time."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config.controller import LoadSettings
from .observation import EngineSnapshot


@dataclass(frozen=True)
class LoadChange:
    """A load regime change: the fast estimate left the slow one's band."""

    at: float
    before: float
    after: float


class LoadTracker:
    def __init__(self, settings: LoadSettings) -> None:
        self.s = settings
        self.fast: float | None = None
        self.slow: float | None = None
        self._t: float | None = None
        self.last_snapshot_at: float | None = None
        self.kv_usage: float = 0.0
        self.waiting: int = 0
        self.last_change: LoadChange | None = None

    def _update(self, value: float, now: float) -> None:
        value = max(1.0, float(value))  # a step always has at least one request
        if self.fast is None or self._t is None:
            self.fast = self.slow = value
            self._t = now
            return
        dt = max(0.0, now - self._t)
        self._t = max(self._t, now)
        # time-based EWMAs; dt=0 (same instant) still moves a little so bursts
        # of request observations count
        af = 1.0 - math.exp(-max(dt, 0.05) / self.s.fast_tau_s)
        asl = 1.0 - math.exp(-max(dt, 0.05) / self.s.slow_tau_s)
        self.fast += af * (value - self.fast)
        self.slow += asl * (value - self.slow)

    def observe_snapshot(self, snap: EngineSnapshot, now: float) -> None:
        self.last_snapshot_at = now
        self.kv_usage = snap.kv_cache_usage
        self.waiting = snap.waiting
        self._update(snap.running, now)

    def observe_request(self, batch_size: float, now: float) -> None:
        # requests' batch sizes only drive the estimate while snapshots are stale
        if self.last_snapshot_at is not None and now - self.last_snapshot_at <= self.s.snapshot_stale_s:
            return
        self._update(batch_size, now)

    @property
    def current(self) -> float:
        return self.fast if self.fast is not None else 1.0

    def snapshots_fresh(self, now: float) -> bool:
        return self.last_snapshot_at is not None and now - self.last_snapshot_at <= self.s.snapshot_stale_s

    def detect_change(self, now: float) -> LoadChange | None:
        """Report a regime change once; the slow reference then jumps to the new level."""
        if self.fast is None or self.slow is None:
            return None
        if abs(math.log(self.fast / self.slow)) > math.log(self.s.regime_ratio):
            ch = LoadChange(now, self.slow, self.fast)
            self.slow = self.fast
            self.last_change = ch
            return ch
        return None
