"""One parse tree per open document, kept up to date incrementally.

Each edit is applied to the old tree (``Tree.edit``) as it arrives; the
reparse that reuses the old tree happens when the tree is next needed, so a
burst of keystrokes costs one reparse.
"""

from __future__ import annotations

from collections.abc import Iterable

import tree_sitter as ts

from quickdraft.lsp_bridge.document import Edit
from quickdraft.lsp_bridge.languages import LanguageSpec

_PARSERS: dict[str, ts.Parser] = {}


def parser_for(spec: LanguageSpec) -> ts.Parser:
    # One parser per language is enough: everything runs on the event loop thread.
    parser = _PARSERS.get(spec.name)
    if parser is None:
        parser = _PARSERS[spec.name] = ts.Parser(spec.language)
    return parser


class SyntaxTree:
    def __init__(self, spec: LanguageSpec, data: bytes):
        self.spec = spec
        self._tree = parser_for(spec).parse(data)
        self._stale = False

    def edit(self, edit: Edit) -> None:
        self._tree.edit(
            edit.start_byte,
            edit.old_end_byte,
            edit.new_end_byte,
            edit.start_point,
            edit.old_end_point,
            edit.new_end_point,
        )
        self._stale = True

    def tree(self, data: bytes) -> ts.Tree:
        """The tree for ``data`` (the document's current bytes)."""
        if self._stale:
            self._tree = parser_for(self.spec).parse(data, self._tree)
            self._stale = False
        return self._tree


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
