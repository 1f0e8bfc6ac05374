"""``--one-server``: every config of a phases run on one live-switching server.

Each static config is pinned in turn (PinSpeculation, server/pinning.py),
then the pin is released and the controller chooses. No engine is built per
config, which on a GPU costs minutes each; the price is that a static runs on
a live engine (K up to speculation.max_k), not one built for it alone:
`quickdraft bench live-switch` measures that difference on the same machine.
Where the serving engine cannot switch live (another drafter head; "off" on a
plain engine on the CPU) the pin rebuilds, and that time is not load time.
"""

from __future__ import annotations

import time

from quickdraft.bench import servers
from quickdraft.bench.phases.run import Started, SubprocessLauncher
from quickdraft.bench.phases.timeline import PhasesSpec
from quickdraft.bench.sweep import SweepConfig

# The shared server runs the controller (held by the pin during statics) on live engines.
SHARED_OVERRIDES = {"controller.enabled": "true", "speculation.live_switching": "true"}


class SharedServerLauncher(SubprocessLauncher):
    """One ``quickdraft serve`` for all configs; ``launch`` pins a config (or releases for the controller)."""

    def __init__(self, spec: PhasesSpec, log_dir, profile_dir: str):
        super().__init__(spec, log_dir)
        self.profile_dir = profile_dir
        self.server: Started | None = None
        self.pins: list[dict] = []

    def create(self, conf: SweepConfig, overrides: dict[str, str]) -> Started:
        if self.server is None:
            s = servers.quickdraft_server("one-server", {**self.spec.overrides, **SHARED_OVERRIDES,
                                                         "controller.profile_dir": self.profile_dir}, self.log_dir, preset=self.spec.preset,
                                         config=self.spec.config)
            self.server = Started(argv=s.argv, log_path=str(s.log_path), address=f"127.0.0.1:{s.port}", obj=s)
        return Started(argv=self.server.argv, log_path=self.server.log_path, address=self.server.address, obj=conf)

    async def launch(self, h: Started) -> None:
        shared = self.server
        assert shared is not None
        t0 = time.perf_counter()
        if shared.start_s is None:
            await self.start_shared(shared)
        h.address = shared.address
        conf: SweepConfig = h.obj
        from quickdraft.client import AsyncCompletionClient

        async with AsyncCompletionClient(shared.address) as client:
            reply = await client.pin_speculation("" if conf.mode == "controller" else conf.label, allow_rebuild=True)
        self.pins.append({"config": conf.label, "applied": reply.applied, "switch_ms": round(reply.switch_ms, 2),
                          "running": reply.config.label})
        h.start_s = time.perf_counter() - t0

    async def start_shared(self, shared: Started) -> None:
        await SubprocessLauncher.launch(self, shared)

    async def stop(self, h: Started):
        return None  # the shared server serves the next config

    def close(self) -> int | None:
        """Stop the shared server; its exit code (None: it never started)."""
        if self.server is None or self.server.obj.proc is None:
            return None
        self.server.obj.stop()
        return self.server.obj.exit_code
