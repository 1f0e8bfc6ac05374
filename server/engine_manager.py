"""The serving engine's life: start, switch to another speculative config,
restart after a crash, drain on shutdown. Requests never see a half-built engine.

Switching: a live engine (server/vllm_live.py) changes K, the K schedule and
the drafting mode between two engine steps, in-flight requests included.
What it cannot run (another drafter, K above its maximum, or speculation off
on a plain engine where ``speculation.off_engine = "plain"``) needs another
engine: it is built while the old one keeps serving, new requests go to it
once it is ready, and the old one finishes its in-flight streams and is shut
down. Where both would not fit (a GPU whose engine takes more than half its
memory) the old one drains first and the switch is an outage.

Warm standby (``controller.standby_engines`` > 0): the engine switched away
from is kept, idle, instead of being shut down, and ``prewarm`` builds one
for a config not serving yet. A switch to a standby engine is instant. When
more are kept than allowed the oldest goes first, the prewarmed one last. A
prewarm cancelled at shutdown leaves its engine to vLLM's own cleanup at
process exit (the build runs in a thread that cannot be interrupted).

Crash loops: an engine that dies twice in a row soon after its start is not
restarted with the same config a third time (vLLM 0.32's CPU build crashes
on some speculative configs only once the batch grows, see docs/vllm-notes.md);
the restart falls back to the configured static config, or to speculation off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.engine import Engine, EngineError
from quickdraft.server.errors import RequestError
from quickdraft.server.speculative import SpecConfig

log = logging.getLogger("quickdraft.engine")

STARTING, SERVING, SWITCHING, RESTARTING, DRAINING, STOPPED, FAILED = (
    "starting", "serving", "switching", "restarting", "draining", "stopped", "failed",
)


@dataclass
class ManagerStats:
    rebuilds: int = 0
    restarts: int = 0
    last_recovery_s: float | None = None
    last_switch_s: float | None = None
    instant_switches: int = 0
    """Switches served by a warm standby engine (no rebuild)."""
    live_switches: int = 0
    """Switches made inside the serving engine (server/vllm_live.py)."""
    live_switch_ms: deque = field(default_factory=lambda: deque(maxlen=1000))
    """Engine-core round trip of the recent live switches, milliseconds."""
    failed_switches: int = 0
    fallbacks: int = 0
    """Restarts that changed config because the old one kept crashing."""
    history: list[dict] = field(default_factory=list)


TWO_ENGINES_FIT_BELOW = 0.9
"""Sum of two engines' gpu_memory_utilization that leaves room for both CUDA contexts."""
DRAIN_BEFORE_REBUILD_S = 60.0
"""Where the old engine must go before a new one starts: how long its streams may finish first."""

CRASH_LOOP_WINDOW_S = 300.0
"""An engine that dies within this long of its start counts towards a crash loop."""
RESTART_BACKOFF_S = (2.0, 4.0, 8.0)
"""Pause after each failed restart attempt; after the last, the manager gives
up (FAILED) and `quickdraft serve` exits 1 for its supervisor to restart it."""


def fallback_spec(crashed: SpecConfig, configured: SpecConfig) -> SpecConfig:
    """What to restart with after `crashed` died twice in a row: the
    configured static config if it differs, else the same without its
    per-batch-size schedule, else speculation off."""
    if configured != crashed:
        return configured
    if crashed.per_batch_size:
        return SpecConfig(crashed.parallel, crashed.k)
    return SpecConfig.off()


