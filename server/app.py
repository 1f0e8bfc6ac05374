"""The server process: configuration -> engine manager -> CompletionService
-> controller loop -> gRPC and HTTP front ends, and their start and drain.

``quickdraft serve``, the benchmarks and the integration tests all run a
``QuickdraftServer``.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from quickdraft.server import engine_manager as em
from quickdraft.server.admission import Admission
from quickdraft.server.config import ConfigError, QuickdraftConfig
from quickdraft.server.config.validation import check_remote_exposure, is_loopback
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.frontend import Auth
from quickdraft.server.grpc_server import GrpcServer
from quickdraft.server.outcomes import OutcomeBook
from quickdraft.server.pinning import SpeculationPin
from quickdraft.server.service import CompletionService
from quickdraft.server.telemetry import Telemetry

log = logging.getLogger("quickdraft.server")


class QuickdraftServer:
    """Engine manager, service and telemetry, served over gRPC (and HTTP and the controller when configured)."""

    def __init__(self, cfg: QuickdraftConfig, span_exporter=None, engine_factory=None):
        self.cfg = cfg
        self.telemetry = Telemetry(cfg.preset.name, cfg.telemetry.metrics_port, cfg.telemetry.metrics_host, cfg.telemetry.otlp_endpoint, span_exporter)
        kwargs = {"engine_factory": engine_factory} if engine_factory else {}
        self.engines = EngineManager(cfg, on_state=self._on_engine_state, **kwargs)
        self.service = CompletionService(cfg, self.engines, self.telemetry, Admission(cfg.limits.max_concurrent_streams, cfg.limits.max_streams_per_client))
        self.controller = None
        # One token read for both protocols.
        self.auth = Auth.from_config(cfg)
        self.pin = SpeculationPin(self.engines, controller=lambda: self.controller)
        # What editors did with the suggestions: fed by every finished request, read by both front ends.
        self.outcomes = OutcomeBook(self.telemetry, grace_s=cfg.telemetry.never_shown_grace_s)
        self.service.observers.callbacks.append(self.outcomes.remember)
        self.grpc = GrpcServer(cfg, self.service, self.auth, controller_state=lambda: self.controller.state_proto() if self.controller else None,
                               pin=self.pin, outcomes=self.outcomes)
        self.http = None
        self.port = 0
        self._engine_task: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        self._failed = asyncio.Event()

    def _on_engine_state(self, state: str) -> None:
        if state == em.FAILED:
            self._failed.set()
        self.grpc.set_serving(state in (em.SERVING, em.SWITCHING) and not self._stopping.is_set())

    async def start(self) -> int:
        """Bind, start serving health (NOT_SERVING), then build the engine in the background."""
        check_remote_exposure(self.cfg)
        if self.cfg.security.allow_insecure_remote and not all(is_loopback(h) for h in self._hosts()):
            log.warning("security.allow_insecure_remote = true: serving %s without %s; anyone on the network path can read code "
                        "and tokens, or use the server", ", ".join(h for h in self._hosts() if not is_loopback(h)),
                        "TLS and auth" if not self.cfg.security.tls_cert_file and not self.auth.enabled else
                        ("TLS" if not self.cfg.security.tls_cert_file else "auth"))
        self.port = await self.grpc.start()
        if self.cfg.http.enabled:
            # Up before the engine, so /health says 503 while it starts and a taken port shows at once.
            from quickdraft.server.openai.api_router import build_app
            from quickdraft.server.openai.http_server import HttpServer
            from quickdraft.server.openai.serving import OpenAIServing

            self.http = HttpServer(self.cfg, build_app(OpenAIServing(self.cfg, self.service, self.auth, self.outcomes)))
            await self.http.start()
        self._engine_task = asyncio.create_task(self._start_engine(), name="engine-start")
        return self.port

    async def start_headless(self, timeout: float = 900.0) -> None:
        """Engine and controller, and no listener: one replica behind the
        router (server/replicas/), whose gRPC front end runs elsewhere."""
        self._engine_task = asyncio.create_task(self._start_engine(), name="engine-start")
        await self.wait_ready(timeout)

    def _hosts(self) -> list[str]:
        return [self.cfg.server.host] + ([self.cfg.http.host] if self.cfg.http.enabled else [])

    def reload_users(self) -> None:
        """SIGHUP: re-read security.auth_tokens_file (a broken file keeps the old users)."""
        try:
            self.auth.reload()
        except Exception:  # noqa: BLE001 - a reload must never take the server down
            log.exception("tokens file reload failed; keeping the users loaded before")

    async def _start_engine(self) -> None:
        spec = self.cfg.spec_config()
        if self.cfg.controller.enabled:
            from quickdraft.server.controller_loop import ControllerLoop

            self.controller = ControllerLoop(self.cfg, self.engines, self.service, self.telemetry)
            # A tuned profile for this hardware/model/drafter/vLLM starts from its last good config.
            spec = self.controller.start_spec()
        await self.engines.start(spec)
        if self.controller is not None:
            self.controller.start()

    async def wait_ready(self, timeout: float = 300.0) -> None:
        """Until the engine serves; raises what the engine start raised."""
        await asyncio.wait_for(asyncio.shield(self._engine_task), timeout)

    async def shutdown(self, grace_s: float | None = None) -> None:
        """SIGTERM path: NOT_SERVING, refuse new streams, let in-flight ones finish, stop."""
        grace = self.cfg.server.grace_period_s if grace_s is None else grace_s
        self._stopping.set()
        self.service.stop_accepting()
        await self.grpc.drain()
        log.info("draining: %d streams in flight, grace %.1f s", self.service.admission.open, grace)
        if self.controller:
            self.controller.stop()
        # Both front ends drain together, within one grace period.
        stops = [self.grpc.stop(grace)]
        if self.http:
            stops.append(self.http.stop())
        await asyncio.gather(*stops)
        if self._engine_task and not self._engine_task.done():
            self._engine_task.cancel()
        await self.engines.stop()
        self.service.tokenizer_pool.shutdown()
        self.telemetry.shutdown()

    async def serve_forever(self) -> int:
        """Run until SIGTERM/SIGINT; exit code 0 after a clean drain."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if self.auth.per_user:
            loop.add_signal_handler(signal.SIGHUP, self.reload_users)
        try:
            await self.start()
        except (OSError, ConfigError) as e:
            print(f"quickdraft serve: {e}", flush=True)
            return 1
        print(f"quickdraft: gRPC on {self.cfg.server.host}:{self.port} (engine starting: {self.cfg.preset.name})", flush=True)
        engine_done = self._engine_task
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({engine_done, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if engine_done in done and engine_done.exception() is not None:
            log.error("engine failed to start: %s", engine_done.exception())
            await self.shutdown(0)
            return 1
        if engine_done in done:
            print(f"quickdraft: serving {self.cfg.preset.name} ({self.engines.engine.describe()})", flush=True)
            failed = asyncio.create_task(self._failed.wait())
            await asyncio.wait({waiter, failed}, return_when=asyncio.FIRST_COMPLETED)
            if failed.done():
                # The engine died and could not be restarted: exit so a supervisor can.
                log.error("engine failed and could not be restarted; exiting")
                await self.shutdown(0)
                return 1
            failed.cancel()
        await self.shutdown()
        return 0
