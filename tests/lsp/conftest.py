"""Fixtures for the LSP bridge tests.

- ``fake_server``: a real grpc.aio server on 127.0.0.1 with a fake Completion
  servicer (canned deltas, recorded requests, optionally blocking until the
  client cancels, so tests can see a cancel reach the server).
- ``start_bridge`` / ``Editor``: the bridge as a subprocess
  (``python -m quickdraft.lsp_bridge``) driven by pytest-lsp's client, with a
  reference copy of every document to compute positions independently.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionServicer, add_CompletionServicer_to_server

STATUS = "quickdraft/status"
_BREAK = re.compile(r"\r\n|\r|\n")


# -- fake gRPC server -------------------------------------------------------


class FakeCompletion(CompletionServicer):
    """Answers Complete with canned deltas; records what it was asked."""

    def __init__(self) -> None:
        self.deltas: list[str] = ["return a + b"]
        self.block = 0  # the next this-many Complete calls wait until the client cancels
        self.hang_after_deltas = False  # send the deltas, then wait until the client cancels
        self.requests: list[pb.CompleteRequest] = []
        self.metadata: list[dict[str, str]] = []  # call metadata, per Complete call
        # A stand-in tokenizer: prompt tokens = prompt bytes / this; over the limit is refused as the real server does.
        self.bytes_per_token = 4.0
        self.max_prompt_tokens = 1 << 30
        self.refused = 0
        self.cancelled = 0
        self.finished = 0
        self.info = pb.ServerInfo(
            server_version="fake",
            model="fake-model",
            state="serving",
            limits=pb.Limits(prompt_budget_tokens=1024, chars_per_token=4.0),
        )
        self._changed = asyncio.Condition()

    async def _bump(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate) -> None:
        """Wait (no timeout: pytest's own limits apply) until predicate() holds."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def Complete(self, request, context):
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        await self._bump()
        size = len(request.prefix.encode()) + len(request.suffix.encode()) + sum(len(f.path) + len(f.content.encode()) + 16 for f in request.context_files)
        tokens = max(1, round(size / self.bytes_per_token))
        if tokens > self.max_prompt_tokens:
            self.refused += 1
            context.set_trailing_metadata((("quickdraft-prompt-tokens", str(tokens)), ("quickdraft-prompt-limit", str(self.max_prompt_tokens))))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"prompt is {tokens} tokens; the limit is {self.max_prompt_tokens}")
        if self.block > 0:
            self.block -= 1
            await self._wait_for_cancel()
        for delta in self.deltas:
            yield pb.CompleteResponse(text=delta)
        if self.hang_after_deltas:
            await self._wait_for_cancel()
        self.finished += 1
        yield pb.CompleteResponse(final=pb.CompleteFinal(finish_reason=pb.FINISH_REASON_STOP, prompt_tokens=tokens))
        await self._bump()

    async def _wait_for_cancel(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            await asyncio.shield(self._bump())
            raise

    async def GetServerInfo(self, request, context):
        return self.info


class FakeServer:
    """A grpc.aio server around FakeCompletion that can be stopped and restarted on its port."""

    def __init__(self, fake: FakeCompletion):
        self.fake = fake
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, serving: bool = True) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        from grpc_health.v1.health import aio as health_aio

        server = grpc.aio.server()
        add_CompletionServicer_to_server(self.fake, server)
        # As the real server: NOT_SERVING while its engine starts.
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("quickdraft.v1.Completion", status)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


@pytest_asyncio.fixture
async def fake_server():
    server = FakeServer(FakeCompletion())
    await server.start()
    yield server
    await server.stop()


# -- reference positions ------------------------------------------------------


