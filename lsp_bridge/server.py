"""The language server: pygls handlers that adapt LSP messages to the bridge's objects.

Handlers stay thin; the work is in ``Workspace`` (documents and trees),
``Completer`` (one completion) and ``Backend`` (the gRPC server).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Any

from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder
from pygls.exceptions import JsonRpcException
from pygls.io_ import StdoutWriter, run_async
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from quickdraft import __version__
from quickdraft.client.request import is_loopback_host
from quickdraft.lsp_bridge.backend import REFUSED, Backend, BackendConfig
from quickdraft.lsp_bridge.completer import Completer, Result
from quickdraft.lsp_bridge.context import ContextEngine
from quickdraft.lsp_bridge.outcomes import ACCEPT_COMMAND, CAPABILITY, NOTIFICATION, OutcomeReporter
from quickdraft.lsp_bridge.settings import SECTION, Settings
from quickdraft.lsp_bridge.symbols import SymbolIndex
from quickdraft.lsp_bridge.text import UTF8, UTF16
from quickdraft.lsp_bridge.workspace import Change, Workspace, uri_to_path

log = logging.getLogger(__name__)

STATUS_NOTIFICATION = "quickdraft/status"
STATS_REQUEST = "quickdraft/bridgeStats"
_IGNORED = object()  # a message that could not be read and was already answered


class BridgeProtocol(LanguageServerProtocol):
    """pygls' protocol with three changes:

    - position encoding: UTF-8 when the client offers it, else UTF-16;
    - documents live in the bridge's own ``Workspace`` (with parse trees), so
      pygls' copy is not kept up to date on every keystroke;
    - a request whose params cannot be read gets an error response instead
      of silence, and unreadable messages are logged, not reported to the user.
    """

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        general = params.capabilities.general
        if general is not None and general.position_encodings:
            offered = list(general.position_encodings)
            general.position_encodings = [UTF8] if UTF8 in offered else [UTF16]
        return (yield from super().lsp_initialize(params))

    def _user_handler(self, method: str, params: Any):
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        yield from self._user_handler(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        yield from self._user_handler(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        yield from self._user_handler(types.TEXT_DOCUMENT_DID_CLOSE, params)

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as err:
            msg_id = data.get("id")
            if "method" in data and isinstance(msg_id, (int, str)) and not isinstance(msg_id, bool):
                self._send_response(msg_id, error=err.to_response_error())
            return _IGNORED

    def handle_message(self, message):
        if message is _IGNORED:
            return
        if not hasattr(message, "jsonrpc"):
            log.warning("ignoring a message that is not JSON-RPC: %.200r", message)
            return
        super().handle_message(message)


class BridgeServer(LanguageServer):
    """``editor_sets_connection``: whether initializationOptions may set the
    connection settings (settings.CONNECTION). True over stdio, where the
    client is the editor that started the bridge; False over TCP, where the
    client is whoever connects to the port."""

    def __init__(self, settings: Settings | None = None, *, editor_sets_connection: bool = True):
        super().__init__(
            "quickdraft-lsp",
            __version__,
            protocol_cls=BridgeProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.settings = settings or Settings()
        self.editor_sets_connection = editor_sets_connection
        self.documents = Workspace(max_file_bytes=self.settings.max_file_bytes, background_parse=True)
        self.symbols = SymbolIndex(self.settings.max_file_bytes)
        self.context = ContextEngine(self.documents, self.symbols, repository_context=self.settings.repository_context,
                                     stable=self.settings.stable_prompt)
        self.backend: Backend | None = None
        self.completer: Completer | None = None
        self.outcomes = OutcomeReporter()
        # Set from the client's capabilities: items carry the accept command only then.
        self.editor_reports_outcomes = False

    def start_io(self, stdin=None, stdout=None) -> None:
        """Serve LSP over stdio, reading stdin through an asyncio pipe.

        pygls reads stdin on a thread, one hop per header line and body; a pipe
        transport saves those hops on every message (visible in the bridge's
        latency). Falls back to pygls' reader where stdin is not a pipe.
        """
        stdin = stdin or sys.stdin.buffer
        stdout = stdout or sys.stdout.buffer
        try:
            asyncio.run(self._serve_pipe(stdin, stdout))
        except _NotAPipe:
            super().start_io(stdin, stdout)
        except (KeyboardInterrupt, BrokenPipeError):
            pass
        finally:
            # An "exit" notification ends in SystemExit (pygls' exit code: 0
            # after "shutdown", 1 without), which passes through.
            self.shutdown()

    def start_tcp(self, host: str, port: int) -> None:
        # The bridge has no authentication and reads workspace files into
        # prompts: a port reachable from other machines would serve anyone.
        if not is_loopback_host(host):
            raise ValueError(f"--tcp {host}:{port}: the language server only listens on loopback (127.0.0.1, ::1, localhost)")
        super().start_tcp(host, port)

    async def _serve_pipe(self, stdin, stdout) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
        except (ValueError, OSError, NotImplementedError) as err:
            raise _NotAPipe() from err
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout))
        await run_async(
            stop_event=self._stop_event,
            reader=_PipeReader(reader),
            protocol=self.protocol,
            logger=logging.getLogger("pygls.io_"),
            error_handler=self.report_server_error,
        )

    def report_server_error(self, error: Exception, source) -> None:
        # Logged, not shown: a malformed message is the client's problem, not the user's.
        log.error("%s: %s", getattr(source, "__name__", source), error)

    # -- settings and backend -------------------------------------------

    def backend_config(self) -> BackendConfig:
        s = self.settings
        return BackendConfig(
            address=s.server,
            token=s.read_token(),
            tls=s.tls,
            tls_root_cert=s.read_root_cert(),
            request_timeout_s=s.request_timeout_ms / 1000,
        )

    def start_backend(self) -> None:
        self.backend = Backend(self.backend_config(), on_state=self._on_backend_state)
        self.completer = Completer(self.documents, self.context, self.backend, self.settings, request_ids=self.outcomes.new_request_id)
        self.backend.start()
        self.outcomes.send = self.backend.report_outcomes
        self.outcomes.start()

    def apply_settings(self, settings: Settings) -> None:
        """Take new settings now; a new server address reconnects in the background."""
        self.settings = settings
        self.documents.max_file_bytes = settings.max_file_bytes
        self.symbols.max_file_bytes = settings.max_file_bytes
        self.context.repository_context = settings.repository_context
        self.context.stable = settings.stable_prompt
        if self.completer is not None:
            self.completer.settings = settings
        if self.backend is not None and self.backend.config != self.backend_config():
            asyncio.ensure_future(self.backend.reconfigure(self.backend_config()))

    def apply_runtime_options(self, options: Any, source: str) -> None:
        """Settings from the editor after start: the connection ones are ignored (settings.CONNECTION)."""
        settings, ignored = self.settings.merged_at_runtime(options)
        if ignored:
            message = (
                f"quickdraft: ignoring {', '.join(ignored)} from {source}: the server connection is set when the "
                "language server starts (user settings or the command line); restart it to change them"
            )
            log.warning("%s", message)
            self.window_log_message(types.LogMessageParams(types.MessageType.Warning, message))
        self.apply_settings(settings)

    def _on_backend_state(self, state: str, info) -> None:
        payload = {"state": state, "server": self.settings.server}
        if info is not None:
            payload["model"] = info.model
            payload["serverVersion"] = info.server_version
        error = self.backend.error if self.backend is not None else None
        if state == REFUSED and error:
            payload["error"] = error
        self.protocol.notify(STATUS_NOTIFICATION, payload)
        if state == REFUSED and error:
            # Shown, not only logged: completions stay off until the user fixes the settings.
            self.window_show_message(types.ShowMessageParams(types.MessageType.Error, f"quickdraft: {error}"))
            self.window_log_message(types.LogMessageParams(types.MessageType.Error, f"quickdraft: {error}"))
            return
        level = types.MessageType.Info if state == "up" else types.MessageType.Warning
        self.window_log_message(types.LogMessageParams(level, f"quickdraft server {self.settings.server} is {state}"))


class _NotAPipe(Exception):
    pass


class _PipeReader:
    """The reader interface pygls' message loop wants, over an asyncio StreamReader."""

    def __init__(self, reader: asyncio.StreamReader):
        self._reader = reader

    async def readline(self) -> bytes:
        try:
            return await self._reader.readline()
        except ValueError:  # a "header" longer than the limit: skip it, not a header
            return b"X-Skipped: 1\r\n"

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError as err:  # end of input
            return err.partial


