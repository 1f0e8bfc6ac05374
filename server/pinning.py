"""PinSpeculation: an operator fixes the speculative config until releasing it.

While a pin holds, the controller (when on) makes no decisions and learns
nothing from the traffic, which ran in a config it did not choose; on release
it resumes from what the engine runs. Used by operators investigating a
regression and by `quickdraft bench phases --one-server`, which measures every
static config and the controller on one live engine.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.errors import RequestError
from quickdraft.server.speculative import SpecConfig

log = logging.getLogger("quickdraft.server")


class Pinnable(Protocol):
    """What a pin needs of the controller loop."""

    def pin(self, spec: SpecConfig | None) -> None: ...


class SpeculationPin:
    """The pin's state and its one operation, independent of any protocol."""

    def __init__(self, engines: EngineManager, controller: Callable[[], Pinnable | None] = lambda: None):
        self.engines = engines
        self.controller = controller
        self.pinned: SpecConfig | None = None

    async def set(self, config: str, allow_rebuild: bool = False) -> tuple[str, float]:
        """Pin ``config`` (a label; empty releases). Returns (how it was
        applied: "unchanged", "live", "rebuild" or "released"; milliseconds).
        RequestError: INVALID_ARGUMENT for a label that does not parse or that
        this server cannot run, FAILED_PRECONDITION when it needs another
        engine and ``allow_rebuild`` is false, UNAVAILABLE when no engine serves
        or the switch failed."""
        if not config.strip():
            self.pinned = None
            ctl = self.controller()
            if ctl is not None:
                ctl.pin(None)
            log.info("speculation pin released")
            return "released", 0.0
        try:
            spec = SpecConfig.parse(config)
        except ValueError as e:
            raise RequestError("INVALID_ARGUMENT", str(e), field="config") from None
        engine = self.engines.engine
        if engine is None or not self.engines.serving:
            raise RequestError("UNAVAILABLE", "no engine is serving yet; pin once the server is ready")
        cap = self.engines.cfg.speculation.max_k
        if self.engines.cfg.speculation.live_switching and spec.k > cap:
            raise RequestError("INVALID_ARGUMENT", f"{spec.label()} needs K={spec.k}, above speculation.max_k = {cap}",
                               field="config")
        if engine.spec == spec:
            how = "unchanged"
        elif self.engines.instant(spec):
            how = "live" if self.engines.live_can_serve(spec) else "standby"
        elif allow_rebuild:
            how = "rebuild"
        else:
            raise RequestError("FAILED_PRECONDITION", f"the serving engine ({engine.describe()}) cannot switch to "
                               f"{spec.label()} live; set allow_rebuild to build another engine", field="config")
        ctl = self.controller()
        if ctl is not None:
            ctl.pin(spec)  # before the switch: no controller tick may move it meanwhile
        t0 = time.perf_counter()
        if how != "unchanged" and not await self.engines.switch(spec, "pinned by an operator"):
            if ctl is not None:
                ctl.pin(None)
            raise RequestError("UNAVAILABLE", f"switching to {spec.label()} failed (see the server log); "
                               f"{self.engines.engine.spec.label() if self.engines.engine else 'nothing'} serves")
        self.pinned = spec
        ms = (time.perf_counter() - t0) * 1e3
        log.info("speculation pinned to %s (%s, %.1f ms)", spec.label(), how, ms)
        return how, ms
