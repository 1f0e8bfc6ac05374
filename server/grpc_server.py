"""The gRPC front end: a thin servicer over CompletionService, and the
gRPC server around it (health, reflection, bearer-token auth, TLS).

Startup and shutdown of the whole process are ``app.QuickdraftServer``'s.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable

import grpc
import grpc.aio
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from quickdraft.server.admission import Client
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.config.validation import check_tls_files
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import Auth, grpc_peer_host
from quickdraft.server.outcomes import OutcomeBook
from quickdraft.server.pinning import SpeculationPin
from quickdraft.server.service import CompletionService
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import AUTHORIZATION_KEY

log = logging.getLogger("quickdraft.server")

SERVICE_NAME = "quickdraft.v1.Completion"
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
UNAUTHENTICATED = "missing or wrong bearer token (metadata 'authorization: Bearer <token>')"


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


async def abort_unparsed(request, context: grpc.aio.ServicerContext) -> None:
    """INVALID_ARGUMENT for a request whose bytes did not parse (``_parse``)."""
    if isinstance(request, _BadRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request could not be parsed: {request.error} (string fields must be valid UTF-8)")


class CompletionServicer:
    """gRPC adapter: protocol in, protocol out; the logic is CompletionService's."""

    def __init__(self, service: CompletionService, auth: Auth | None = None, controller_state: Callable[[], pb.ControllerState | None] | None = None,
                 pin: SpeculationPin | None = None, outcomes: OutcomeBook | None = None):
        self.service = service
        self.auth = auth or Auth(None)
        self.controller_state = controller_state
        self.pin = pin
        self.outcomes = outcomes

    def caller(self, context: grpc.aio.ServicerContext) -> tuple[dict[str, str], Client]:
        """(the call's metadata, the client it authenticates as)."""
        md = dict(context.invocation_metadata() or ())
        return md, self.auth.client(md.get(AUTHORIZATION_KEY, ""), grpc_peer_host(context.peer()))

    async def Complete(self, request, context: grpc.aio.ServicerContext):
        if isinstance(request, _BadRequest):
            self.service.refused("INVALID_ARGUMENT")
        await abort_unparsed(request, context)
        md, client = self.caller(context)
        try:
            async for msg in self.service.complete(request, client, md):
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

    async def PinSpeculation(self, request, context):
        if isinstance(request, _BadRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request could not be parsed: {request.error}")
        if self.pin is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server does not take pins")
        if not self.caller(context)[1].admin:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "PinSpeculation changes the server for every user: it needs a user with admin = true in security.auth_tokens_file")
        try:
            applied, ms = await self.pin.set(request.config, request.allow_rebuild)
        except RequestError as e:
            await context.abort(grpc.StatusCode[e.code], e.message)
        return pb.PinSpeculationResponse(config=self.service.server_info().speculative, pinned=self.pin.pinned is not None,
                                         applied=applied, switch_ms=ms)

    async def ReportOutcomes(self, request, context):
        await abort_unparsed(request, context)
        if self.outcomes is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server does not take outcome reports")
        md, client = self.caller(context)
        try:
            return self.outcomes.report(request, client, self.service.telemetry.trace_context(md))
        except RequestError as e:
            await context.abort(grpc.StatusCode[e.code], e.message)

    async def GetOutcomeStats(self, request, context):
        if self.outcomes is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server does not take outcome reports")
        return self.outcomes.stats()

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
                "PinSpeculation": grpc.unary_unary_rpc_method_handler(
                    self.PinSpeculation, request_deserializer=_parse(pb.PinSpeculationRequest), response_serializer=pb.PinSpeculationResponse.SerializeToString
                ),
                "ReportOutcomes": grpc.unary_unary_rpc_method_handler(
                    self.ReportOutcomes, request_deserializer=_parse(pb.ReportOutcomesRequest), response_serializer=pb.ReportOutcomesResponse.SerializeToString
                ),
                "GetOutcomeStats": grpc.unary_unary_rpc_method_handler(
                    self.GetOutcomeStats, request_deserializer=_parse(pb.GetOutcomeStatsRequest), response_serializer=pb.OutcomeStats.SerializeToString
                ),
            },
        )


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """The bearer-token check on every call. Health Check stays open unless
    configured; Watch, a stream held open, never does."""

    def __init__(self, auth: Auth, exempt_health: bool = True):
        self._auth = auth
        self._exempt_health = exempt_health

        async def deny_unary(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)

        async def deny_stream(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
            yield  # pragma: no cover

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny_unary)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny_stream)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        if self._exempt_health and details.method == HEALTH_CHECK_METHOD:
            return await continuation(details)
        md = dict(details.invocation_metadata or ())
        if self._auth.allows(md.get(AUTHORIZATION_KEY, "")):
            return await continuation(details)
        return self._deny_stream if details.method.endswith("/Complete") else self._deny_unary