def _changes(params: types.DidChangeTextDocumentParams) -> list[Change]:
    out = []
    for change in params.content_changes:
        if isinstance(change, types.TextDocumentContentChangePartial):
            r = change.range
            out.append(Change(change.text, (r.start.line, r.start.character), (r.end.line, r.end.character)))
        else:
            out.append(Change(change.text))
    return out


def _folders(params: types.InitializeParams) -> list[str]:
    if params.workspace_folders:
        return [uri_to_path(f.uri) for f in params.workspace_folders]
    if params.root_uri:
        return [uri_to_path(params.root_uri)]
    if params.root_path:
        return [params.root_path]
    return []


def _inline_items(result: Result | None, position: types.Position, suggestion_id: str | None = None) -> types.InlineCompletionList:
    if result is None:
        return types.InlineCompletionList(items=[])
    doc = result.opened.doc
    end_line, end_char = doc.position_at(result.offset + result.completion.replace_bytes)
    item = types.InlineCompletionItem(
        insert_text=result.completion.text,
        range=types.Range(start=position, end=types.Position(end_line, end_char)),
    )
    if suggestion_id is not None:
        # Run by the editor on accept; its argument is what outcome reports name (docs/lsp.md).
        item.command = types.Command(title="quickdraft: suggestion accepted", command=ACCEPT_COMMAND,
                                     arguments=[{"suggestionId": suggestion_id}])
    return types.InlineCompletionList(items=[item])


