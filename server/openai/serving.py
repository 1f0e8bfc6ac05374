"""The OpenAI endpoints as plain objects: a request's body and headers in;
an OpenAI body, a stream of server-sent events, or an ``ApiError`` out.
No network here: ``api_router`` reads the request and watches the
connection; tests drive these objects directly.

What runs the requests is a ``Service``: ``CompletionService`` in one
process, ``RoutedService`` (server/replicas/ingress.py) in front of engine
replicas. Both answer the same three calls, so one HTTP API serves either.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, Mapping, Protocol

from quickdraft.server.admission import ANONYMOUS, Client
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import Auth, http_peer_host, http_status
from quickdraft.server.openai.json_body import parse_body
from quickdraft.server.openai.outcomes import outcomes_body, outcomes_request
from quickdraft.server.openai.protocol import REQUEST_ID_HEADER, SSE_DONE, ApiError, Bounds, Call, Reply, bad, preview, sse
from quickdraft.server.outcomes import OutcomeBook
from quickdraft.server.request_validation import MAX_REQUEST_ID
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import AUTHORIZATION_KEY

log = logging.getLogger("quickdraft.http")

UNAUTHENTICATED = "missing or wrong bearer token (header 'Authorization: Bearer <token>')"


class Service(Protocol):
    """What the HTTP API needs of the service behind it."""

    def health(self) -> tuple[bool, str]:
        """(serving, state): /health's answer."""
        ...

    def refused(self, code: str, user: str = ANONYMOUS) -> None:
        """Count a request refused before it reached ``complete``."""
        ...

    def complete(self, req: pb.CompleteRequest, client: Client | str = ANONYMOUS,
                 headers: Mapping[str, str] | None = None) -> AsyncIterator[pb.CompleteResponse]:
        """Stream one completion; raises RequestError; a cancelled caller ends its work."""
        ...


class OutcomeReports(Protocol):
    """Where outcome reports go when no OutcomeBook is in this process (``RoutedService``)."""

    async def report_outcomes(self, req: pb.ReportOutcomesRequest, client: Client,
                              headers: Mapping[str, str] | None = None) -> pb.ReportOutcomesResponse:
        ...


class Completion:
    """One OpenAI request running on the service, in a task of its own that feeds a queue.

    Ending it is a task cancellation, as on gRPC: CancelledError reaches the
    engine await inside the service, whose cleanup aborts the engine request at
    once. (Closing the service's generator from outside only reaches its outer
    frame; the engine abort would then wait for garbage collection.)
    """

    _END = object()

    def __init__(self, service: Service, reply: Reply, client: Client, headers: Mapping[str, str]):
        self.reply = reply
        self.queue: asyncio.Queue = asyncio.Queue()  # unbounded: the pump never waits on us
        req = reply.call.req
        self.task = asyncio.create_task(self._pump(service, req, client, headers), name=f"http-completion-{req.request_id}")

    async def _pump(self, service: Service, req: pb.CompleteRequest, client: Client, headers: Mapping[str, str]) -> None:
        try:
            async for msg in service.complete(req, client, headers):
                self.queue.put_nowait(msg)
        except RequestError as e:
            self.queue.put_nowait(ApiError.from_request_error(e, self.reply.call.names))
        except Exception as e:  # noqa: BLE001 - reported to the client as a server error
            log.exception("completion %s of user=%s failed", req.request_id, client.user)
            self.queue.put_nowait(ApiError(500, f"generation failed: {type(e).__name__}", None, "INTERNAL"))
        self.queue.put_nowait(self._END)

    async def next(self) -> pb.CompleteResponse | None:
        """The next message; None at the end; raises the service's refusal as an ApiError."""
        item = await self.queue.get()
        if isinstance(item, ApiError):
            raise item
        return None if item is self._END else item

    async def body(self) -> dict:
        """The whole response of a request without ``stream``."""
        text, final = [], None
        while (msg := await self.next()) is not None:
            text.append(msg.text)
            final = msg.final if msg.HasField("final") else final
        if final is None:
            raise ApiError(500, "the completion ended without its final message", None, "INTERNAL")
        return self.reply.body("".join(text), final)

    async def events(self, msg: pb.CompleteResponse | None) -> AsyncIterator[bytes]:
        """The SSE events of a stream, from its first message on."""
        first = True
        try:
            while msg is not None:
                for event in self.reply.events(msg, first):
                    yield event
                first = False
                msg = await self.next()
        except ApiError as e:
            # After the 200 went out: an error event, as OpenAI and vLLM send.
            yield sse(e.body())
        yield SSE_DONE

    def stop(self) -> None:
        """Cancel what is still running (no-op once finished)."""
        self.task.cancel()


