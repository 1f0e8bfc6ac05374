"""OpenAI-compatible HTTP API over the same CompletionService as gRPC.

A thin adapter: OpenAI requests become ``pb.CompleteRequest``s, the service's
stream becomes OpenAI bodies or server-sent events. Admission limits,
validation, metrics, traces and engine aborts stay in the service, so both
protocols behave alike. uvicorn runs in the gRPC server's event loop, so one
engine (and one admission count) serves both.

Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health.
Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}},
with ``code`` the status name the gRPC API uses (INVALID_ARGUMENT, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import socket
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from quickdraft.prompt_format import render_chat
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.grpc_server import read_auth_token
from quickdraft.server.requests import MAX_REQUEST_ID, RequestError
from quickdraft.server.service import CompletionService
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.http")

FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORTED: "abort"}
# OpenAI's error "type" by HTTP status (what its client and editors look at).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SSE_DONE = b"data: [DONE]\n\n"


# --- errors -------------------------------------------------------------------


class ApiError(Exception):
    """A request answered with an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "INVALID_ARGUMENT"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


# "max_tokens: ...", "stop[2]: ..." -> the field the service's message is about.
_FIELD = re.compile(r"^(\w+)(\[\d+\])?:")


def from_service(e: RequestError, names: dict[str, str]) -> ApiError:
    """The service's error, its field renamed to the OpenAI parameter the client sent."""
    message, param = e.message, None
    names = {"request_id": "X-Request-Id", **names}  # the id comes from that header
    m = _FIELD.match(message)
    if m:
        param = names.get(m.group(1), m.group(1))
        message = param + message[len(m.group(1)) :]
    elif message.startswith(("prompt is", "request is")):
        param = names["prefix"]
    return ApiError(e.http_status, message, param, e.code)


# --- reading OpenAI requests ----------------------------------------------------


