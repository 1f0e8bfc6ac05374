"""One inline completion, from an editor position to shaped text.

Order matters for cost: cheap checks (unknown document, bad position, cache)
first; then the syntax gate; then the debounce, during which a newer request
for the same document cancels this one; then the prompt and the RPC.

Prefetch (``Settings.prefetch_after_accept``): when an edit inserts the whole
suggestion last shown (``CompletionCache.accepted``), the next completion is
asked at once, without debounce. Where the accepted text ends its line (a
whole-line suggestion: the usual case), the next thing to suggest comes after
Enter, so the completion asked is the next line's, before Enter is pressed:
the prompt of a blank line starts it afresh (``context.from_line_start``), so
it does not depend on the indentation the editor will give it, and the answer
is shaped for that indentation once Enter has made it. Elsewhere it is the
completion at the end of the accepted text. The editor's request for that
position joins the prefetch, or finds its answer; while the next line's is
pending, the editor's automatic request at the end of the accepted line is
answered with nothing, without the model (the suggestion ended that line, so
the model has nothing to add to it). Any other request for the document, and
any other edit, cancels it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from quickdraft.client import build_request
from quickdraft.lsp_bridge.backend import Backend, Outcome
from quickdraft.lsp_bridge.cache import CompletionCache
from quickdraft.lsp_bridge.context import Budget, ContextEngine, from_line_start
from quickdraft.lsp_bridge.document import Document
from quickdraft.lsp_bridge.postprocess import Completion, Draft, Shape, decide_shape, gate, next_line_shape
from quickdraft.lsp_bridge.settings import Settings
from quickdraft.lsp_bridge.workspace import OpenDocument, Workspace
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    opened: OpenDocument
    offset: int
    completion: Completion


def _outer_cancelled() -> bool:
    """Whether the task running us was itself cancelled (not just what it awaited)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling and cancelling())


