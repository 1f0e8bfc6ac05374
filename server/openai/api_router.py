"""The FastAPI routes of the OpenAI-compatible API: what needs the HTTP
connection (reading the body under a size limit, noticing a client that hangs
up, the two response modes); the rest is ``serving``'s.

Endpoints: /v1/completions, /v1/chat/completions, /v1/completions/outcomes
(quickdraft's own: suggestion outcomes), /v1/models, /health.
Whatever a client sends, the answer is a response in the OpenAI error shape;
a 500 only for a failure of the server itself.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from quickdraft.server.openai.protocol import REQUEST_ID_HEADER, ApiError, Bounds, Call, chat_call, completion_call
from quickdraft.server.openai.serving import Completion, OpenAIServing

CLIENT_GONE = 499  # nginx's status for a client that closed the connection: nobody reads it


class ErrorResponse(JSONResponse):
    """An error body in ASCII JSON: it may quote client text, whatever it holds."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_response(e: ApiError) -> JSONResponse:
    return ErrorResponse(e.body(), status_code=e.status)


async def _read_body(request: Request, serving: OpenAIServing) -> bytes:
    """The body, refused with 413 on its Content-Length or, chunked or lying,
    as soon as the bytes received pass the limit: never buffered past it."""
    length = request.headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()):
            raise ApiError(400, f"Content-Length: {length[:40]!r} is not a byte count", "Content-Length")
        # int() of 4,300+ digits raises; more than 18 is over any limit anyway.
        if len(length) > 18 or int(length) > serving.max_body:
            raise serving.body_too_large(int(length) if len(length) <= 18 else None)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > serving.max_body:
            raise serving.body_too_large(None)
    return bytes(data)


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


async def _complete(serving: OpenAIServing, request: Request, translate: Callable[[Any, Bounds], Call]) -> Response:
    try:
        serving.authorize(request.headers)
    except ApiError as e:
        return error_response(e)
    client = serving.identify(request.headers, request.client.host if request.client else None)
    try:
        serving.check_content_type(request.headers.get("content-type"))
        data = await _read_body(request, serving)
        call = serving.parse(data, translate, request.headers.get("x-request-id"))
    except ApiError as e:
        return error_response(serving.refused(e, client))
    except ClientDisconnect:
        return Response(status_code=CLIENT_GONE)
    completion = serving.start(call, request.headers, client)
    headers = {REQUEST_ID_HEADER: call.req.request_id}
    handed_over = False
    first: asyncio.Future | None = None
    try:
        if call.stream:
            # Wait for the first message before answering, so that refusals
            # get their HTTP status instead of an event in a 200 stream.
            first = asyncio.ensure_future(completion.next())
            if not await _unless_gone(request, first):
                return Response(status_code=CLIENT_GONE)
            msg = first.result()
            handed_over = True
            return EventStream(completion.events(msg), completion, headers)
        if not await _unless_gone(request, completion.task):
            return Response(status_code=CLIENT_GONE)
        return JSONResponse(await completion.body(), headers=headers)
    except ApiError as e:
        return error_response(e)
    finally:
        if first is not None and not first.done():
            first.cancel()
        if not handed_over:
            completion.stop()


def build_app(serving: OpenAIServing) -> FastAPI:
    """The FastAPI app of ``serving``'s endpoints."""
    app = FastAPI(title="quickdraft", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(serving, request, completion_call)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(serving, request, chat_call)

    @app.post("/v1/completions/outcomes")
    async def completion_outcomes(request: Request) -> Response:
        try:
            serving.authorize(request.headers)
            client = serving.identify(request.headers, request.client.host if request.client else None)
            serving.check_content_type(request.headers.get("content-type"))
            data = await _read_body(request, serving)
            return JSONResponse(await serving.report_outcomes(data, client, request.headers))
        except ApiError as e:
            return error_response(e)
        except ClientDisconnect:
            return Response(status_code=CLIENT_GONE)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            serving.authorize(request.headers)
        except ApiError as e:
            return error_response(e)
        return JSONResponse(serving.models())

    @app.get("/health")
    async def health(request: Request) -> Response:
        try:
            status, body = serving.health(request.headers)
        except ApiError as e:
            return error_response(e)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        # Unknown paths and methods, in the OpenAI shape too.
        code = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}.get(exc.status_code, "INVALID_ARGUMENT")
        return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path[:200]}: {exc.detail}", None, code))

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> Response:
        # A bug, not the client's doing: the OpenAI shape still. Starlette re-raises
        # the exception after this answer, so the server logs it.
        return error_response(ApiError(500, f"internal error ({type(exc).__name__}); the server logs it", None, "INTERNAL"))

    return app
