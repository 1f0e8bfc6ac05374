"""Open documents, their parse trees, and the workspace folders they live in."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import tree_sitter as ts

from quickdraft.lsp_bridge.document import Document, Position
from quickdraft.lsp_bridge.languages import LanguageSpec, language_for
from quickdraft.lsp_bridge.syntax import SyntaxTree
from quickdraft.lsp_bridge.text import UTF16

log = logging.getLogger(__name__)

DEFAULT_MAX_FILE_BYTES = 1_000_000


def uri_to_path(uri: str) -> str:
    """Filesystem path of a ``file:`` URI; other schemes keep their path part."""
    parsed = urlparse(uri)
    path = unquote(parsed.path)
    if parsed.scheme == "file" and os.name == "nt" and path.startswith("/"):
        path = path[1:]
    return path


def path_to_uri(path: str) -> str:
    return Path(path).absolute().as_uri()


def real_folders(folders: Iterable[str]) -> list[str]:
    """Workspace folders with every symlink resolved (what ``confined_path`` compares with)."""
    return [str(Path(f).resolve()) for f in folders if f]


def confined_path(path: str, roots: Sequence[str]) -> str | None:
    """The real path of ``path`` if, symlinks and ``..`` resolved, it lies inside
    one of ``roots`` (real paths, see ``real_folders``); None otherwise.

    Everything the bridge reads from disk as prompt context passes here: a
    repository can hold ``cfg.py -> ~/.env`` or ``from ..... import x``, and
    what they reach must never be sent to the server."""
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None
    return str(real) if any(real.is_relative_to(root) for root in roots) else None


@dataclass
class Change:
    """One ``didChange`` content change: a range edit, or the whole text when ``start`` is None."""

    text: str
    start: Position | None = None
    end: Position | None = None


class OpenDocument:
    """A document the editor has open, with its language and parse tree."""

    def __init__(self, doc: Document, path: str, spec: LanguageSpec | None, skip_reason: str | None, *, background_parse: bool = False):
        self.doc = doc
        self.path = path
        self.spec = spec
        self.skip_reason = skip_reason
        self.background_parse = background_parse
        self.syntax: SyntaxTree | None = None
        self.reset_syntax()

    def reset_syntax(self) -> None:
        """A fresh tree (or none, for skipped documents and unknown languages)."""
        if self.spec is not None and self.skip_reason is None:
            self.syntax = SyntaxTree(self.spec, self.doc.data, background=self.background_parse)
        else:
            self.syntax = None

    @property
    def uri(self) -> str:
        return self.doc.uri

    @property
    def tree(self) -> ts.Tree | None:
        return self.syntax.tree(self.doc.data) if self.syntax is not None else None

    async def fresh_tree(self) -> ts.Tree | None:
        """The current tree, awaiting a background reparse instead of blocking on it."""
        return await self.syntax.fresh_tree(self.doc.data) if self.syntax is not None else None


def skip_reason_for(data: bytes, max_bytes: int) -> str | None:
    if len(data) > max_bytes:
        return f"larger than {max_bytes} bytes"
    if b"\x00" in data:
        return "binary (contains NUL bytes)"
    return None


class Workspace:
    def __init__(
        self,
        folders: Sequence[str] = (),
        *,
        encoding: str = UTF16,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        background_parse: bool = False,
    ):
        self.folders: list[str] = [os.path.abspath(f) for f in folders]
        self.real_folders: list[str] = real_folders(self.folders)
        self.encoding = encoding
        self.max_file_bytes = max_file_bytes
        # Reparse on a worker thread after each change (the server does; tests may not).
        self.background_parse = background_parse
        self._documents: dict[str, OpenDocument] = {}
        self._relative: dict[str, str] = {}

    # -- folders ---------------------------------------------------------

    def set_folders(self, folders: Iterable[str]) -> None:
        self.folders = [os.path.abspath(f) for f in folders if f]
        self.real_folders = real_folders(self.folders)
        self._relative.clear()

    def folder_of(self, path: str) -> str | None:
        best = None
        for folder in self.folders:
            if (path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)) and (
                best is None or len(folder) > len(best)
            ):
                best = folder
        return best

    def relative_path(self, path: str) -> str:
        """Path relative to its workspace folder (what the prompt shows)."""
        cached = self._relative.get(path)
        if cached is None:
            folder = self.folder_of(path)
            cached = os.path.basename(path) or path if folder is None else os.path.relpath(path, folder).replace(os.sep, "/")
            if len(self._relative) > 4096:
                self._relative.clear()
            self._relative[path] = cached
        return cached

    def repo_name(self, path: str) -> str:
        folder = self.folder_of(path) or (self.folders[0] if self.folders else "")
        return os.path.basename(folder.rstrip(os.sep))

    # -- documents -------------------------------------------------------

    def get(self, uri: str) -> OpenDocument | None:
        return self._documents.get(uri)

    def documents(self) -> list[OpenDocument]:
        return list(self._documents.values())

    def open(self, uri: str, text: str, *, language_id: str = "", version: int = 0) -> OpenDocument:
        doc = Document(uri, text, language_id=language_id, version=version, encoding=self.encoding)
        path = uri_to_path(uri)
        reason = skip_reason_for(doc.data, self.max_file_bytes)
        if reason:
            log.info("not completing in %s: %s", uri, reason)
        opened = OpenDocument(doc, path, language_for(language_id, path), reason, background_parse=self.background_parse)
        self._documents[uri] = opened
        return opened

    def change(self, uri: str, version: int, changes: Iterable[Change]) -> OpenDocument | None:
        opened = self._documents.get(uri)
        if opened is None:
            log.warning("didChange for a document that is not open: %s", uri)
            return None
        doc = opened.doc
        for change in changes:
            if change.start is None or change.end is None:
                edit = doc.replace_all(change.text)
            else:
                edit = doc.apply_change(change.text, change.start, change.end)
            if opened.syntax is not None:
                opened.syntax.edit(edit, doc.data)
        doc.version = version
        self._recheck_size(opened)
        return opened

    def close(self, uri: str) -> None:
        self._documents.pop(uri, None)

    def _recheck_size(self, opened: OpenDocument) -> None:
        """Edits can push a document past the size limit (or back under it)."""
        data = opened.doc.data
        too_big = len(data) > self.max_file_bytes
        if opened.skip_reason is None and too_big:
            opened.skip_reason = f"larger than {self.max_file_bytes} bytes"
            opened.reset_syntax()
            log.info("not completing in %s any more: %s", opened.uri, opened.skip_reason)
        elif opened.skip_reason is not None and not too_big and b"\x00" not in data:
            opened.skip_reason = None
            opened.reset_syntax()
            log.info("completing in %s again", opened.uri)

    def recently_edited(self, exclude: str, limit: int) -> list[OpenDocument]:
        """Other open documents, most recently edited first (never-edited ones excluded)."""
        edited = [d for d in self._documents.values() if d.uri != exclude and d.doc.last_edit_offset is not None]
        edited.sort(key=lambda d: d.doc.last_edit_time, reverse=True)
        return edited[:limit]
