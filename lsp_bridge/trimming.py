"""Cut the prefix and suffix around the cursor to a budget, at syntactic boundaries.

Budgets are in bytes of UTF-8, which are never fewer than characters, so a
budget in characters is respected (conservatively for non-ASCII text).

Rules: cuts fall on whole lines, moved to the start (prefix) or end
(suffix) of a statement when the tree knows one; the cursor's own line is never
cut; when the middle of the prefix must go, the enclosing class/function
headers and the file's imports are kept above the window.

Stable windows (``keep``): a prefix window remembers where it opened and which
header lines it kept (``Anchor``); the next window of the same document opens
there again, with the same headers, while that still fits the budget and fills
enough of it. Consecutive prompts then begin with the same text, which the
server's prefix cache serves, instead of a window whose first line moves with
every line typed. A new window is cut ``slack`` under the budget, so typing
has room to grow into before the window must move again, and a kept one
must fill at least ``floor`` of it (else a new one shows more of the file).
"""

from __future__ import annotations

from dataclasses import dataclass

import tree_sitter as ts

from quickdraft.lsp_bridge.languages import INDENT
from quickdraft.lsp_bridge.syntax import captures, matches
from quickdraft.lsp_bridge.text import decode
from quickdraft.lsp_bridge.workspace import OpenDocument

# At most this share of the prefix budget goes to imports and scope headers.
HEADER_SHARE = 0.3
# How far from a line cut to look for a statement boundary (statements start
# every few lines; a larger span only costs query time).
SNAP_SPAN = 1024
_WHITESPACE = b" \t\r\n\f\v"


@dataclass(frozen=True)
class Span:
    """Whole lines [start, end) of the document, end including the line break."""

    start: int
    end: int


@dataclass(frozen=True)
class Anchor:
    """Where a prefix window opened (a line start) and the header lines kept
    above it, as (offset, bytes): enough to open the next window the same way."""

    start: int
    headers: tuple[tuple[int, bytes], ...] = ()


@dataclass
class Window:
    text: str
    truncated: bool
    anchor: Anchor | None = None  # prefix windows cut at a line start: how to open the next one the same way


def _line_span(opened: OpenDocument, start_byte: int, end_byte: int) -> Span:
    """The whole lines covering bytes [start_byte, end_byte]."""
    doc = opened.doc
    first = doc.line_of(start_byte)
    last = doc.line_of(max(start_byte, end_byte - 1) if end_byte > start_byte else start_byte)
    end = doc.line_starts[last + 1] if last + 1 < doc.line_count else len(doc.data)
    return Span(doc.line_starts[first], end)


def _last_code_byte(data: bytes, before: int, floor: int) -> int:
    """Offset of the last non-whitespace byte before ``before`` (not below ``floor``)."""
    i = before - 1
    while i > floor and data[i] in _WHITESPACE:
        i -= 1
    return max(i, floor)


def scope_headers(opened: OpenDocument, tree: ts.Tree, offset: int) -> list[Span]:
    """Header lines of the classes/functions enclosing ``offset``, outermost first."""
    doc = opened.doc
    data = doc.data
    cursor_line = doc.line_of(offset)
    line_start = doc.line_starts[cursor_line]
    # In indentation languages a scope's node ends at its last statement, but
    # blank lines after it, indented deeper than its header, still belong to it.
    indented = opened.spec.block_style == INDENT
    ws_start = offset
    while indented and ws_start > 0 and data[ws_start - 1] in _WHITESPACE:
        ws_start -= 1
    indent = len(data[line_start:offset]) - len(data[line_start:offset].lstrip(b" \t"))
    headers: list[Span] = []
    for match in matches(opened.spec, "scopes", tree.root_node, (max(0, ws_start - 1), offset + 1)):
        scope = match["scope"][0]
        body = match["body"][0]
        if scope.start_byte >= offset:
            continue
        if scope.end_byte < offset:
            scope_indent = scope.start_byte - doc.line_starts[doc.line_of(scope.start_byte)]
            if not (indented and scope.end_byte >= ws_start and indent > scope_indent):
                continue
        # For brace bodies the header ends at the "{"; for indented ones, before the body.
        header_end = body.start_byte + 1 if data[body.start_byte : body.start_byte + 1] == b"{" else body.start_byte
        last = _last_code_byte(data, header_end, scope.start_byte)
        if doc.line_of(last) < cursor_line:
            headers.append(_line_span(opened, scope.start_byte, last + 1))
    headers.sort(key=lambda s: s.start)
    return headers