class Params:
    """A request's JSON object, read with the parameter named in every error.
    Unknown parameters are ignored, as OpenAI's and vLLM's servers do."""

    def __init__(self, data: Any):
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        self.data = data

    def get(self, name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
        value = self.data.get(name)
        if value is None:
            return default
        # bool is an int in Python, never in JSON.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise bad(name, f"expected {what}, got {json.dumps(value)[:40]}")
        return value

    def number(self, name: str) -> float | None:
        return self.get(name, (int, float), "a number")

    def integer(self, name: str) -> int | None:
        return self.get(name, (int,), "an integer")

    def flag(self, name: str) -> bool:
        return self.get(name, (bool,), "true or false", False)

    def unsupported(self, name: str, allowed: tuple = (None,), hint: str = "") -> None:
        """Refuse a parameter quickdraft does not implement, unless it has a no-op value."""
        value = self.data.get(name)
        if value in allowed or (isinstance(value, (list, dict)) and not value and None in allowed):
            return
        raise bad(name, f"{json.dumps(value)[:40]} is not supported by this server{hint}")


@dataclass
class Call:
    """One OpenAI request, translated."""

    req: pb.CompleteRequest
    chat: bool
    stream: bool
    include_usage: bool
    # Service field -> the OpenAI parameter it came from, for error messages.
    names: dict[str, str] = field(default_factory=dict)


def _sampling(p: Params, req: pb.CompleteRequest, max_tokens_name: str) -> None:
    """max_tokens, temperature, top_p, stop, seed: shared by both endpoints.
    Ranges are the service's to check; here only types and what the proto holds."""
    max_tokens = p.integer(max_tokens_name)
    if max_tokens is not None:
        if max_tokens == 0:
            raise bad(max_tokens_name, "0 tokens; ask for at least 1, or leave it out for the server's default")
        # Out-of-range values still reach the service, which names the limit.
        req.max_tokens = max(-1, min(max_tokens, INT32_MAX))
    for name in ("temperature", "top_p"):
        value = p.number(name)
        if value is not None:
            setattr(req, name, value)
    seed = p.integer("seed")
    if seed is not None:
        req.seed = max(-1, min(seed, INT64_MAX))
    stop = p.data.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad("stop", "expected a string or a list of strings")
        _set(req.stop.extend, stop, "stop")


def _set(setter, value: Any, param: str) -> None:
    """Proto assignment; strings that are not valid Unicode (lone surrogates) are the client's error."""
    try:
        setter(value)
    except ValueError as e:
        raise bad(param, f"cannot be used ({e})") from None


def _stream_options(p: Params) -> tuple[bool, bool]:
    stream = p.flag("stream")
    options = p.get("stream_options", (dict,), "an object")
    if options is not None and not stream:
        raise bad("stream_options", "only allowed when stream is true")
    include_usage = Params(options or {}).flag("include_usage")
    return stream, include_usage


def _prompt(p: Params) -> str:
    """One prompt string. A list holding one string is the same request; batches
    and token ids are not supported."""
    prompt = p.data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        raise bad("prompt", "required")
    if isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
        raise bad("prompt", f"a batch of {len(prompt)} prompts is not supported; send one request per prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(x, (int, list)) and not isinstance(x, bool) for x in prompt):
        raise bad("prompt", "token id prompts are not supported; send the prompt as text")
    raise bad("prompt", "expected a string")


def completion_call(body: Any) -> Call:
    """/v1/completions. A prompt alone is sent as written (control tokens in it
    count, as on vLLM), so editors that render their own FIM template work;
    with `suffix` the server renders the model's fill-in-the-middle format."""
    p = Params(body)
    p.unsupported("n", (None, 1), "; send one request per completion")
    p.unsupported("best_of", (None, 1))
    p.unsupported("echo", (None, False))
    p.unsupported("logprobs", (None,))
    for name in ("presence_penalty", "frequency_penalty"):
        p.unsupported(name, (None, 0, 0.0))
    p.unsupported("logit_bias", (None,))
    req = pb.CompleteRequest(latency_class=pb.LATENCY_CLASS_INLINE)
    prompt = _prompt(p)
    suffix = p.get("suffix", (str,), "a string")
    _set(lambda v: setattr(req, "prefix", v), prompt, "prompt")
    if suffix is None:
        req.raw_prompt = True
    else:
        _set(lambda v: setattr(req, "suffix", v), suffix, "suffix")
    _sampling(p, req, "max_tokens")
    stream, include_usage = _stream_options(p)
    return Call(req, chat=False, stream=stream, include_usage=include_usage, names={"prefix": "prompt"})


def _message_text(content: Any, i: int) -> str:
    """A message's text: a string, or text parts (what newer clients send)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad(f"messages[{i}].content", "only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content", "expected a string or a list of text parts")


def chat_call(body: Any) -> Call:
    """/v1/chat/completions: messages rendered as ChatML, sent as a raw prompt."""
    p = Params(body)
    p.unsupported("n", (None, 1), "; send one request per completion")
    p.unsupported("logprobs", (None, False))
    p.unsupported("top_logprobs", (None, 0))
    for name in ("presence_penalty", "frequency_penalty"):
        p.unsupported(name, (None, 0, 0.0))
    for name in ("logit_bias", "tools", "functions"):
        p.unsupported(name, (None,))
    p.unsupported("tool_choice", (None, "none", "auto"))
    fmt = p.get("response_format", (dict,), "an object")
    if fmt is not None and fmt.get("type", "text") != "text":
        raise bad("response_format", f"{json.dumps(fmt.get('type'))} is not supported; only text")
    messages = p.get("messages", (list,), "a list of messages")
    if not messages:
        raise bad("messages", "at least one message is required")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", "expected an object with role and content")
        role = CHAT_ROLES.get(m.get("role"))
        if role is None:
            raise bad(f"messages[{i}].role", f"{json.dumps(m.get('role'))} is not supported; use {', '.join(CHAT_ROLES)}")
        turns.append((role, _message_text(m.get("content"), i)))
    req = pb.CompleteRequest(latency_class=pb.LATENCY_CLASS_CHAT, raw_prompt=True)
    _set(lambda v: setattr(req, "prefix", v), render_chat(turns), "messages")
    # The newer name wins, as on OpenAI.
    max_name = "max_completion_tokens" if p.data.get("max_completion_tokens") is not None else "max_tokens"
    _sampling(p, req, max_name)
    stream, include_usage = _stream_options(p)
    return Call(req, chat=True, stream=stream, include_usage=include_usage, names={"prefix": "messages", "max_tokens": max_name})


# --- responses ---------------------------------------------------------------------


def usage(final: pb.CompleteFinal) -> dict:
    return {"prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens, "total_tokens": final.prompt_tokens + final.completion_tokens}


def figures(final: pb.CompleteFinal) -> dict:
    """The request's server timings and speculative figures (CompleteFinal's),
    under "quickdraft": OpenAI clients ignore fields they do not know."""
    s = final.speculative
    return {
        "request_id": final.request_id,
        "ttft_ms": round(final.ttft_ms, 3),
        "tpot_ms": round(final.tpot_ms, 3),
        "e2e_ms": round(final.e2e_ms, 3),
        "speculative": {
            "enabled": s.enabled,
            "parallel_drafting": s.parallel_drafting,
            "num_speculative_tokens": s.num_speculative_tokens,
            "num_drafts": s.num_drafts,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens,
            "accepted_per_position": list(s.accepted_per_position),
            "mean_acceptance_length": round(s.mean_acceptance_length, 4),
        },
    }


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Reply:
    """Builds the bodies and chunks of one response."""

    call: Call
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.call.chat else 'cmpl'}-{self.request_id}"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, text: str, final: pb.CompleteFinal) -> dict:
        finish = FINISH_REASONS.get(final.finish_reason, "stop")
        if self.call.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(final), "quickdraft": figures(final)}

    def chunk(self, text: str | None = None, final: pb.CompleteFinal | None = None, first: bool = False) -> dict:
        finish = FINISH_REASONS.get(final.finish_reason, "stop") if final is not None else None
        if self.call.chat:
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            out = {**self._head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        else:
            out = {**self._head("text_completion"), "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}
        if self.call.include_usage:
            # OpenAI: with include_usage every chunk has "usage": null but the extra last one.
            out["usage"] = None
        if final is not None and not self.call.include_usage:
            out["quickdraft"] = figures(final)
        return out

    def usage_chunk(self, final: pb.CompleteFinal) -> dict:
        obj = "chat.completion.chunk" if self.call.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(final), "quickdraft": figures(final)}

    def events(self, msg: pb.CompleteResponse, first: bool) -> list[bytes]:
        """The SSE events for one service message."""
        if not msg.HasField("final"):
            return [_sse(self.chunk(text=msg.text, first=first))]
        out = [_sse(self.chunk(text=msg.text or None, final=msg.final, first=first))]
        if self.call.include_usage:
            out.append(_sse(self.usage_chunk(msg.final)))
        return out


# --- running a completion ------------------------------------------------------------


class Completion:
    """service.complete, run in a task of its own that feeds a queue.

    Ending it is a task cancellation, as on gRPC: CancelledError reaches the
    engine await inside the service, whose cleanup aborts the engine request at
    once. (Closing the service's generator from outside only reaches its outer
    frame; the engine abort would then wait for garbage collection.)
    """

    _END = object()

    def __init__(self, service: CompletionService, req: pb.CompleteRequest, client: str, trace_context):
        self.queue: asyncio.Queue = asyncio.Queue()  # unbounded: the pump never waits on us
        self.task = asyncio.create_task(self._pump(service, req, client, trace_context), name=f"http-completion-{req.request_id}")

    async def _pump(self, service: CompletionService, req: pb.CompleteRequest, client: str, trace_context) -> None:
        try:
            async for msg in service.complete(req, client, trace_context):
                self.queue.put_nowait(msg)
        except RequestError as e:
            self.queue.put_nowait(e)
        except Exception as e:  # noqa: BLE001 - reported to the client as a server error
            log.exception("completion %s failed", req.request_id)
            self.queue.put_nowait(RequestError("INTERNAL", f"generation failed: {type(e).__name__}"))
        self.queue.put_nowait(self._END)

    async def next(self) -> pb.CompleteResponse | None:
        """The next message; None at the end; raises the service's RequestError."""
        item = await self.queue.get()
        if isinstance(item, RequestError):
            raise item
        return None if item is self._END else item

    def stop(self) -> None:
        """Cancel what is still running (no-op once finished)."""
        self.task.cancel()


async def _client_gone(receive: Receive) -> None:
    """Returns when the client hangs up. Only called once the body is read."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: asyncio.Future) -> bool:
    """Wait for `work`, watching the connection; False if the client left first."""
    watch = asyncio.ensure_future(_client_gone(request.receive))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    return work in done


class EventStream(StreamingResponse):
    """Server-sent events that stop their completion however the response ends:
    sent in full, client gone (Starlette cancels us), or server stopping."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], completion: Completion, headers: dict[str, str]):
        super().__init__(events, headers={"Cache-Control": "no-cache", **headers})
        self.completion = completion

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.completion.stop()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


# --- the app -----------------------------------------------------------------------------


def client_identity(request: Request, token_auth: bool = True) -> str:
    """Per-client limits key, written as the gRPC front end writes it (a token's
    hash, else the peer's host), so an editor's streams on both protocols share one quota.
    The token counts only when the server checks tokens: otherwise a client could
    send a fresh made-up token per call and escape its limit."""
    auth = request.headers.get("authorization", "") if token_auth else ""
    if auth:
        return "token:" + hashlib.sha256(auth.encode()).hexdigest()[:16]
    host = request.client.host if request.client else "unknown"
    return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"


class OpenAIApi:
    """The FastAPI app: routes, auth, body reading, and the two response modes."""

    def __init__(self, cfg: QuickdraftConfig, service: CompletionService, token: str | None):
        self.cfg = cfg
        self.service = service
        self.model = cfg.http.served_model_name or cfg.preset.name
        self.created = int(time.time())
        self._expected = f"Bearer {token}".encode() if token else None
        # Generous: JSON escapes inflate text; the service checks the exact limit.
        self.max_body = 8 * cfg.limits.max_request_bytes + 65536
        app = FastAPI(title="quickdraft", docs_url=None, redoc_url=None, openapi_url=None)
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_exception_handler(HTTPException, self._http_error)
        self.app = app

    @property
    def auth(self) -> bool:
        return self._expected is not None

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        # Unknown paths and methods, in the OpenAI shape too.
        code = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(exc.status_code, "INVALID_ARGUMENT")
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", None, code).response()

    def _authorized(self, request: Request) -> bool:
        if self._expected is None:
            return True
        got = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(got, self._expected)

    def _auth_error(self) -> Response:
        return ApiError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')", None, "UNAUTHENTICATED").response()

    async def _read(self, request: Request) -> Any:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise ApiError(413, f"request body is {length} bytes; the limit is {self.max_body} (limits.max_request_bytes = {self.cfg.limits.max_request_bytes})")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > self.max_body:
                raise ApiError(413, f"request body is over {self.max_body} bytes (limits.max_request_bytes = {self.cfg.limits.max_request_bytes})")
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"request body is not valid JSON: {e}") from None

    def _check_model(self, body: Any) -> None:
        model = body.get("model") if isinstance(body, dict) else None
        if model is not None and model != self.model:
            raise ApiError(404, f"model: the model `{model}` does not exist; this server serves `{self.model}` (GET /v1/models)", "model", "NOT_FOUND")

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, completion_call)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat_call)

    async def _serve(self, request: Request, translate) -> Response:
        if not self._authorized(request):
            return self._auth_error()
        try:
            body = await self._read(request)
            self._check_model(body)
            call = translate(body)
            request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
            if len(request_id) > MAX_REQUEST_ID:
                raise ApiError(400, f"X-Request-Id is {len(request_id)} characters; at most {MAX_REQUEST_ID}")
        except ApiError as e:
            # Refused before the service saw it: count it with the service's refusals.
            self.service.telemetry.reject(e.code)
            return e.response()
        call.req.request_id = request_id
        reply = Reply(call, request_id, self.model)
        headers = {"X-Request-Id": request_id}
        trace = self.service.telemetry.trace_context(dict(request.headers))
        completion = Completion(self.service, call.req, client_identity(request, self.auth), trace)
        handed_over = False
        first: asyncio.Future | None = None
        try:
            if call.stream:
                # Wait for the first message before answering, so that refusals
                # get their HTTP status instead of an event in a 200 stream.
                first = asyncio.ensure_future(completion.next())
                if not await _unless_gone(request, first):
                    return Response(status_code=499)  # nobody is listening
                msg = first.result()
                handed_over = True
                return EventStream(self._events(reply, completion, msg), completion, headers)
            if not await _unless_gone(request, completion.task):
                return Response(status_code=499)
            text, final = [], None
            while (msg := await completion.next()) is not None:
                text.append(msg.text)
                final = msg.final if msg.HasField("final") else final
            if final is None:
                raise RequestError("INTERNAL", "the completion ended without its final message")
            return JSONResponse(reply.body("".join(text), final), headers=headers)
        except RequestError as e:
            return from_service(e, call.names).response()
        finally:
            if first is not None and not first.done():
                first.cancel()
            if not handed_over:
                completion.stop()

    async def _events(self, reply: Reply, completion: Completion, msg: pb.CompleteResponse | None) -> AsyncIterator[bytes]:
        first = True
        try:
            while msg is not None:
                for event in reply.events(msg, first):
                    yield event
                first = False
                msg = await completion.next()
        except RequestError as e:
            # After the 200 went out: an error event, as OpenAI and vLLM send.
            yield _sse(from_service(e, reply.call.names).body())
        yield SSE_DONE

    async def models(self, request: Request) -> Response:
        if not self._authorized(request):
            return self._auth_error()
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "quickdraft",
            "root": self.cfg.target_path(),
            "max_model_len": self.cfg.max_model_len(),
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        if self.cfg.security.health_requires_auth and not self._authorized(request):
            return self._auth_error()
        engines, accepting = self.service.engines, self.service.admission.accepting
        # Draining for shutdown: the engine still serves its last streams, new ones are refused.
        state = engines.state if accepting else "draining"
        serving = engines.serving and accepting
        return JSONResponse({"status": "serving" if serving else state}, status_code=200 if serving else 503)