class Completer:
    def __init__(self, workspace: Workspace, context: ContextEngine, backend: Backend, settings: Settings,
                 request_ids: Callable[[], str] | None = None):
        self.workspace = workspace
        self.context = context
        self.backend = backend
        self.settings = settings
        # The bridge names its requests, so that outcome reports can name them even
        # when it cancelled the stream itself (no final message, no server-made id).
        self.request_ids = request_ids
        self.cache = CompletionCache()
        self._inflight: dict[str, asyncio.Task] = {}
        # uri -> the prefetch in flight, or done and not yet asked for.
        self._prefetch: dict[str, _Prefetch] = {}
        self.sleep = asyncio.sleep  # the debounce wait (replaceable in tests)
        # What the completer did, for the editor's quickdraft/bridgeStats request (docs/lsp.md).
        self.stats: Counter[str] = Counter()

    async def complete(self, uri: str, line: int, character: int, *, invoked: bool = False) -> Result | None:
        """The completion at a position, or None. A newer call for the same
        document cancels this one (which then returns None)."""
        self.stats["requests"] += 1
        previous = self._inflight.get(uri)
        if previous is not None and not previous.done():
            previous.cancel()
        if not invoked and self._waits_for_enter(uri, line, character):
            # The accepted line is finished (its suggestion ended it), so the model
            # has nothing to add there: the next suggestion is the next line's, in flight.
            self.stats["prefetch_landing_skipped"] += 1
            return None
        prefetched = self._take_prefetch(uri, line, character)
        if prefetched is not None:
            task = asyncio.ensure_future(self._await_prefetch(prefetched))
            # Cancelled (superseded, $/cancelRequest), even before it ran: the prefetch goes too.
            task.add_done_callback(lambda t, pending=prefetched: self._cancel_joined(t, pending))
        else:
            task = asyncio.ensure_future(self._complete(uri, line, character, invoked))
        self._inflight[uri] = task
        try:
            return await task
        except asyncio.CancelledError:
            if _outer_cancelled():
                raise  # $/cancelRequest: pygls answers RequestCancelled
            return None  # superseded by a newer request
        finally:
            if self._inflight.get(uri) is task:
                del self._inflight[uri]

    # -- prefetch -------------------------------------------------------------

    def on_change(self, uri: str) -> None:
        """After the editor's edit to ``uri``: a prefetch for an older version is
        cancelled (the user moved on), unless it is the next line's and the edit
        was Enter at the end of the accepted text; with prefetch on, an edit that
        inserted the whole suggestion shown last starts one."""
        pending = self._prefetch.get(uri)
        opened = self.workspace.get(uri)
        if pending is not None and (opened is None or pending.version != opened.doc.version):
            entered = _entered(opened.doc, pending) if opened is not None else None
            if entered is None:
                self._drop_prefetch(uri)
            else:
                pending.version, pending.offset, pending.next_line = opened.doc.version, entered, None
                pending.entered = True
        if not self.settings.prefetch_after_accept or opened is None:
            return
        landing = self.cache.accepted(opened)
        if landing is None or not self.settings.enabled or opened.skip_reason is not None:
            return
        if opened.doc.language_id in self.settings.disabled_languages:
            return
        version = opened.doc.version
        self._drop_prefetch(uri)
        shape = next_line_shape(opened, landing) if self.settings.blank_line_from_line_start else None
        if shape is not None:
            task = asyncio.ensure_future(self._ask_next_line(opened, landing, shape))
            doc = opened.doc
            pending = _Prefetch(version, landing, task, _NextLine(landing, len(doc.data), doc.data[max(0, landing - _TAIL):landing]),
                                uri=uri, multiline=shape.multiline)
            self.stats["prefetch_next_line"] += 1
        else:
            task = asyncio.ensure_future(self._serve(opened, landing, version, invoked=True))
            pending = _Prefetch(version, landing, task)
        task.add_done_callback(_log_failure)
        self._prefetch[uri] = pending
        self.stats["prefetch_started"] += 1

    def forget(self, uri: str) -> None:
        """The document was opened afresh or closed: nothing of it is reused."""
        self._drop_prefetch(uri)
        self.cache.forget(uri)

    def _take_prefetch(self, uri: str, line: int, character: int) -> "_Prefetch | None":
        """The prefetch for exactly this position of the current version, handed
        to the request (and forgotten here); any other prefetch of ``uri`` is
        cancelled, but the next line's keeps waiting for Enter through a request
        at the end of the accepted text (editors ask there after accepting)."""
        pending = self._prefetch.get(uri)
        if pending is None:
            return None
        opened = self.workspace.get(uri)
        doc = opened.doc if opened is not None else None
        offset = doc.offset_at(line, character) if doc is not None and doc.is_valid_position(line, character) else None
        if doc is None or pending.version != doc.version or offset != pending.offset:
            self._drop_prefetch(uri)
            return None
        if pending.next_line is not None:
            return None  # asked at the end of the accepted text: not the next line yet
        del self._prefetch[uri]
        self.stats["prefetch_used"] += 1
        return pending

    def _waits_for_enter(self, uri: str, line: int, character: int) -> bool:
        """Whether a next-line prefetch of ``uri`` waits for Enter at this very position."""
        pending = self._prefetch.get(uri)
        if pending is None or pending.next_line is None:
            return False
        opened = self.workspace.get(uri)
        doc = opened.doc if opened is not None else None
        return (doc is not None and doc.version == pending.version and doc.is_valid_position(line, character)
                and doc.offset_at(line, character) == pending.next_line.landing)

    def _drop_prefetch(self, uri: str) -> None:
        pending = self._prefetch.pop(uri, None)
        if pending is not None and not pending.task.done():
            pending.task.cancel()
            self.stats["prefetch_cancelled"] += 1

    async def _await_prefetch(self, pending: "_Prefetch") -> Result | None:
        if not pending.task.done():
            self.stats["prefetch_joined"] += 1
        got = await pending.task
        return await self._shape_next_line(pending, got) if pending.entered else got

    def _cancel_joined(self, request: asyncio.Task, pending: "_Prefetch") -> None:
        if request.cancelled() and not pending.task.done():
            pending.task.cancel()
            self.stats["prefetch_cancelled"] += 1

    async def _ask_next_line(self, opened: OpenDocument, landing: int, guess: Shape) -> "_Raw":
        """The model's unshaped answer for the line after ``landing`` (the end of
        its line), asked before that line exists; ``guess`` (next_line_shape)
        sizes it and says when enough has streamed."""
        if not self.backend.available:
            return _Raw(False, "", "")
        await opened.fresh_tree()
        doc = opened.doc
        line_end = doc.line_range(doc.line_of(landing))[1]
        newline = _line_break_at(doc.data, line_end)
        parts: list[str] = []

        def build(budget: Budget):
            request, _ = make_request(self.workspace, self.context, opened, landing, budget, self.settings)
            # The blank line after this one, started afresh: the prefix ends with
            # this line's break, the suffix starts after the rest of this line.
            request.prefix += newline
            request.suffix = request.suffix.partition("\n")[2]
            request.max_tokens = self.settings.max_tokens if guess.multiline else min(self.settings.max_tokens, self.settings.single_line_max_tokens)
            del request.stop[:]
            if self.request_ids is not None:
                request.request_id = self.request_ids()
            parts.clear()
            draft = Draft(guess)

            def on_text(delta: str) -> bool:
                parts.append(delta)
                return draft.feed(delta)

            return request, on_text

        self.stats["model_requests"] += 1
        language = doc.language_id or (opened.spec.name if opened.spec else "")
        sized = await self.backend.complete_within_budget(build, document=opened.uri, language=language)
        return _Raw(sized.outcome is Outcome.ANSWERED, "".join(parts), sized.request.request_id)

    async def _shape_next_line(self, pending: "_Prefetch", raw: "_Raw") -> Result | None:
        """The next line's answer, shaped for the line Enter made (its indentation,
        its block or not), and remembered as if asked there."""
        opened = self.workspace.get(pending.uri) if pending.uri else None
        if opened is None or not raw.answered or opened.doc.version != pending.version:
            return None
        doc, offset = opened.doc, pending.offset
        tree = await opened.fresh_tree()
        if doc.version != pending.version:
            return None
        settings = self.settings
        if gate(opened, tree, offset, in_comments=settings.enable_in_comments, in_strings=settings.enable_in_strings) is not None:
            return None
        shape = decide_shape(opened, tree, offset)
        if not shape.on_blank_line:
            return None
        # A one-line guess streamed one line only: shown as one line even where a block is wanted.
        shape = replace(shape, from_line_start=True, multiline=shape.multiline and pending.multiline)
        draft = Draft(shape)
        draft.feed(raw.text)
        completion = draft.result()
        if completion is not None:
            completion = replace(completion, request_id=raw.request_id)
        self.cache.put(opened, offset, completion)
        return Result(opened, offset, completion) if completion is not None else None

    # -- one completion -------------------------------------------------------

    async def _complete(self, uri: str, line: int, character: int, invoked: bool) -> Result | None:
        settings = self.settings
        opened = self.workspace.get(uri)
        if opened is None:
            log.debug("completion for a document that is not open: %s", uri)
            return None
        if not settings.enabled or opened.skip_reason is not None:
            return None
        if opened.doc.language_id in settings.disabled_languages:
            return None
        doc = opened.doc
        if not doc.is_valid_position(line, character):
            log.debug("completion past the end of %s: %d:%d", uri, line, character)
            return None
        return await self._serve(opened, doc.offset_at(line, character), doc.version, invoked)

    async def _serve(self, opened: OpenDocument, offset: int, version: int, invoked: bool) -> Result | None:
        settings = self.settings
        doc = opened.doc
        uri = opened.uri
        hit, cached = self.cache.get(uri, version, offset)
        if hit:
            self.stats["cache_hits"] += 1
            return Result(opened, offset, cached) if cached is not None else None
        typed = self.cache.typed_through(opened, offset)
        if typed is not None:
            self.stats["typed_through"] += 1
            return Result(opened, offset, typed)
        if not self.backend.available:
            return None

        tree = await opened.fresh_tree()
        if doc.version != version:
            return None  # edited while the tree was being brought up to date
        reason = gate(opened, tree, offset, in_comments=settings.enable_in_comments, in_strings=settings.enable_in_strings)
        if reason is not None:
            log.debug("no completion at %s:%d: %s", uri, offset, reason)
            return None
        if settings.debounce_ms > 0 and not invoked:
            await self.sleep(settings.debounce_ms / 1000)
            if doc.version != version:
                return None

        self.stats["model_requests"] += 1
        answered, completion = await self._ask_model(opened, offset)
        if doc.version != version:
            return None  # the document moved on while the model was writing
        if answered:
            self.cache.put(opened, offset, completion)
        return Result(opened, offset, completion) if completion is not None else None

    async def _ask_model(self, opened: OpenDocument, offset: int) -> tuple[bool, Completion | None]:
        drafts: list[Draft] = []

        def build(budget: Budget):
            request, shape = make_request(self.workspace, self.context, opened, offset, budget, self.settings)
            if self.request_ids is not None:
                request.request_id = self.request_ids()
            drafts.append(Draft(shape))
            return request, drafts[-1].feed

        language = opened.doc.language_id or (opened.spec.name if opened.spec else "")
        sized = await self.backend.complete_within_budget(build, document=opened.uri, language=language)
        completion = drafts[-1].result()
        if completion is not None:
            completion = replace(completion, request_id=sized.request.request_id)
        return sized.outcome is Outcome.ANSWERED, completion