def import_spans(opened: OpenDocument, tree: ts.Tree, before: int) -> list[Span]:
    """Lines of the module-level imports that start before ``before``."""
    found = captures(opened.spec, "imports", tree.root_node, (0, before), max_depth=opened.spec.import_depth)
    return sorted({_line_span(opened, n.start_byte, n.end_byte) for n in found.get("import", []) if n.start_byte < before}, key=lambda s: s.start)


def _statement_start_at_or_after(opened: OpenDocument, tree: ts.Tree, start: int, limit: int) -> int | None:
    """Start of a line in [start, limit) that begins a statement: the least
    indented such line (so the window opens on a whole definition rather than
    on the tail of the previous one), the first of those on a tie."""
    doc = opened.doc
    best: tuple[int, int] | None = None  # (indentation, line start)
    for node in captures(opened.spec, "statements", tree.root_node, (start, limit)).get("statement", []):
        s = node.start_byte
        if s < start or s >= limit:
            continue
        line_start = doc.line_starts[doc.line_of(s)]
        if line_start < start or doc.data[line_start:s].strip():
            continue  # not the first thing on its line
        candidate = (s - line_start, line_start)
        if best is None or candidate < best:
            best = candidate
    return best[1] if best is not None else None


def _statement_end_at_or_before(opened: OpenDocument, tree: ts.Tree, floor: int, end: int) -> int | None:
    """End of the last line in (floor, end] on which a statement ends."""
    doc = opened.doc
    best = None
    for node in captures(opened.spec, "statements", tree.root_node, (floor, end)).get("statement", []):
        e = node.end_byte
        if e <= floor or (best is not None and e <= best):
            continue
        line = doc.line_of(max(e - 1, 0))
        line_end = doc.line_starts[line + 1] if line + 1 < doc.line_count else len(doc.data)
        if line_end <= end and not doc.data[e:line_end].strip():
            best = e
    if best is None:
        return None
    line = doc.line_of(max(best - 1, 0))
    return doc.line_starts[line + 1] if line + 1 < doc.line_count else len(doc.data)


def _cut_inside_line(data: bytes, threshold: int, limit: int) -> int:
    """A cut at or after ``threshold`` that does not split a word (for lines
    longer than the whole budget, e.g. minified code)."""
    i = threshold
    while i < limit and (chr(data[i]).isalnum() or data[i] in b"_$" or data[i] >= 0x80):
        i += 1
    return i


def _joined(parts: list[bytes], window: bytes) -> str:
    parts = [p if p.endswith((b"\n", b"\r")) else p + b"\n" for p in parts]
    parts.append(window)
    return decode(b"".join(parts))


def _kept_window(opened: OpenDocument, offset: int, line_start: int, budget: int, keep: Anchor, least: float) -> Window | None:
    """The window opened as ``keep`` says, if it is still valid, fits ``budget``
    and fills at least ``least`` of it; else None."""
    doc = opened.doc
    data = doc.data
    start = keep.start
    if not 0 < start <= line_start or doc.line_starts[doc.line_of(start)] != start:
        return None
    size = offset - start
    for at, text in keep.headers:
        # An edit above the window moved or changed a header line: open afresh.
        if at + len(text) > start or data[at : at + len(text)] != text:
            return None
        size += len(text)
    if not least <= size <= budget:
        return None
    return Window(_joined([text for _, text in keep.headers], data[start:offset]), True, keep)