def _suggestion_id(ls: BridgeServer, result: Result | None) -> str | None:
    """The opaque id an outcome-reporting editor echoes back; None for other editors."""
    if result is None or not ls.editor_reports_outcomes or not result.completion.request_id:
        return None
    language = result.opened.doc.language_id or (result.opened.spec.name if result.opened.spec else "")
    return ls.outcomes.suggestion_id(result.completion.request_id, language, len(result.completion.text))


def _completion_items(result: Result | None, position: types.Position) -> types.CompletionList:
    """The same completion as a classic completion item, for clients without
    inline completion: its edit starts at the word being typed so that the
    client's filtering keeps it."""
    if result is None:
        return types.CompletionList(is_incomplete=True, items=[])
    doc = result.opened.doc
    line_start = doc.line_starts[doc.line_of(result.offset)]
    before = doc.slice(line_start, result.offset)
    word = before[len(before.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$")) :]
    word_start = doc.position_at(result.offset - len(word.encode()))
    end = doc.position_at(result.offset + result.completion.replace_bytes)
    text = word + result.completion.text
    first_line = text.split("\n", 1)[0]
    item = types.CompletionItem(
        label=first_line.strip() + (" …" if "\n" in text else ""),
        kind=types.CompletionItemKind.Text,
        detail="quickdraft",
        filter_text=text,
        sort_text="0",
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(
            range=types.Range(start=types.Position(*word_start), end=types.Position(*end)),
            new_text=text,
        ),
    )
    return types.CompletionList(is_incomplete=True, items=[item])


def create_server(settings: Settings | None = None, *, editor_sets_connection: bool = True) -> BridgeServer:
    server = BridgeServer(settings, editor_sets_connection=editor_sets_connection)

    @server.feature(types.INITIALIZE)
    def initialize(ls: BridgeServer, params: types.InitializeParams) -> None:
        if ls.editor_sets_connection:
            ls.apply_settings(ls.settings.merged(params.initialization_options))
        else:
            ls.apply_runtime_options(params.initialization_options, "initializationOptions over --tcp")
        ls.documents.set_folders(_folders(params))
        ls.documents.encoding = ServerCapabilitiesBuilder.choose_position_encoding(params.capabilities)
        experimental = params.capabilities.experimental
        ls.editor_reports_outcomes = isinstance(experimental, dict) and experimental.get(CAPABILITY) is True
        text_document = params.capabilities.text_document
        no_inline = text_document is None or text_document.inline_completion is None
        if no_inline and types.TEXT_DOCUMENT_COMPLETION not in ls.protocol.fm.features:
            # No inline completion in this client: serve the classic completion list instead.
            ls.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", "(", " "]))(
                completion
            )
        log.info("initialized: folders=%s encoding=%s server=%s", ls.documents.folders, ls.documents.encoding, ls.settings.server)

    @server.feature(types.INITIALIZED)
    def initialized(ls: BridgeServer, params: types.InitializedParams) -> None:
        if ls.backend is None:
            ls.start_backend()

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: BridgeServer, params: None) -> None:
        await ls.outcomes.close()
        if ls.backend is not None:
            await ls.backend.close()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: BridgeServer, params: types.DidChangeConfigurationParams) -> None:
        if isinstance(params.settings, dict) and params.settings:
            ls.apply_runtime_options(params.settings, "workspace/didChangeConfiguration")
        else:
            # Pull model: the notification only says "something changed".
            asyncio.ensure_future(pull_configuration(ls))

    async def pull_configuration(ls: BridgeServer) -> None:
        try:
            pulled = await ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
            )
        except Exception as err:  # the client may not support workspace/configuration
            log.warning("workspace/configuration failed: %s", err)
            return
        if pulled:
            ls.apply_runtime_options(pulled[0], "workspace/configuration")

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_folders(ls: BridgeServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
        folders = [f for f in ls.documents.folders]
        for removed in params.event.removed or []:
            path = uri_to_path(removed.uri)
            folders = [f for f in folders if f != path]
        folders += [uri_to_path(f.uri) for f in params.event.added or []]
        ls.documents.set_folders(folders)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: BridgeServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        opened = ls.documents.open(doc.uri, doc.text, language_id=doc.language_id, version=doc.version)
        if opened.skip_reason is not None:
            ls.window_log_message(
                types.LogMessageParams(types.MessageType.Info, f"quickdraft: not completing in {doc.uri}: {opened.skip_reason}")
            )
        if ls.completer is not None:
            ls.completer.forget(doc.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: BridgeServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        try:
            ls.documents.change(uri, params.text_document.version, _changes(params))
        except Exception:
            # Out of sync is worse than unknown: forget the document until it is reopened.
            log.exception("could not apply a change to %s; dropping it", uri)
            ls.documents.close(uri)
        if ls.completer is not None:
            ls.completer.on_change(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: BridgeServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.documents.close(uri)
        ls.context.forget(uri)
        if ls.completer is not None:
            ls.completer.forget(uri)

    async def _complete(ls: BridgeServer, document: types.TextDocumentIdentifier, position: types.Position, invoked: bool):
        if ls.completer is None:
            return None
        try:
            return await ls.completer.complete(document.uri, position.line, position.character, invoked=invoked)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("completion failed at %s:%d:%d", document.uri, position.line, position.character)
            return None

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: BridgeServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
        invoked = params.context is not None and params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        result = await _complete(ls, params.text_document, params.position, invoked)
        return _inline_items(result, params.position, _suggestion_id(ls, result))

    @server.feature(NOTIFICATION)
    def completion_outcome(ls: BridgeServer, params: Any) -> None:
        # Queued for the server in batches; never blocks, never fails the editor.
        ls.outcomes.on_notification(params)

    @server.feature(STATS_REQUEST)
    def bridge_stats(ls: BridgeServer, params: Any) -> dict[str, int]:
        # Counters since the bridge started (docs/lsp.md): no text, no ids.
        return dict(ls.completer.stats) if ls.completer is not None else {}

    async def completion(ls: BridgeServer, params: types.CompletionParams) -> types.CompletionList:
        invoked = params.context is not None and params.context.trigger_kind == types.CompletionTriggerKind.Invoked
        result = await _complete(ls, params.text_document, params.position, invoked)
        return _completion_items(result, params.position)

    return server
