"""Definitions and imports of source files, found with tree-sitter queries.

Open documents are indexed per version, files on disk per (mtime, size); both
are cached, so a keystroke only pays for files that changed since last time.
Imports are resolved to workspace files for Python (absolute and relative
modules, packages) and for relative JavaScript/TypeScript specifiers. Files
on disk are read only inside the workspace folders, symlinks resolved
(``workspace.confined_path``), checked again whenever a file is re-stat'ed.
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tree_sitter as ts

from quickdraft.lsp_bridge.document import line_starts_of
from quickdraft.lsp_bridge.languages import LanguageSpec, language_for_path
from quickdraft.lsp_bridge.syntax import captures, matches, parser_for
from quickdraft.lsp_bridge.text import decode
from quickdraft.lsp_bridge.workspace import OpenDocument, confined_path, real_folders

log = logging.getLogger(__name__)

# A definition longer than this is shown by its first lines only.
MAX_DEFINITION_LINES = 40
_DISK_CACHE_SIZE = 256
_STAT_INTERVAL_S = 2.0
_JS_EXTENSIONS = (".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", ".d.ts")


@dataclass(frozen=True)
class Definition:
    name: str
    path: str
    start_line: int
    end_line: int  # inclusive
    start_byte: int
    end_byte: int


@dataclass
class FileSymbols:
    """What one file defines and imports."""

    path: str
    spec: LanguageSpec
    data: bytes
    line_starts: list[int]
    definitions: dict[str, list[Definition]] = field(default_factory=dict)
    # (module specifier, imported names) per import.
    imports: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def snippet(self, definition: Definition, max_lines: int = MAX_DEFINITION_LINES) -> str:
        """Whole lines of a definition, cut to its first ``max_lines`` lines."""
        last = min(definition.end_line, definition.start_line + max_lines - 1)
        start = self.line_starts[definition.start_line]
        end = self.line_starts[last + 1] if last + 1 < len(self.line_starts) else len(self.data)
        return decode(self.data[start:end]).rstrip() + "\n"


def _line_of(line_starts: list[int], offset: int) -> int:
    return bisect_right(line_starts, offset) - 1


def extract(path: str, spec: LanguageSpec, data: bytes, tree: ts.Tree, line_starts: list[int]) -> FileSymbols:
    """Run the definition and import queries over a whole file."""
    symbols = FileSymbols(path, spec, data, line_starts)
    seen: set[tuple[str, int]] = set()
    for match in matches(spec, "definitions", tree.root_node):
        node = match["definition"][0]
        name = decode(match["name"][0].text or b"")
        # Decorated definitions match twice (with and without decorators); keep the outer one.
        key = (name, match["name"][0].start_byte)
        if key in seen:
            continue
        seen.add(key)
        definition = Definition(
            name=name,
            path=path,
            start_line=_line_of(line_starts, node.start_byte),
            end_line=_line_of(line_starts, max(node.start_byte, node.end_byte - 1)),
            start_byte=node.start_byte,
            end_byte=node.end_byte,
        )
        symbols.definitions.setdefault(name, []).append(definition)
    for match in matches(spec, "module_refs", tree.root_node):
        module = decode(match["module"][0].text or b"")
        names = tuple(decode(n.text or b"") for n in match.get("name", []))
        symbols.imports.append((module, names))
    return symbols


class SymbolIndex:
    def __init__(self, max_file_bytes: int = 1_000_000, roots: Callable[[], Sequence[str]] = tuple):
        self.max_file_bytes = max_file_bytes
        # The real workspace folders files on disk must lie in, asked at each
        # check (folders change at run time); none: nothing is read from disk.
        # ContextEngine binds it to its workspace.
        self.roots = roots
        self._open: dict[str, tuple[int, FileSymbols]] = {}
        self._disk: OrderedDict[str, tuple[float, int, float, FileSymbols | None]] = OrderedDict()

    def for_open(self, opened: OpenDocument) -> FileSymbols | None:
        if opened.spec is None or opened.syntax is None:
            return None
        cached = self._open.get(opened.uri)
        if cached is not None and cached[0] == opened.doc.version:
            return cached[1]
        tree = opened.tree
        assert tree is not None
        symbols = extract(opened.path, opened.spec, opened.doc.data, tree, opened.doc.line_starts)
        self._open[opened.uri] = (opened.doc.version, symbols)
        return symbols

    def forget_open(self, uri: str) -> None:
        self._open.pop(uri, None)

    def for_path(self, path: str) -> FileSymbols | None:
        """Symbols of a file on disk (None if outside the workspace folders
        once symlinks are resolved; or missing, too large, binary or not code)."""
        now = time.monotonic()
        cached = self._disk.get(path)
        if cached is not None and now - cached[2] < _STAT_INTERVAL_S:
            return cached[3]
        # Checked on every stat, not once: a file inside may since have become
        # a symlink to one outside (a checkout, a pull).
        real = confined_path(path, self.roots())
        try:
            if real is None:
                raise FileNotFoundError(path)
            stat = os.stat(real)
        except OSError:
            self._disk[path] = (0.0, -1, now, None)
            return None
        if cached is not None and cached[0] == stat.st_mtime and cached[1] == stat.st_size:
            self._disk[path] = (cached[0], cached[1], now, cached[3])
            return cached[3]
        symbols = self._read(path, real, stat.st_size)
        self._disk[path] = (stat.st_mtime, stat.st_size, now, symbols)
        self._disk.move_to_end(path)
        while len(self._disk) > _DISK_CACHE_SIZE:
            self._disk.popitem(last=False)
        return symbols

    def _read(self, path: str, real: str, size: int) -> FileSymbols | None:
        """Read ``real`` (``path`` with its symlinks resolved, as checked)."""
        spec = language_for_path(path)
        if spec is None or size > self.max_file_bytes:
            return None
        try:
            # O_NOFOLLOW: were ``real`` swapped for a symlink since the check, refuse it.
            with open(os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)), "rb") as f:
                data = f.read(self.max_file_bytes + 1)
        except OSError:
            return None
        if b"\x00" in data or len(data) > self.max_file_bytes:
            return None
        tree = parser_for(spec).parse(data)
        return extract(path, spec, data, tree, line_starts_of(data))


# -- import resolution ---------------------------------------------------


def resolve_imports(symbols: FileSymbols, roots: list[str]) -> list[str]:
    """Workspace files the file imports, in import order: existing files
    inside ``roots`` once symlinks are resolved (an import may climb above
    the workspace, or name a symlink that leaves it)."""
    real_roots = real_folders(roots)
    found: list[str] = []
    for module, names in symbols.imports:
        if symbols.spec.name == "python":
            candidates = _python_candidates(module, names, symbols.path, roots)
        elif symbols.spec.name in ("javascript", "typescript", "typescriptreact"):
            candidates = _js_candidates(module, symbols.path)
        else:
            candidates = []
        for candidate in candidates:
            if candidate not in found and os.path.isfile(candidate) and confined_path(candidate, real_roots) is not None:
                found.append(candidate)
    return found


def _python_candidates(module: str, names: tuple[str, ...], path: str, roots: list[str]) -> list[str]:
    if module.startswith("."):
        dots = len(module) - len(module.lstrip("."))
        base = os.path.dirname(path)
        for _ in range(dots - 1):
            base = os.path.dirname(base)
        rest = module.lstrip(".")
        bases = [os.path.join(base, *rest.split(".")) if rest else base]
    else:
        parts = module.split(".")
        search = list(roots) + [os.path.join(r, "src") for r in roots] + [os.path.dirname(path)]
        bases = [os.path.join(r, *parts) for r in search]
    out: list[str] = []
    for base in bases:
        out += [base + ".py", os.path.join(base, "__init__.py")]
        # "from pkg import name" may import the submodule pkg/name.py.
        out += [os.path.join(base, n + ".py") for n in names]
    return out


def _js_candidates(module: str, path: str) -> list[str]:
    if not module.startswith("."):
        return []  # packages from node_modules are not workspace code
    base = os.path.normpath(os.path.join(os.path.dirname(path), module))
    out = [base] if os.path.splitext(base)[1] else []
    out += [base + ext for ext in _JS_EXTENSIONS]
    out += [os.path.join(base, "index" + ext) for ext in _JS_EXTENSIONS]
    # TypeScript sources import "./x.js" meaning "./x.ts".
    stem, ext = os.path.splitext(base)
    if ext in (".js", ".jsx", ".mjs", ".cjs"):
        out += [stem + ".ts", stem + ".tsx"]
    return out