def prefix_window(opened: OpenDocument, tree: ts.Tree | None, offset: int, budget: int, *,
                  keep: Anchor | None = None, slack: float = 0.0, floor: float | None = None) -> Window:
    """Text before the cursor within ``budget`` bytes.

    With ``keep`` (the previous window's ``anchor``) the window opens where
    that one did while it fits and fills at least ``floor`` of the budget
    (default ``1 - 2 * slack``); otherwise a new window is cut ``slack`` under
    the budget."""
    doc = opened.doc
    data = doc.data
    line_start = doc.line_starts[doc.line_of(offset)]
    if keep is not None:
        # Before the whole prefix, even when it would fit now: a budget that
        # wavers around the prefix's size must not swap the two every keystroke.
        least = budget * (1 - 2 * slack if floor is None else floor)
        kept_window = _kept_window(opened, offset, line_start, budget, keep, least)
        if kept_window is not None:
            return kept_window
    if offset <= budget:
        return Window(doc.slice(0, offset), False)
    if offset - line_start >= budget:  # the cursor line alone is over budget
        return Window(doc.slice(_cut_inside_line(data, offset - budget, offset), offset), True)
    if slack > 0:
        budget = int(budget * (1 - slack))
        if offset - line_start >= budget:
            return Window(doc.slice(_cut_inside_line(data, offset - budget, offset), offset), True)

    headers: list[Span] = []
    header_bytes = 0
    if tree is not None and opened.spec is not None:
        cap = int(budget * HEADER_SHARE)
        threshold = offset - budget
        for span in scope_headers(opened, tree, offset) + import_spans(opened, tree, threshold):
            size = span.end - span.start
            if span.end <= threshold and header_bytes + size <= cap and span not in headers:
                headers.append(span)
                header_bytes += size

    window_start = _window_start(opened, tree, offset, budget - header_bytes, line_start)
    # Headers the window already covers cost nothing; give their bytes back once.
    kept = [h for h in headers if h.end <= window_start]
    if len(kept) < len(headers):
        header_bytes = sum(h.end - h.start for h in kept)
        window_start = _window_start(opened, tree, offset, budget - header_bytes, line_start)
        kept = [h for h in kept if h.end <= window_start]
    kept.sort(key=lambda s: s.start)
    headers = tuple((h.start, data[h.start : h.end]) for h in kept)
    return Window(_joined([text for _, text in headers], data[window_start:offset]), True, Anchor(window_start, headers))


def _window_start(opened: OpenDocument, tree: ts.Tree | None, offset: int, budget: int, line_start: int) -> int:
    doc = opened.doc
    threshold = max(0, offset - budget)
    line = doc.line_of(threshold)
    start = doc.line_starts[line] if doc.line_starts[line] >= threshold else doc.line_starts[min(line + 1, doc.line_count - 1)]
    start = min(start, line_start)
    if tree is not None and opened.spec is not None and start < line_start:
        snapped = _statement_start_at_or_after(opened, tree, start, min(line_start, start + SNAP_SPAN // 2))
        if snapped is not None:
            start = snapped
    return start


def suffix_window(opened: OpenDocument, tree: ts.Tree | None, offset: int, budget: int) -> Window:
    """Text after the cursor within ``budget`` bytes (the rest of the cursor line always)."""
    doc = opened.doc
    size = len(doc.data)
    if size - offset <= budget:
        return Window(doc.slice(offset, size), False)
    line = doc.line_of(offset)
    line_end = doc.line_starts[line + 1] if line + 1 < doc.line_count else size
    threshold = offset + budget
    if threshold <= line_end:
        return Window(doc.slice(offset, line_end), True)
    end = doc.line_starts[doc.line_of(threshold)]
    if tree is not None and opened.spec is not None and end > line_end:
        snapped = _statement_end_at_or_before(opened, tree, max(line_end, end - SNAP_SPAN), end)
        if snapped is not None and snapped >= line_end:
            end = snapped
    return Window(doc.slice(offset, max(end, line_end)), True)