class OpenAIServing:
    """Auth, request translation, model list and health of the OpenAI API over one ``Service``."""

    def __init__(self, cfg: QuickdraftConfig, service: Service, auth: Auth, outcomes: OutcomeBook | OutcomeReports | None = None):
        self.cfg = cfg
        self.service = service
        self.auth = auth
        self.outcomes = outcomes
        self.model = cfg.http.served_model_name or cfg.preset.name
        self.created = int(time.time())
        # Generous: JSON escapes inflate text; the service checks the exact limit.
        self.max_body = 8 * cfg.limits.max_request_bytes + 65536
        self.bounds = Bounds(cfg.limits.max_stop_sequences, cfg.max_prompt_tokens())

    def authorize(self, headers: Mapping[str, str]) -> None:
        if not self.auth.allows(headers.get(AUTHORIZATION_KEY, "")):
            raise ApiError(401, UNAUTHENTICATED, None, "UNAUTHENTICATED")

    def check_content_type(self, value: str | None) -> None:
        """Only JSON bodies: a web page can POST text/plain or a form to a local
        server without the browser asking first, never application/json."""
        media = (value or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            got = "none" if value is None else preview(value)
            raise ApiError(415, f"Content-Type: expected application/json, got {got}", "Content-Type")

    def body_too_large(self, size: int | None) -> ApiError:
        """The 413 for a body of ``size`` bytes (None: still arriving, already over the limit)."""
        limit = f"(limits.max_request_bytes = {self.cfg.limits.max_request_bytes})"
        if size is None:
            return ApiError(413, f"request body is over {self.max_body} bytes {limit}")
        return ApiError(413, f"request body is {size} bytes; the limit is {self.max_body} {limit}")

    def identify(self, headers: Mapping[str, str], host: str | None) -> Client:
        """Who sends a request, as gRPC's front end names its callers: a
        tokens-file user by its id, anyone else by the connection's host.
        ``host`` is the socket's peer; uvicorn replaces it with the
        X-Forwarded-For client only when the peer is in http.trusted_proxies."""
        return self.auth.client(headers.get(AUTHORIZATION_KEY, ""), http_peer_host(host))

    def refused(self, e: ApiError, client: Client | None = None) -> ApiError:
        """Count a request refused before it reached the service, with the service's refusals."""
        self.service.refused(e.code, user=client.user if client else ANONYMOUS)
        return e

    def parse(self, data: bytes, translate: Callable[[Any, Bounds], Call], request_id: str | None) -> Call:
        """A request body (size already checked) -> the CompleteRequest to run.
        ``translate`` is the endpoint's (``protocol.completion_call`` or
        ``chat_call``); ``request_id`` the X-Request-Id header. Raises ApiError."""
        body = parse_body(data, self.bounds.max_json_values)
        model = body.get("model") if isinstance(body, dict) else None
        if model is not None and not isinstance(model, str):
            raise bad("model", f"expected a string, got {preview(model)}")
        if model is not None and model != self.model:
            raise ApiError(404, f"model: the model {preview(model, 80)} does not exist; this server serves `{self.model}` (GET /v1/models)", "model", "NOT_FOUND")
        call = translate(body, self.bounds)
        request_id = request_id or uuid.uuid4().hex
        if len(request_id) > MAX_REQUEST_ID:
            raise ApiError(400, f"{REQUEST_ID_HEADER} is {len(request_id)} characters; at most {MAX_REQUEST_ID}")
        call.req.request_id = request_id
        return call

    def start(self, call: Call, headers: Mapping[str, str], client: Client) -> Completion:
        """Run ``call`` on the service for ``client`` (``identify``): admission
        counts it against that user's (or host's) stream limit, and logs and
        metrics name its user, as for gRPC."""
        return Completion(self.service, Reply(call, call.req.request_id, self.model), client, headers)

    async def report_outcomes(self, data: bytes, client: Client, headers: Mapping[str, str]) -> dict:
        """POST /v1/completions/outcomes: a body (size already checked) counted
        for ``client``, as the ReportOutcomes RPC does. Raises ApiError."""
        if self.outcomes is None:
            raise ApiError(404, "this server does not take outcome reports", None, "NOT_FOUND")
        req = outcomes_request(data)
        try:
            if isinstance(self.outcomes, OutcomeBook):
                reply = self.outcomes.report(req, client, self.outcomes.telemetry.trace_context(headers))
            else:
                reply = await self.outcomes.report_outcomes(req, client, headers)
        except RequestError as e:
            raise ApiError(http_status(e.code), e.message, None if e.field is None else f"{e.field}{e.at}", e.code) from None
        return outcomes_body(reply)

    def models(self) -> dict:
        # "root" is the name too, never cfg.target_path(): a filesystem path tells
        # any client the server's directory layout (and user name).
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "quickdraft",
            "root": self.model,
            "max_model_len": self.cfg.max_model_len(),
        }
        return {"object": "list", "data": [card]}

    def health(self, headers: Mapping[str, str]) -> tuple[int, dict]:
        """(HTTP status, body) of /health."""
        if self.cfg.security.health_requires_auth:
            self.authorize(headers)
        serving, state = self.service.health()
        return (200, {"status": "serving"}) if serving else (503, {"status": state})
