"""The gRPC front end: a thin servicer over CompletionService, plus health,
reflection, authentication, TLS and graceful shutdown.

``QuickdraftServer`` puts the pieces together; ``quickdraft serve`` and the
integration tests both use it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import signal
from pathlib import Path

import grpc
import grpc.aio
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from quickdraft.server import engine_manager as em
from quickdraft.server.admission import Admission
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.engine import SpecMode
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.requests import RequestError
from quickdraft.server.service import CompletionService
from quickdraft.server.telemetry import Telemetry
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.server")

SERVICE_NAME = "quickdraft.v1.Completion"
HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"


class _BadRequest:
    """Stands in for a request whose bytes did not parse (e.g. invalid UTF-8)."""

    def __init__(self, error: str):
        self.error = error


def _parse(message_type):
    def parse(data: bytes):
        try:
            return message_type.FromString(data)
        except (DecodeError, ValueError) as e:
            return _BadRequest(str(e) or "malformed message")

    return parse


def client_identity(context: grpc.aio.ServicerContext, token_auth: bool = True) -> str:
    """Per-client limits key: the bearer token's hash, else the peer's address.

    The token counts only when the server checks tokens: otherwise any client
    could send a fresh made-up token per call and escape its per-client limit.
    """
    md = dict(context.invocation_metadata() or ())
    auth = md.get("authorization", "") if token_auth else ""
    if auth:
        return "token:" + hashlib.sha256(auth.encode()).hexdigest()[:16]
    peer = context.peer() or "unknown"
    # "ipv4:127.0.0.1:53622" -> the host, so one editor's many connections count once.
    return peer.rsplit(":", 1)[0]


class CompletionServicer:
    """gRPC adapter: protocol in, protocol out; the logic is CompletionService's."""

    def __init__(self, service: CompletionService, controller_state=None, token_auth: bool = False):
        self.service = service
        self.controller_state = controller_state
        self.token_auth = token_auth

    async def Complete(self, request, context: grpc.aio.ServicerContext):
        if isinstance(request, _BadRequest):
            self.service.telemetry.reject("INVALID_ARGUMENT")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request could not be parsed: {request.error} (string fields must be valid UTF-8)")
        md = dict(context.invocation_metadata() or ())
        trace_ctx = self.service.telemetry.trace_context(md)
        try:
            async for msg in self.service.complete(request, client_identity(context, self.token_auth), trace_ctx):
                yield msg
        except RequestError as e:
            if e.metadata:
                context.set_trailing_metadata(tuple(e.metadata.items()))
            await context.abort(grpc.StatusCode[e.code], e.message)

    async def GetServerInfo(self, request, context):
        return self.service.server_info()

    async def GetControllerState(self, request, context):
        state = self.controller_state() if self.controller_state is not None else None
        if state is None:  # no controller configured: the static config is what runs
            return pb.ControllerState(enabled=False, active=self.service.server_info().speculative)
        return state

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Complete": grpc.unary_stream_rpc_method_handler(
                    self.Complete, request_deserializer=_parse(pb.CompleteRequest), response_serializer=pb.CompleteResponse.SerializeToString
                ),
                "GetServerInfo": grpc.unary_unary_rpc_method_handler(
                    self.GetServerInfo, request_deserializer=_parse(pb.GetServerInfoRequest), response_serializer=pb.ServerInfo.SerializeToString
                ),
                "GetControllerState": grpc.unary_unary_rpc_method_handler(
                    self.GetControllerState, request_deserializer=_parse(pb.GetControllerStateRequest), response_serializer=pb.ControllerState.SerializeToString
                ),
            },
        )


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Bearer-token check, constant time. Health checks stay open unless configured."""

    def __init__(self, token: str, exempt_health: bool = True):
        self._expected = f"Bearer {token}".encode()
        self._exempt_health = exempt_health

        async def deny_unary(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata 'authorization: Bearer <token>')")

        async def deny_stream(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata 'authorization: Bearer <token>')")
            yield  # pragma: no cover

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny_unary)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny_stream)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        if self._exempt_health and details.method.startswith(HEALTH_METHOD_PREFIX):
            return await continuation(details)
        md = dict(details.invocation_metadata or ())
        got = md.get("authorization", "").encode()
        if hmac.compare_digest(got, self._expected):
            return await continuation(details)
        return self._deny_stream if details.method.endswith("/Complete") else self._deny_unary


def read_auth_token(cfg: QuickdraftConfig) -> str | None:
    sec = cfg.security
    if sec.auth_token_file:
        return Path(sec.auth_token_file).expanduser().read_text().strip()
    token = os.environ.get(sec.auth_token_env, "").strip()
    return token or None


def server_credentials(cfg: QuickdraftConfig) -> grpc.ServerCredentials | None:
    sec = cfg.security
    if not sec.tls_cert_file:
        return None
    key = Path(sec.tls_key_file).expanduser().read_bytes()
    chain = Path(sec.tls_cert_file).expanduser().read_bytes()
    ca = Path(sec.tls_client_ca_file).expanduser().read_bytes() if sec.tls_client_ca_file else None
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca, require_client_auth=ca is not None)


class QuickdraftServer:
    """gRPC server + engine manager + telemetry (+ controller and HTTP when configured)."""

    def __init__(self, cfg: QuickdraftConfig, span_exporter=None, engine_factory=None):
        self.cfg = cfg
        self.telemetry = Telemetry(cfg.preset.name, cfg.telemetry.metrics_port, cfg.telemetry.metrics_host, cfg.telemetry.otlp_endpoint, span_exporter)
        self.health = health_aio.HealthServicer()
        kwargs = {"engine_factory": engine_factory} if engine_factory else {}
        self.engines = EngineManager(cfg, on_state=self._on_engine_state, **kwargs)
        self.service = CompletionService(cfg, self.engines, self.telemetry, Admission(cfg.limits.max_concurrent_streams, cfg.limits.max_streams_per_client))
        self.controller = None
        self.http = None
        self.grpc: grpc.aio.Server | None = None
        self.port = 0
        self._engine_task: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        self._failed = asyncio.Event()
        self._pending_health: set[asyncio.Future] = set()

    def _on_engine_state(self, state: str) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if state in (em.SERVING, em.SWITCHING) else health_pb2.HealthCheckResponse.NOT_SERVING
        if self._stopping.is_set():
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        if state == em.FAILED:
            self._failed.set()
        for name in ("", SERVICE_NAME):
            fut = asyncio.ensure_future(self.health.set(name, status))
            self._pending_health.add(fut)  # keep a reference until it has run
            fut.add_done_callback(self._pending_health.discard)

    async def start(self) -> int:
        """Bind, start serving health (NOT_SERVING), then build the engine in the background."""
        cfg = self.cfg
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        interceptors = []
        token = read_auth_token(cfg)
        if token:
            interceptors.append(AuthInterceptor(token, exempt_health=not cfg.security.health_requires_auth))
        opts = [
            ("grpc.max_send_message_length", cfg.server.max_message_bytes),
            ("grpc.max_receive_message_length", cfg.server.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self.grpc = grpc.aio.server(interceptors=interceptors, options=opts)
        servicer = CompletionServicer(self.service, controller_state=lambda: self.controller.state_proto() if self.controller else None, token_auth=bool(token))
        self.servicer = servicer
        self.grpc.add_generic_rpc_handlers((servicer.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        if cfg.server.reflection:
            from grpc_reflection.v1alpha import reflection

            reflection.enable_server_reflection((SERVICE_NAME, "grpc.health.v1.Health", reflection.SERVICE_NAME), self.grpc)
        address = f"{cfg.server.host}:{cfg.server.port}"
        creds = server_credentials(cfg)
        try:
            self.port = self.grpc.add_secure_port(address, creds) if creds else self.grpc.add_insecure_port(address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"could not bind {address}: is another server using that port? Pick another with --port or server.port")
        await self.grpc.start()
        log.info("gRPC listening on %s:%d%s%s", cfg.server.host, self.port, " (TLS)" if creds else "", " (auth)" if token else "")
        if cfg.http.enabled:
            # Up before the engine, so /health says 503 while it starts and a taken port shows at once.
            from quickdraft.server.http_api import HttpServer

            self.http = HttpServer(cfg, self.service)
            await self.http.start()
        self._engine_task = asyncio.create_task(self._start_engine(), name="engine-start")
        return self.port

    async def _start_engine(self) -> None:
        mode = SpecMode.from_config(self.cfg)
        if self.cfg.controller.enabled:
            from quickdraft.server.controller_loop import ControllerLoop

            self.controller = ControllerLoop(self.cfg, self.engines, self.service, self.telemetry)
            # A tuned profile for this hardware/model/drafter/vLLM starts from its last good config.
            mode = self.controller.start_mode()
        await self.engines.start(mode)
        if self.controller is not None:
            self.controller.start()

    async def wait_ready(self, timeout: float = 300.0) -> None:
        """Until the engine serves; raises what the engine start raised."""
        await asyncio.wait_for(asyncio.shield(self._engine_task), timeout)

    async def shutdown(self, grace_s: float | None = None) -> None:
        """SIGTERM path: NOT_SERVING, refuse new streams, let in-flight ones finish, stop."""
        grace = self.cfg.server.grace_period_s if grace_s is None else grace_s
        self._stopping.set()
        self.service.admission.accepting = False
        await self.health.enter_graceful_shutdown()
        log.info("draining: %d streams in flight, grace %.1f s", self.service.admission.open, grace)
        if self.controller:
            self.controller.stop()
        # Both front ends drain together, within one grace period.
        stops = [self.grpc.stop(grace)] if self.grpc is not None else []
        if self.http:
            stops.append(self.http.stop())
        await asyncio.gather(*stops)
        if self._engine_task and not self._engine_task.done():
            self._engine_task.cancel()
        await self.engines.stop()
        self.telemetry.shutdown()

    async def serve_forever(self) -> int:
        """Run until SIGTERM/SIGINT; exit code 0 after a clean drain."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.start()
        except OSError as e:
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
            print(f"quickdraft: serving {self.cfg.preset.name} ({self.engines.engine.mode.label()})", flush=True)
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