@dataclass(frozen=True)
class _NextLine:
    """What Enter at the end of an accepted line must leave the document as."""

    landing: int  # where the accepted text ended: the end of its line
    length: int  # the document's length (bytes) then
    tail: bytes  # its last bytes before ``landing``, as a check that nothing else moved


@dataclass(frozen=True)
class _Raw:
    """The model's answer for a line not yet made, before shaping."""

    answered: bool
    text: str
    request_id: str


@dataclass
class _Prefetch:
    version: int
    offset: int
    task: asyncio.Task
    # Set while it is the next line's and Enter has not been pressed yet.
    next_line: _NextLine | None = None
    # The next line's, and Enter was pressed: ``offset`` is that line's cursor.
    entered: bool = False
    uri: str = ""
    multiline: bool = False


_TAIL = 64
_LINE_BREAK_INDENT = re.compile(rb"(?:\r\n|\n|\r)[ \t]*")


def _line_break_at(data: bytes, line_end: int) -> str:
    """The line break that ends the line at ``line_end`` (a line feed at the end of the document)."""
    if data.startswith(b"\r\n", line_end):
        return "\r\n"
    return "\r" if data.startswith(b"\r", line_end) else "\n"


def _entered(doc: Document, pending: _Prefetch) -> int | None:
    """The cursor on the new line when the document's edit since ``pending`` was
    Enter at the end of the accepted text (a line break and indentation
    inserted there, as editors do); None for any other edit."""
    nl = pending.next_line
    end = doc.last_edit_offset
    if nl is None or end is None or end <= nl.landing or len(doc.data) - nl.length != end - nl.landing:
        return None
    if not _LINE_BREAK_INDENT.fullmatch(doc.data, nl.landing, end):
        return None
    if doc.data[nl.landing - len(nl.tail) : nl.landing] != nl.tail:
        return None
    return end


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("prefetch failed", exc_info=task.exception())


