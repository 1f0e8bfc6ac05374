"""One open document: UTF-8 bytes, a line index, and LSP edits applied to both.

Lines end at ``\\n``, ``\\r\\n`` or ``\\r``, as LSP says. Every edit is also
returned as byte offsets and points, which is what tree-sitter's ``Tree.edit``
needs; the line index is updated around the edit only, so a keystroke costs
O(edit) plus one pass over the line starts after it.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from quickdraft.lsp_bridge.text import UTF16, bytes_to_units, decode, encode, units_to_bytes

_NEWLINE = re.compile(rb"\r\n|\r|\n")

Position = tuple[int, int]  # (line, character) in the document's position encoding


def line_starts_of(data: bytes) -> list[int]:
    """Byte offset of the start of every line."""
    return [0] + [m.end() for m in _NEWLINE.finditer(data)]


@dataclass(frozen=True, slots=True)
class Edit:
    """A byte-level edit, in the shape tree-sitter's ``Tree.edit`` takes.

    Points are (line, byte column) with LSP's line breaks; tree-sitter only
    counts ``\\n``, so they differ only in files with lone ``\\r``, where
    tree-sitter's own points are off but the byte offsets we rely on are not.
    """

    start_byte: int
    old_end_byte: int
    new_end_byte: int
    start_point: tuple[int, int]
    old_end_point: tuple[int, int]
    new_end_point: tuple[int, int]


class Document:
    """The text of one document as the editor has it."""

    def __init__(self, uri: str, text: str, *, language_id: str = "", version: int = 0, encoding: str = UTF16):
        self.uri = uri
        self.language_id = language_id
        self.version = version
        self.encoding = encoding
        self.data = encode(text)
        self.line_starts = line_starts_of(self.data)
        self.last_edit_offset: int | None = None
        self.last_edit_time = 0.0

    # -- reading ---------------------------------------------------------

    @property
    def text(self) -> str:
        return decode(self.data)

    @property
    def line_count(self) -> int:
        return len(self.line_starts)

    def line_range(self, line: int) -> tuple[int, int]:
        """Byte range of ``line``'s content, terminator excluded."""
        start = self.line_starts[line]
        if line + 1 >= len(self.line_starts):
            return start, len(self.data)
        end = self.line_starts[line + 1]
        end -= 2 if self.data[end - 2 : end] == b"\r\n" and end - 2 >= start else 1
        return start, end

    def line_text(self, line: int) -> str:
        start, end = self.line_range(line)
        return decode(self.data[start:end])

    def line_of(self, offset: int) -> int:
        return bisect_right(self.line_starts, offset) - 1

    def slice(self, start: int, end: int) -> str:
        return decode(self.data[start:end])

    # -- positions -------------------------------------------------------

    def is_valid_position(self, line: int, character: int) -> bool:
        """Whether the position names a line of the document (a character past
        the line's end is valid: the spec clamps it)."""
        return 0 <= line < len(self.line_starts) and character >= 0

    def offset_at(self, line: int, character: int) -> int:
        """Byte offset of an LSP position, clamped into the document."""
        if line < 0:
            return 0
        if line >= len(self.line_starts):
            return len(self.data)
        start, end = self.line_range(line)
        return start + units_to_bytes(self.data[start:end], character, self.encoding)

    def position_at(self, offset: int) -> Position:
        offset = max(0, min(offset, len(self.data)))
        line = self.line_of(offset)
        start, end = self.line_range(line)
        return line, bytes_to_units(self.data[start:end], min(offset, end) - start, self.encoding)

    def _point(self, offset: int) -> tuple[int, int]:
        line = self.line_of(offset)
        return line, offset - self.line_starts[line]

    # -- editing ---------------------------------------------------------

    def replace_all(self, text: str) -> Edit:
        return self._splice(0, len(self.data), encode(text))

    def apply_change(self, text: str, start: Position, end: Position) -> Edit:
        """Apply one incremental ``didChange`` content change."""
        a = self.offset_at(*start)
        b = self.offset_at(*end)
        if b < a:  # a reversed range from a confused client: still an edit of [a, b)
            a, b = b, a
        return self._splice(a, b, encode(text))

    def _splice(self, s: int, e: int, new: bytes) -> Edit:
        start_point = self._point(s)
        old_end_point = self._point(e)
        n = len(new)
        self.data = self.data[:s] + new + self.data[e:]
        self._update_line_starts(s, e, n)
        self.last_edit_offset = s + n
        self.last_edit_time = time.monotonic()
        return Edit(s, e, s + n, start_point, old_end_point, self._point(s + n))

    def _update_line_starts(self, s: int, e: int, n: int) -> None:
        """Re-derive line starts in [s, s+n] of the new data; shift those after.

        Starts before ``s`` cannot change (their terminators end before the
        edit); starts after ``e`` keep their terminators, only shifted. A start
        at ``s`` itself depends on the byte before it (``\\r`` + inserted
        ``\\n`` joins into one break), hence the scan from ``s - 1``.
        """
        old = self.line_starts
        i = bisect_left(old, s)
        j = bisect_right(old, e)
        lo = max(0, s - 1)
        middle = [m.end() for m in _NEWLINE.finditer(self.data, lo, s + n + 1)]
        middle = [q for q in middle if s <= q <= s + n]
        delta = n - (e - s)
        tail = [p + delta for p in old[j:]] if delta else old[j:]
        self.line_starts = (old[:i] if i else [0]) + middle + tail
