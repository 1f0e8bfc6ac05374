"""One parse tree per open document, kept up to date incrementally.

Each edit is applied to the old tree (``Tree.edit``) as it arrives. The
reparse that reuses the old tree can run on a worker thread right after a
``didChange`` (tree-sitter releases the GIL while parsing), so that by the
time a completion is asked, after the debounce, the tree is usually fresh.
That matters for Python: tree-sitter-python re-lexes everything after an edit
at the end of a block (the most common place to type), which on a large file
costs tens of milliseconds. Edits that arrive while a parse runs are queued
and applied to its result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import tree_sitter as ts

from quickdraft.lsp_bridge.document import Edit
from quickdraft.lsp_bridge.languages import LanguageSpec

_local = threading.local()
_executor: ThreadPoolExecutor | None = None


def parser_for(spec: LanguageSpec) -> ts.Parser:
    """A parser for ``spec`` owned by the calling thread (parsers are not thread-safe)."""
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    parser = parsers.get(spec.name)
    if parser is None:
        parser = parsers[spec.name] = ts.Parser(spec.language)
    return parser


def _parse_worker() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tree-sitter")
    return _executor


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed meanwhile (shutdown)
        pass


def _edit_tree(tree: ts.Tree, edit: Edit) -> None:
    tree.edit(edit.start_byte, edit.old_end_byte, edit.new_end_byte, edit.start_point, edit.old_end_point, edit.new_end_point)


class SyntaxTree:
    def __init__(self, spec: LanguageSpec, data: bytes, *, background: bool = False):
        self.spec = spec
        self.background = background
        self._tree = parser_for(spec).parse(data)
        self._latest = data  # the document's bytes after the last edit
        self._stale = False
        self._job: Future | None = None  # a reparse running on the worker thread
        self._queued: list[Edit] = []  # edits that arrived while it runs

    def edit(self, edit: Edit, data: bytes) -> None:
        """Record one edit; ``data`` is the document after it."""
        self._latest = data
        self._collect()
        if self._job is not None:
            self._queued.append(edit)
        else:
            _edit_tree(self._tree, edit)
        self._stale = True
        if self.background and self._job is None:
            self._start()

    def tree(self, data: bytes) -> ts.Tree:
        """The tree for ``data`` (the document's current bytes), parsing now if needed."""
        if self._job is not None:
            self._job.result()  # rare: a synchronous reader while the worker parses
        self._collect()
        if self._stale:
            self._tree = parser_for(self.spec).parse(data, self._tree)
            self._stale = False
        return self._tree

    async def fresh_tree(self, data: bytes) -> ts.Tree:
        """The tree for ``data``, waiting for (not blocking on) background parses."""
        while self._job is not None:
            await asyncio.wrap_future(self._job)
            self._collect()
        return self.tree(data)

    def _start(self) -> None:
        # Trees are not thread-safe; the worker gets its own (cheap) copy.
        spec, old, data = self.spec, self._tree.copy(), self._latest
        self._job = job = _parse_worker().submit(lambda: parser_for(spec).parse(data, old))
        self._stale = False  # the job's result is current unless edits get queued
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (tests, benchmarks): results are collected on access
        # Edits queued meanwhile start the next reparse as soon as this one ends.
        job.add_done_callback(lambda _: _call_soon(loop, self._chain, job))

    def _chain(self, job: Future) -> None:
        if self._job is job:
            self._collect()
            if self._stale and self._job is None:
                self._start()

    def _collect(self) -> None:
        """Adopt a finished background parse and replay the edits queued meanwhile."""
        job = self._job
        if job is None or not job.done():
            return
        self._job = None
        try:
            self._tree = job.result()
        except Exception:  # keep the old tree; it was edited, a sync parse will follow
            self._stale = True
            return
        for edit in self._queued:
            _edit_tree(self._tree, edit)
        if self._queued:
            self._stale = True
            self._queued = []


def captures(
    spec: LanguageSpec,
    query_name: str,
    node: ts.Node,
    byte_range: tuple[int, int] | None = None,
    max_depth: int | None = None,
) -> dict[str, list[ts.Node]]:
    """Run one of the language's queries; ``{}`` if the language has none by that name."""
    query = spec.query(query_name)
    if query is None:
        return {}
    cursor = ts.QueryCursor(query)
    if byte_range is not None:
        cursor.set_byte_range(max(0, byte_range[0]), max(0, byte_range[1]))
    if max_depth is not None:
        cursor.set_max_start_depth(max_depth)
    return cursor.captures(node)


def matches(
    spec: LanguageSpec,
    query_name: str,
    node: ts.Node,
    byte_range: tuple[int, int] | None = None,
    max_depth: int | None = None,
) -> Iterable[dict[str, list[ts.Node]]]:
    query = spec.query(query_name)
    if query is None:
        return []
    cursor = ts.QueryCursor(query)
    if byte_range is not None:
        cursor.set_byte_range(max(0, byte_range[0]), max(0, byte_range[1]))
    if max_depth is not None:
        cursor.set_max_start_depth(max_depth)
    return [m for _, m in cursor.matches(node)]