class EngineManager:
    def __init__(self, cfg: QuickdraftConfig, on_state: Callable[[str], None] = lambda s: None, engine_factory=Engine.start):
        self.cfg = cfg
        self.engine: Engine | None = None
        self.state = STARTING
        self.stats = ManagerStats()
        self._on_state = on_state
        self._factory = engine_factory
        self._in_flight: dict[int, int] = {}
        self._idle: dict[int, asyncio.Event] = {}
        self._lock = asyncio.Lock()
        self._watch_task: asyncio.Task | None = None
        self._quick_deaths = 0
        self.on_engine_change: list[Callable[[Engine], None]] = []
        self.standby: dict[SpecConfig, Engine] = {}  # oldest first
        self._prewarming: set[SpecConfig] = set()
        self._prewarmed: SpecConfig | None = None  # evicted last: it was built for a load not seen yet
        self._contended_until = 0.0  # time.monotonic() when the serving engine last stopped sharing the machine
        self._stopping = 0  # engines being shut down

    @property
    def building(self) -> bool:
        """An engine is being built beside the serving one (a switch or a
        prewarm); on a small machine it takes the serving engine's CPU."""
        return self.state == SWITCHING or bool(self._prewarming)

    @property
    def contended(self) -> bool:
        """The serving engine shares the machine with another one: a build
        beside it, an engine switched away from that still finishes its
        streams, or one being shut down."""
        serving = id(self.engine) if self.engine is not None else None
        return self.building or self._stopping > 0 or any(n > 0 for key, n in self._in_flight.items() if key != serving)

    def contended_since(self, t: float) -> bool:
        """Whether the serving engine shared the machine at any time since
        ``t`` (``time.monotonic()``): a request that ran then measured the
        other engine's load as much as its own config."""
        return self.contended or t <= self._contended_until

    def _contention_over(self) -> None:
        if not self.contended:
            self._contended_until = time.monotonic()

    @property
    def standby_capacity(self) -> int:
        """Standby engines kept warm; none where a second engine does not fit."""
        return 0 if self.needs_drain_for_rebuild() else self.cfg.controller.standby_engines

    def _set(self, state: str) -> None:
        if state != self.state:
            log.info("engine state: %s -> %s", self.state, state)
            if self.state == SWITCHING:
                self._contended_until = time.monotonic()  # the build beside the serving engine is over
            self.state = state
            self._on_state(state)

    @property
    def serving(self) -> bool:
        return self.state in (SERVING, SWITCHING) and self.engine is not None and not self.engine.dead

    def live_for(self, spec: SpecConfig) -> bool:
        """Whether a new engine for ``spec`` is built live (switchable)."""
        return self.cfg.speculation.live_switching and (spec.enabled or self.off_stays_live())

    def off_stays_live(self) -> bool:
        """Speculation off as K=0 on a live engine, rather than on a plain one.
        A K=0 step still runs the drafter's first pass (to keep its KV cache
        valid), which costs 1.4-1.7x a plain engine's step on the CPU build; on
        a GPU that cannot hold a second engine, K=0 is the only instant "off"."""
        mode = self.cfg.speculation.off_engine
        if mode == "auto":
            return self.needs_drain_for_rebuild()
        return mode == "live"

    async def _build(self, spec: SpecConfig) -> Engine:
        return await self._factory(self.cfg, spec, self.live_for(spec))

    async def start(self, spec: SpecConfig) -> Engine:
        self._set(STARTING)
        try:
            self.engine = await self._build(spec)
        except Exception:
            self._set(FAILED)
            raise
        self._notify()
        self._set(SERVING)
        self._watch_task = asyncio.create_task(self._watch(), name="engine-watch")
        return self.engine

    def _notify(self) -> None:
        for cb in self.on_engine_change:
            cb(self.engine)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[Engine]:
        """The engine a new request runs on, held until the request ends."""
        engine = self.engine
        if engine is None or not self.serving:
            # A dead engine is reported as restarting even before _watch notices it.
            state = RESTARTING if engine is not None and engine.dead and self.state == SERVING else self.state
            raise RequestError("UNAVAILABLE", f"engine is {state}; retry shortly")
        key = id(engine)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._idle.setdefault(key, asyncio.Event()).clear()
        try:
            yield engine
        finally:
            # Absent when _retire stopped the engine after its drain timeout
            # with this stream still on it: nothing is left to count down.
            if key in self._in_flight:
                self._in_flight[key] -= 1
                if self._in_flight[key] == 0:
                    self._idle[key].set()
                    if self.engine is None or key != id(self.engine):
                        self._contention_over()  # a retired engine's last stream

    @property
    def stopping(self) -> int:
        """Engines being shut down now (retired, or a standby no longer wanted)."""
        return self._stopping

    def in_flight(self, engine: Engine | None = None) -> int:
        engine = engine or self.engine
        return self._in_flight.get(id(engine), 0) if engine else 0

    async def _wait_idle(self, engine: Engine, timeout: float) -> bool:
        if self.in_flight(engine) == 0:
            return True
        try:
            await asyncio.wait_for(self._idle[id(engine)].wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def needs_drain_for_rebuild(self) -> bool:
        """A second engine beside the serving one would not fit: on a GPU each
        engine reserves ``engine.gpu_memory_utilization`` of the memory and
        vLLM refuses to start when less than that is free, so two fit only
        below half, less the CUDA context each process holds."""
        return self.cfg.device() != "cpu" and 2 * self.cfg.engine.gpu_memory_utilization > TWO_ENGINES_FIT_BELOW

    async def switch(self, spec: SpecConfig, reason: str = "", drain_first: bool | None = None, drain_timeout: float | None = None) -> bool:
        """Serve `spec` from now on: live inside the serving engine when it can,
        else on a standby or new engine. False (and the old engine keeps
        serving) if a new one fails to start. ``drain_timeout``: how long the
        old engine's streams may run on (default: ``DRAIN_BEFORE_REBUILD_S``
        when it must go first, else ``server.retire_timeout_s``)."""
        if drain_first is None:
            drain_first = self.needs_drain_for_rebuild()
        if drain_timeout is None:
            drain_timeout = DRAIN_BEFORE_REBUILD_S if drain_first else self.cfg.server.retire_timeout_s
        async with self._lock:
            old = self.engine
            if old is not None and old.spec == spec:
                return True
            if old is not None and self._live_can_serve(old, spec):
                return await self._switch_live(old, spec, reason)
            t0 = time.monotonic()
            log.info("switching engine to %s (%s)", spec.label(), reason or "requested")
            self._set(SWITCHING)
            warm = self._take_standby(spec)
            if warm is not None and warm.dead:
                asyncio.create_task(self._retire(warm, 0.0), name="engine-retire")
                warm = None
            if warm is not None:
                drain_first = False  # both are in memory already
            elif drain_first and old is not None:
                self._set(DRAINING)
                await self._wait_idle(old, drain_timeout)
                old.shutdown()
                self.engine = None
            try:
                if warm is not None and warm.spec != spec:
                    await warm.switch(spec)
                new = warm if warm is not None else await self._build(spec)
            except Exception as e:  # noqa: BLE001
                self.stats.failed_switches += 1
                log.error("engine for %s failed to start: %s; keeping %s", spec.label(), e, old.spec.label() if old else "none")
                if drain_first or old is None:
                    # Nothing left serving: bring back what we had.
                    self.engine = await self._build(old.spec) if old else None
                self._set(SERVING if self.engine else FAILED)
                return False
            self.engine = new
            self._notify()
            if warm is not None:
                self.stats.instant_switches += 1
            else:
                self.stats.rebuilds += 1
            self.stats.last_switch_s = time.monotonic() - t0
            self.stats.history.append({"time": time.time(), "from": old.spec.label() if old else None, "to": spec.label(), "reason": reason,
                                       "seconds": round(self.stats.last_switch_s, 2), "standby": warm is not None})
            self._set(SERVING)
        if old is not None and not drain_first:
            if self.standby_capacity > 0 and not old.dead:
                # Kept warm: it finishes its in-flight streams and waits for a switch back.
                self._keep(old, drain_timeout)
            else:
                # The old engine finishes what it started, then goes.
                asyncio.create_task(self._retire(old, drain_timeout), name="engine-retire")
        return True

    def _live_can_serve(self, engine: Engine, spec: SpecConfig) -> bool:
        # Speculation off stays on a live engine (K=0) only where that is the
        # configured way to run "off"; otherwise it gets a plain engine.
        return engine.live and engine.can_switch_to(spec) and (spec.enabled or self.off_stays_live())

    def live_can_serve(self, spec: SpecConfig) -> bool:
        """Whether the serving engine can switch to ``spec`` between two steps."""
        engine = self.engine
        return engine is not None and (engine.spec == spec or self._live_can_serve(engine, spec))

    def instant(self, spec: SpecConfig) -> bool:
        """Whether a switch to ``spec`` needs no new engine: live, or a standby one."""
        return self.live_can_serve(spec) or spec in self.standby or any(
            self._live_can_serve(e, spec) for e in self.standby.values())

    def _take_standby(self, spec: SpecConfig) -> Engine | None:
        """A standby engine that runs ``spec`` as it is, else one that can switch to it live."""
        key = spec if spec in self.standby else next((k for k, e in self.standby.items() if self._live_can_serve(e, spec)), None)
        if key is None:
            return None
        if key == self._prewarmed:
            self._prewarmed = None
        return self.standby.pop(key)

    async def _switch_live(self, engine: Engine, spec: SpecConfig, reason: str) -> bool:
        before = engine.spec
        try:
            seconds = await engine.switch(spec)
        except Exception as e:  # noqa: BLE001 - a failed switch leaves the engine as it was
            self.stats.failed_switches += 1
            log.error("live switch to %s failed: %s; keeping %s", spec.label(), e, before.label())
            return False
        self.stats.live_switches += 1
        self.stats.live_switch_ms.append(seconds * 1e3)
        self.stats.last_switch_s = seconds
        self.stats.history.append({"time": time.time(), "from": before.label(), "to": spec.label(), "reason": reason,
                                   "seconds": round(seconds, 4), "live": True})
        log.info("live switch %s -> %s in %.1f ms (%s)", before.label(), spec.label(), seconds * 1e3, reason or "requested")
        self._notify()
        return True

    def _keep(self, engine: Engine, drain_timeout: float) -> None:
        self.standby.pop(engine.spec, None)
        self.standby[engine.spec] = engine
        while len(self.standby) > self.standby_capacity:
            # The oldest goes first; the prewarmed engine only when nothing else is left.
            victim = next((m for m in self.standby if m != self._prewarmed), next(iter(self.standby)))
            if victim == self._prewarmed:
                self._prewarmed = None
            asyncio.create_task(self._retire(self.standby.pop(victim), drain_timeout), name="engine-retire")

    async def prewarm(self, spec: SpecConfig) -> bool:
        """Build an engine for ``spec`` and keep it on standby (it takes no
        requests until a switch to ``spec``). False when standby is off, the
        spec already has an engine, or the build failed (logged)."""
        if (self.standby_capacity == 0 or spec in self.standby or spec in self._prewarming
                or (self.engine is not None and (self.engine.spec == spec or self._live_can_serve(self.engine, spec)))):
            return False
        self._prewarming.add(spec)
        try:
            engine = await self._build(spec)
        except Exception as e:  # noqa: BLE001 - a standby is an optimisation, never an outage
            log.warning("standby engine for %s failed to start: %s", spec.label(), e)
            return False
        finally:
            self._prewarming.discard(spec)
            self._contended_until = time.monotonic()
        if self.state in (STOPPED, DRAINING) or (self.engine is not None and self.engine.spec == spec):
            await asyncio.to_thread(engine.shutdown)
            return False
        self._prewarmed = spec
        self._keep(engine, 0.0)
        log.info("standby engine for %s ready", spec.label())
        return True

    async def _retire(self, engine: Engine, timeout: float) -> None:
        if not await self._wait_idle(engine, timeout):
            log.warning("old engine still had %d streams after %.0f s; stopping it", self.in_flight(engine), timeout)
        self._stopping += 1  # a vLLM engine's shutdown takes the CPU for a few seconds
        try:
            await asyncio.to_thread(engine.shutdown)
        finally:
            self._stopping -= 1
            self._in_flight.pop(id(engine), None)
            self._idle.pop(id(engine), None)
            self._contention_over()

    async def _watch(self) -> None:
        """Restart the engine when it dies (vLLM marks it errored)."""
        while True:
            await asyncio.sleep(0.5)
            for spec, standby in list(self.standby.items()):
                if standby.dead:
                    log.warning("standby engine for %s died; dropped", spec.label())
                    del self.standby[spec]
                    asyncio.create_task(self._retire(standby, 0.0), name="engine-retire")
            engine = self.engine
            if engine is None or self.state not in (SERVING,) or not engine.dead:
                continue
            if not self.cfg.server.engine_restart:
                self._set(FAILED)
                return
            t0 = time.monotonic()
            spec = engine.spec
            started_at = getattr(engine, "started_at", 0.0)
            died_young = bool(started_at) and time.time() - started_at < CRASH_LOOP_WINDOW_S
            self._quick_deaths = self._quick_deaths + 1 if died_young else 1
            if self._quick_deaths >= 2:
                spec = fallback_spec(engine.spec, self.cfg.spec_config())
                self._quick_deaths = 0
                self.stats.fallbacks += 1
                log.error("engine died twice within %.0f s of starting (%s); restarting with %s instead",
                          CRASH_LOOP_WINDOW_S, engine.spec.label(), spec.label())
            else:
                log.error("engine died (%s); restarting", engine.spec.label())
            self._set(RESTARTING)
            await asyncio.to_thread(engine.shutdown)
            for attempt, pause_s in enumerate(RESTART_BACKOFF_S, 1):
                try:
                    self.engine = await self._build(spec)
                    break
                except (EngineError, Exception) as e:  # noqa: BLE001
                    log.error("restart attempt %d failed: %s", attempt, e)
                    await asyncio.sleep(pause_s)
            else:
                self.engine = None
                self._set(FAILED)
                return
            self._notify()
            self.stats.restarts += 1
            self.stats.rebuilds += 1
            self.stats.last_recovery_s = time.monotonic() - t0
            log.info("engine back after %.1f s", self.stats.last_recovery_s)
            self._set(SERVING)

    async def drain(self, grace_s: float) -> None:
        """Stop taking requests; let in-flight ones finish within grace_s."""
        self._set(DRAINING)
        if self.engine is not None:
            if not await self._wait_idle(self.engine, grace_s):
                log.warning("grace period over with %d streams open; aborting them", self.in_flight())

    async def stop(self) -> None:
        if self._watch_task:
            self._watch_task.cancel()
        standby, self.standby = list(self.standby.values()), {}
        for engine in [self.engine, *standby]:
            if engine is not None:
                await asyncio.to_thread(engine.shutdown)
        self._set(STOPPED)