def make_request(
    workspace: Workspace, context: ContextEngine, opened: OpenDocument, offset: int, budget: Budget, settings: Settings
) -> tuple[pb.CompleteRequest, Shape]:
    """The CompleteRequest for a cursor, and the shape its answer must take."""
    tree = opened.tree
    shape = decide_shape(opened, tree, offset)
    prompt = context.build(opened, offset, budget)
    prefix, suffix = prompt.prefix, prompt.suffix
    if settings.blank_line_from_line_start and shape.on_blank_line:
        moved = from_line_start(prefix, suffix)
        if moved is not None:
            (prefix, suffix), shape = moved, replace(shape, from_line_start=True)
    request = build_request(
        prefix=prefix,
        suffix=suffix,
        context_files=prompt.context_files,
        language_id=opened.doc.language_id or (opened.spec.name if opened.spec else ""),
        file_path=workspace.relative_path(opened.path),
        repo_name=workspace.repo_name(opened.path),
        max_tokens=settings.max_tokens if shape.multiline else min(settings.max_tokens, settings.single_line_max_tokens),
        # One line wanted: let the server stop at the line's end instead of
        # streaming more; on a blank line the Draft stops the stream instead,
        # after the first line that is not blank (see postprocess._one_line).
        stop=() if shape.multiline or shape.on_blank_line else ("\n",),
        latency_class="inline",
        # The bridge fits its own prompts and learns its bytes-per-token ratio
        # from the server's count: a prompt the server cut would skew it.
        strict_prompt=True,
    )
    return request, shape