# --- the server ---------------------------------------------------------------------------


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside quickdraft's event loop: quickdraft owns SIGTERM/SIGINT
    (graceful drain of both protocols), so uvicorn must not take them."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _bind(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn: a taken port is a clear OSError, and port 0's pick is known at once."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise OSError(f"could not bind the HTTP API to {host}:{port} ({e.strerror}); pick another port with --http-port or http.port") from None
    return sock


class HttpServer:
    """The OpenAI-compatible endpoint of a QuickdraftServer: start() binds
    cfg.http.host:cfg.http.port (0 = a free port, then read `.port`)."""

    def __init__(self, cfg: QuickdraftConfig, service: CompletionService):
        self.cfg = cfg
        self.service = service
        self.api = OpenAIApi(cfg, service, read_auth_token(cfg))
        self.port = 0
        self._server: _EmbeddedUvicorn | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        cfg = self.cfg
        sock = _bind(cfg.http.host, cfg.http.port)
        self.port = sock.getsockname()[1]
        sec = cfg.security
        config = uvicorn.Config(
            self.api.app,
            loop="none",
            lifespan="off",
            ws="none",
            log_config=None,
            access_log=False,
            # In-flight streams get the same grace as gRPC's on shutdown (0: none).
            timeout_graceful_shutdown=cfg.server.grace_period_s,  # type: ignore[arg-type]
            ssl_certfile=sec.tls_cert_file,
            ssl_keyfile=sec.tls_key_file,
            ssl_ca_certs=sec.tls_client_ca_file,
            ssl_cert_reqs=ssl.CERT_REQUIRED if sec.tls_client_ca_file else ssl.CERT_NONE,
        )
        self._server = _EmbeddedUvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http-api")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP API stopped while starting")
            await asyncio.sleep(0.01)
        scheme = "https" if sec.tls_cert_file else "http"
        log.info("OpenAI-compatible HTTP API on %s://%s:%d/v1%s", scheme, cfg.http.host, self.port,  " (auth)" if self.api.auth else "")
        return self.port

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except Exception:  # noqa: BLE001 - stopping anyway
            log.exception("HTTP API stopped with an error")
        self._server = None