def units(text: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(text.encode("utf-8", "surrogatepass"))
    if encoding == "utf-32":
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def position_of(text: str, index: int, encoding: str) -> types.Position:
    """LSP position of ``text[:index]``'s end, computed independently of the bridge."""
    head = text[:index]
    breaks = list(_BREAK.finditer(head))
    line_start = breaks[-1].end() if breaks else 0
    # A position between "\r" and "\n" is not a position; tests never ask for one.
    return types.Position(line=len(breaks), character=units(head[line_start:], encoding))


# -- the bridge as an editor sees it ------------------------------------------


@dataclass
class StatusLog:
    states: list[str] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def record(self, params) -> None:
        state = params["state"] if isinstance(params, dict) else getattr(params, "state", None)
        self.states.append(state)
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, state: str) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: state in self.states)

    async def first(self) -> str:
        """The first state the bridge reported (waits for one)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.states)
        return self.states[0]


class Editor:
    """An editor's view: documents it holds and the requests it sends."""

    def __init__(self, client: LanguageClient, encoding: str, status: StatusLog, root: Path):
        self.client = client
        self.init_result: types.InitializeResult | None = None
        self.encoding = encoding
        self.status = status
        self.root = root
        self.texts: dict[str, str] = {}
        self.versions: dict[str, int] = {}

    def uri(self, name: str) -> str:
        return (self.root / name).as_uri()

    def open(self, name: str, text: str, language_id: str = "python") -> str:
        uri = self.uri(name)
        self.texts[uri] = text
        self.versions[uri] = 1
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id=language_id, version=1, text=text))
        )
        return uri

    def edit(self, uri: str, start: int, end: int, new_text: str) -> None:
        """Replace text[start:end] (str indices) like an editor would, incrementally."""
        text = self.texts[uri]
        rng = types.Range(position_of(text, start, self.encoding), position_of(text, end, self.encoding))
        self.texts[uri] = text[:start] + new_text + text[end:]
        self.versions[uri] += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
                content_changes=[types.TextDocumentContentChangePartial(range=rng, text=new_text)],
            )
        )

    def type(self, uri: str, at: int, new_text: str) -> None:
        self.edit(uri, at, at, new_text)

    def position(self, uri: str, index: int) -> types.Position:
        return position_of(self.texts[uri], index, self.encoding)

    def inline_params(self, uri: str, position: types.Position, invoked: bool = False) -> types.InlineCompletionParams:
        kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
        return types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=kind),
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=position,
        )

    async def inline(self, uri: str, index: int | None = None, *, position: types.Position | None = None):
        if position is None:
            position = self.position(uri, len(self.texts[uri]) if index is None else index)
        return await self.client.text_document_inline_completion_async(self.inline_params(uri, position))


def client_capabilities(encodings: list[str] | None, inline: bool = True, experimental: dict | None = None) -> types.ClientCapabilities:
    return types.ClientCapabilities(
        experimental=experimental,
        general=types.GeneralClientCapabilities(position_encodings=encodings) if encodings is not None else None,
        workspace=types.WorkspaceClientCapabilities(configuration=True),
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities() if inline else None,
            completion=types.CompletionClientCapabilities(),
        ),
    )


async def start_bridge(
    address: str,
    root: Path,
    *,
    encodings: list[str] | None = None,
    inline: bool = True,
    options: dict | None = None,
    experimental: dict | None = None,
) -> tuple[Editor, types.InitializeResult]:
    config = ClientServerConfig(server_command=[sys.executable, "-m", "quickdraft.lsp_bridge", "--server", address])
    client = await config.start()
    status = StatusLog()
    client.feature(STATUS)(lambda params: status.record(params))
    init_options = {"debounceMs": 0, **(options or {})}
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(encodings, inline, experimental),
            initialization_options=init_options,
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
        )
    )
    encoding = result.capabilities.position_encoding or "utf-16"
    editor = Editor(client, str(encoding.value if hasattr(encoding, "value") else encoding), status, root)
    editor.init_result = result
    return editor, result


@pytest_asyncio.fixture
async def bridge_factory(tmp_path):
    """Start bridges (``await bridge_factory(address, ...)``); all are shut down after the test."""
    started: list[Editor] = []

    async def start(address: str, **kwargs) -> Editor:
        editor, _ = await start_bridge(address, tmp_path, **kwargs)
        started.append(editor)
        return editor

    yield start
    for editor in started:
        await editor.client.shutdown_session()
        await editor.client.stop()


@pytest_asyncio.fixture
async def editor(fake_server, bridge_factory) -> Editor:
    """A bridge connected to the fake server, which it has seen up."""
    ed = await bridge_factory(fake_server.address)
    await ed.status.wait_for("up")
    return ed


@pytest.fixture
def repo(tmp_path) -> Path:
    return tmp_path