class BoundedHealthServicer(health_aio.HealthServicer):
    """grpc.health.v1 whose Watch streams are capped (limits.max_health_watchers):
    each holds a task and a stream for as long as the caller likes."""

    def __init__(self, max_watchers: int):
        super().__init__()
        self.max_watchers = max_watchers
        self.watchers = 0

    async def Watch(self, request, context) -> None:
        if self.watchers >= self.max_watchers:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"limits.max_health_watchers ({self.max_watchers}) Watch streams are open; use Check, or close one")
        self.watchers += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watchers -= 1


def server_credentials(cfg: QuickdraftConfig) -> grpc.ServerCredentials | None:
    sec = cfg.security
    if not sec.tls_cert_file:
        return None
    check_tls_files(sec)  # else gRPC reports only a failed bind
    key = Path(sec.tls_key_file).expanduser().read_bytes()
    chain = Path(sec.tls_cert_file).expanduser().read_bytes()
    ca = Path(sec.tls_client_ca_file).expanduser().read_bytes() if sec.tls_client_ca_file else None
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca, require_client_auth=ca is not None)


class GrpcServer:
    """The gRPC listener on cfg.server.host:cfg.server.port (0: a free port,
    then read ``.port``): the Completion service, grpc.health.v1 and reflection."""

    def __init__(self, cfg: QuickdraftConfig, service: CompletionService, auth: Auth,
                 controller_state: Callable[[], pb.ControllerState | None] | None = None,
                 pin: SpeculationPin | None = None, outcomes: OutcomeBook | None = None, servicer: CompletionServicer | None = None):
        """``servicer``: another servicer in the place of the one made from the arguments (replicas' front end)."""
        self.cfg = cfg
        self.service = service
        self.auth = auth
        self.servicer = servicer or CompletionServicer(service, auth, controller_state, pin, outcomes)
        self.health = BoundedHealthServicer(cfg.limits.max_health_watchers)
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._pending_health: set[asyncio.Future] = set()

    async def start(self) -> int:
        """Bind and serve; health says NOT_SERVING until set_serving(True)."""
        cfg = self.cfg
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        interceptors = [AuthInterceptor(self.auth, exempt_health=not cfg.security.health_requires_auth)] if self.auth.enabled else []
        opts = [
            ("grpc.max_send_message_length", cfg.server.max_message_bytes),
            ("grpc.max_receive_message_length", cfg.server.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self.server = grpc.aio.server(interceptors=interceptors, options=opts)
        self.server.add_generic_rpc_handlers((self.servicer.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if cfg.server.reflection:
            from grpc_reflection.v1alpha import reflection

            reflection.enable_server_reflection((SERVICE_NAME, "grpc.health.v1.Health", reflection.SERVICE_NAME), self.server)
        address = f"{cfg.server.host}:{cfg.server.port}"
        creds = server_credentials(cfg)
        try:
            self.port = self.server.add_secure_port(address, creds) if creds else self.server.add_insecure_port(address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise OSError(f"could not bind {address}: is another server using that port? Pick another with --port or server.port")
        await self.server.start()
        log.info("gRPC listening on %s:%d%s%s", cfg.server.host, self.port, " (TLS)" if creds else "", " (auth)" if self.auth.enabled else "")
        return self.port

    def set_serving(self, serving: bool) -> None:
        """Health status of the server and the Completion service (callable from sync code)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            fut = asyncio.ensure_future(self.health.set(name, status))
            self._pending_health.add(fut)  # keep a reference until it has run
            fut.add_done_callback(self._pending_health.discard)

    async def drain(self) -> None:
        """Shutdown's first step: health says NOT_SERVING, so balancers stop sending."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls; in-flight ones get grace_s, then are cancelled."""
        if self.server is not None:
            await self.server.stop(grace_s)
