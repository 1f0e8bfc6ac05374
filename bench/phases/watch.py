"""What a server says while it is measured: its engine state and config
(every server alike) and, on the controller's server, its decisions."""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

from quickdraft.bench.phases.timeline import Phase


def spec_label(sc) -> str:
    """A ServerInfo/ControllerState SpeculativeConfig as a config label: off, p5, ar3 (``*``: a per-batch-size K schedule)."""
    if not sc.method:
        return "off"
    return f"{'p' if sc.parallel_drafting else 'ar'}{sc.num_speculative_tokens}" + ("*" if len(sc.per_batch_size) else "")


class ServerWatch:
    """Polls a server while it is measured: GetServerInfo every ``poll_s``
    (engine state, e.g. "switching", and the engine's speculative config), the
    same way for every config; on the controller's server also
    GetControllerState every ``state_every_s`` and at each phase boundary
    (engine rebuilds, decisions). Static servers are not asked for a
    controller state: they have none to give."""

    def __init__(self, address: str, origin: float, poll_s: float = 1.0, state_every_s: float = 10.0, controller: bool = True):
        self.address = address
        self.controller = controller
        self.origin = origin
        self.origin_unix = time.time() - (time.perf_counter() - origin)
        self.poll_s = poll_s
        self.state_every_s = state_every_s
        self.samples: list[list] = []  # [t sent, t answered, state, config]
        self.reads: list[dict] = []  # {"tag", "t", "enabled", "engine_rebuilds", "active"}
        self.decisions: dict[tuple, dict] = {}
        self.errors: list[str] = []
        self.live_switch_ms: list[float] = []  # the server's recent live switches, at the latest read
        self._client = None

    def t(self) -> float:
        return time.perf_counter() - self.origin

    async def open(self) -> None:
        from quickdraft.client.aio import AsyncCompletionClient

        self._client = AsyncCompletionClient(self.address)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _error(self, what: str, e: Exception) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{what} at {self.t():.1f} s: {type(e).__name__}: {str(e)[:200]}")

    async def sample(self) -> None:
        import grpc

        t0 = self.t()
        try:
            info = await self._client.server_info(timeout=5)
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            self._error("GetServerInfo", e)
            return
        self.samples.append([round(t0, 3), round(self.t(), 3), info.state, spec_label(info.speculative)])

    async def read_state(self, tag: str) -> None:
        import grpc

        if not self.controller:
            return
        t0 = self.t()
        try:
            st = await self._client.controller_state(timeout=10)
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            self._error(f"GetControllerState ({tag})", e)
            return
        self.reads.append({"tag": tag, "t": round(t0, 3), "enabled": st.enabled, "engine_rebuilds": st.engine_rebuilds, "active": spec_label(st.active)})
        self.live_switch_ms = [round(x, 3) for x in st.live_switch_ms]
        for d in st.decisions:
            key = (round(d.unix_time, 3), d.action, d.to_config)
            self.decisions.setdefault(key, {"t": round(d.unix_time - self.origin_unix, 3), "action": d.action, "from": d.from_config, "to": d.to_config, "reason": d.reason})

    async def run(self, stop: asyncio.Event) -> None:
        next_state = self.t() + self.state_every_s
        while not stop.is_set():
            await self.sample()
            if self.controller and self.t() >= next_state:
                await self.read_state("poll")
                next_state = self.t() + self.state_every_s
            try:
                await asyncio.wait_for(stop.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def at_boundaries(self, phases: Sequence[Phase]) -> None:
        """A GetControllerState read as each measured phase begins."""
        for p in phases:
            if not p.measured:
                continue
            await asyncio.sleep(max(0.0, p.start_s - self.t()))
            await self.read_state(f"phase {p.index} start")

    def to_dict(self) -> dict:
        return {
            "poll_s": self.poll_s,
            "state_every_s": self.state_every_s,
            "sample_columns": ["t_sent_s", "t_answered_s", "state", "config"],
            "samples": self.samples,
            "controller_reads": self.reads,
            "decisions": sorted(self.decisions.values(), key=lambda d: d["t"]),
            "errors": self.errors,
            "live_switch_ms": self.live_switch_ms,
        }
