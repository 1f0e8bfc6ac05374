"""Deciding what kind of completion fits the cursor, and shaping the model's draft.

Plain objects, no I/O: ``gate`` says whether to ask the model at all,
``decide_shape`` whether one line or a block is wanted, and ``Draft`` consumes
the streamed text, says when to stop streaming, and produces the final
completion (cut at the end of the block, de-duplicated against the text after
the cursor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tree_sitter as ts

from quickdraft.lsp_bridge.languages import BRACES, INDENT
from quickdraft.lsp_bridge.syntax import captures
from quickdraft.lsp_bridge.text import encode
from quickdraft.lsp_bridge.workspace import OpenDocument

MAX_LINES = 20
NEXT_LINES = 8
# Text after the cursor on its line that still allows a completion: closers,
# separators, whitespace (as after an auto-inserted bracket or quote).
_CLOSERS_ONLY = re.compile(r"[\s)\]}>\"'`;,:.]*")
_WORD_CHAR = re.compile(r"\w")
_OPENERS = {INDENT: (":",), BRACES: ("{", "(", "[", "=>")}
_PAIRS = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True)
class Shape:
    """What is around the cursor, and whether a block (multi-line) is wanted."""

    multiline: bool
    line_prefix: str
    line_suffix: str
    next_lines: tuple[str, ...] = ()
    block_style: str = BRACES
    max_lines: int = MAX_LINES
    # The prompt starts the cursor's (blank) line afresh (context.from_line_start):
    # the model's text begins with the line's indentation, which the cursor has.
    from_line_start: bool = False

    @property
    def on_blank_line(self) -> bool:
        """Only whitespace around the cursor on its line."""
        return not self.line_prefix.strip() and not self.line_suffix.strip()


@dataclass(frozen=True)
class Completion:
    text: str
    # Bytes after the cursor, on its line, that the completion replaces.
    replace_bytes: int = 0
    # The server request that wrote it: what the editor's outcome reports name (lsp_bridge/outcomes.py).
    request_id: str = ""


def _indent_width(line: str) -> int:
    width = 0
    for ch in line:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += 4
        else:
            break
    return width


# -- gating ------------------------------------------------------------------


def syntax_region(opened: OpenDocument, tree: ts.Tree | None, offset: int) -> str:
    """"comment", "string" or "code" at ``offset``."""
    if tree is None or opened.spec is None:
        return "code"
    data = opened.doc.data
    found = captures(opened.spec, "non_code", tree.root_node, (max(0, offset - 1), offset + 1))
    innermost: tuple[int, str] | None = None
    for kind, nodes in found.items():
        for node in nodes:
            if kind == "comment":
                text = data[node.start_byte : node.end_byte]
                block_closed = text.endswith(b"*/") and node.end_byte == offset
                inside = node.start_byte < offset <= node.end_byte and not block_closed
            else:
                inside = node.start_byte < offset < node.end_byte
            if inside and (innermost is None or node.end_byte - node.start_byte < innermost[0]):
                innermost = (node.end_byte - node.start_byte, kind)
    if innermost is not None:
        return innermost[1] if innermost[1] != "code" else "code"
    # Unterminated string on the cursor line: the tree shows an ERROR, not a string.
    doc = opened.doc
    line_start = doc.line_starts[doc.line_of(offset)]
    line_prefix = data[line_start:offset].replace(b'\\"', b"")
    if line_prefix.count(b'"') % 2 == 1:
        return "string"
    return "code"


def gate(opened: OpenDocument, tree: ts.Tree | None, offset: int, *, in_comments: bool, in_strings: bool) -> str | None:
    """Why not to complete at ``offset`` (None: go ahead)."""
    doc = opened.doc
    line = doc.line_of(offset)
    _, line_end = doc.line_range(line)
    after = doc.slice(offset, line_end)
    if after and _WORD_CHAR.match(after[0]):
        return "cursor inside a word"
    if not _CLOSERS_ONLY.fullmatch(after):
        return "code after the cursor on its line"
    region = syntax_region(opened, tree, offset)
    if region == "comment" and not in_comments:
        return "inside a comment"
    if region == "string" and not in_strings:
        return "inside a string"
    return None


# -- shape -------------------------------------------------------------------


def _empty_block_at(opened: OpenDocument, tree: ts.Tree, offset: int) -> bool:
    """The innermost block around the cursor has no statements yet."""
    best: ts.Node | None = None
    for node in captures(opened.spec, "blocks", tree.root_node, (max(0, offset - 1), offset + 1)).get("block", []):
        if node.start_byte < offset < node.end_byte and (best is None or node.end_byte - node.start_byte < best.end_byte - best.start_byte):
            best = node
    if best is None:
        return False
    return all(child.type.endswith("comment") for child in best.named_children)


def decide_shape(opened: OpenDocument, tree: ts.Tree | None, offset: int) -> Shape:
    doc = opened.doc
    line = doc.line_of(offset)
    line_start, line_end = doc.line_range(line)
    line_prefix = doc.slice(line_start, offset)
    line_suffix = doc.slice(offset, line_end)
    next_lines = tuple(doc.line_text(i) for i in range(line + 1, min(doc.line_count, line + 1 + NEXT_LINES)))
    style = opened.spec.block_style if opened.spec is not None else BRACES
    multiline = False
    if not line_prefix.strip() and not line_suffix.strip():
        if tree is not None and opened.spec is not None and _empty_block_at(opened, tree, offset):
            multiline = True
        else:
            multiline = _opens_empty_block(doc, line, style)
    return Shape(multiline, line_prefix, line_suffix, next_lines, style)


def next_line_shape(opened: OpenDocument, offset: int) -> Shape | None:
    """The shape of the blank line the user gets by pressing Enter at ``offset``,
    the end of a line, before they press it: indented as an editor indents (as
    the line above, one level deeper after a block opener), a block when that
    line opens an empty block. None when code follows ``offset`` on its line."""
    doc = opened.doc
    line = doc.line_of(offset)
    line_start, line_end = doc.line_range(line)
    if doc.slice(offset, line_end).strip():
        return None
    above = doc.slice(line_start, offset)
    style = opened.spec.block_style if opened.spec is not None else BRACES
    indent = above[: len(above) - len(above.lstrip(" \t"))]
    opens = above.rstrip().endswith(_OPENERS[style])
    if opens:
        indent += "\t" if indent.startswith("\t") else "    "
    multiline = False
    if opens:
        below = line + 1
        while below < doc.line_count and not doc.line_text(below).strip():
            below += 1
        multiline = below >= doc.line_count or _indent_width(doc.line_text(below)) <= _indent_width(above)
    next_lines = tuple(doc.line_text(i) for i in range(line + 1, min(doc.line_count, line + 1 + NEXT_LINES)))
    return Shape(multiline, indent, "", next_lines, style, from_line_start=True)


def _opens_empty_block(doc, line: int, style: str) -> bool:
    """Text fallback for trees in error: the line above opens a block and
    nothing below is indented into it yet."""
    above = line - 1
    while above >= 0 and not doc.line_text(above).strip():
        above -= 1
    if above < 0:
        return False
    opener = doc.line_text(above).rstrip()
    if not opener.endswith(_OPENERS[style]):
        return False
    below = line + 1
    while below < doc.line_count and not doc.line_text(below).strip():
        below += 1
    if below >= doc.line_count:
        return True
    return _indent_width(doc.line_text(below)) <= _indent_width(opener)


# -- the draft ---------------------------------------------------------------


def _brace_delta(line: str) -> list[tuple[str, int]]:
    """Brackets of a line in order (string contents and // comments skipped)."""
    out = []
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif line.startswith("//", i):
            break
        elif ch in "([{":
            out.append((ch, 1))
        elif ch in ")]}":
            out.append((ch, -1))
        i += 1
    return out


@dataclass
class Draft:
    """The model's text as it streams in, and the completion made of it."""

    shape: Shape
    text: str = ""
    done: bool = False
    _checked_lines: int = field(default=0, repr=False)
    _held_indent: str | None = field(default=None, repr=False)  # the answer's leading whitespace, held back

    def __post_init__(self) -> None:
        if self.shape.from_line_start:
            self._held_indent = ""

    def feed(self, delta: str) -> bool:
        """Add streamed text; True once enough has arrived (stop the stream)."""
        if self.done:
            return True
        if self._held_indent is not None:
            # Hold the answer's leading whitespace until its first other character:
            # only then is it known how much of it the cursor's indentation covers.
            self._held_indent += delta
            code = self._held_indent.lstrip(" \t")
            if not code:
                return False
            delta = _beyond(self._held_indent[: len(self._held_indent) - len(code)], self.shape.line_prefix) + code
            self._held_indent = None
        self.text += delta
        if not self.shape.multiline:
            self.done = _one_line(self.text, self.shape) is not None
        else:
            complete_lines = self.text.count("\n")
            if complete_lines > self._checked_lines:
                self._checked_lines = complete_lines
                lines = self.text.split("\n")[:complete_lines]
                self.done = _block_end(lines, self.shape) is not None or complete_lines >= self.shape.max_lines
        return self.done

    def result(self) -> Completion | None:
        """The completion to show, or None when nothing useful is left."""
        shape = self.shape
        text = self.text.replace("\r\n", "\n")
        if not shape.multiline:
            first = _one_line(text + "\n", shape) or ""
            if shape.on_blank_line and not first.strip():
                return None
            return _merge_line_suffix(first, shape)
        lines = text.split("\n")
        end = _block_end(lines, shape)
        if end is not None:
            lines = lines[:end]
        lines = lines[: shape.max_lines]
        while lines and not lines[-1].strip():
            lines.pop()
        lines = _drop_repeated_tail(lines, shape.next_lines)
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines or not "".join(lines).strip():
            return None
        lines = [line.rstrip() for line in lines]
        return Completion("\n".join(lines))


def _beyond(indent: str, cursor_indent: str) -> str:
    """The part of the model's indentation past the cursor's: a completion can
    add indentation but not remove it, so a shallower one is dropped."""
    return indent[len(cursor_indent):] if indent.startswith(cursor_indent) else ""


def _one_line(text: str, shape: Shape) -> str | None:
    """The line a one-line shape shows, once it is complete (None before).

    On a blank line the model often writes a line break first: about 60% of
    the embedded model's answers at a blank line's indentation (docs/lsp.md).
    The cursor's line is that blank line already, so the first non-blank line
    is what belongs at the cursor, without its own indentation (the cursor has
    it). Elsewhere the line ends at the first line break."""
    if not shape.on_blank_line:
        head, sep, _ = text.partition("\n")
        return head.rstrip() if sep else None
    lines = text.split("\n")
    for i, line in enumerate(lines[:-1]):  # the last piece has no line break yet
        if line.strip():
            return line.rstrip() if i == 0 else line.strip()
    return None


def _block_end(lines: list[str], shape: Shape) -> int | None:
    """Index of the first line that is no longer part of the block being written."""
    if not lines:
        return None
    body_indent = _indent_width(shape.line_prefix + lines[0]) if lines[0].strip() else None
    depth = 0
    for i, line in enumerate(lines):
        for _, step in _brace_delta(line) if shape.block_style == BRACES else ():
            depth += step
        if i == 0:
            continue
        if not line.strip():
            continue
        if body_indent is None:  # the draft started with blank lines
            body_indent = _indent_width(line)
            continue
        if shape.block_style == BRACES and depth < 0:
            # This line closes the block the cursor is in. Keep it only if the
            # document does not close it already.
            following = next((n for n in shape.next_lines if n.strip()), "")
            closes_already = following.strip()[:1] == line.strip()[:1]
            return i if closes_already else i + 1
        if _indent_width(line) < body_indent:
            return i
    return None


def _drop_repeated_tail(lines: list[str], next_lines: tuple[str, ...]) -> list[str]:
    """Drop the draft's last lines when they repeat the lines after the cursor."""
    following = [n.strip() for n in next_lines if n.strip()]
    body = [line.strip() for line in lines]
    for k in range(min(len(lines), len(following)), 0, -1):
        tail = body[-k:]
        if tail == following[:k] and any(tail):
            return lines[:-k]
    return lines


def _merge_line_suffix(first: str, shape: Shape) -> Completion | None:
    """Fit a one-line completion to the text after the cursor on its line."""
    rest = shape.line_suffix.rstrip()
    if not rest:
        return Completion(first) if first else None
    if first.endswith(rest):  # the model wrote the closers the line already has
        first = first[: -len(rest)]
        return Completion(first) if first else None
    if _is_subsequence(rest, first):
        # The closers appear in the draft, in order, with more in between:
        # replace them with the draft.
        return Completion(first, replace_bytes=len(encode(rest)))
    return Completion(first) if first else None


def _is_subsequence(needle: str, haystack: str) -> bool:
    it = iter(haystack)
    return all(ch in it for ch in needle)
