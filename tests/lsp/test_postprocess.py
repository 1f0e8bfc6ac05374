"""Gating, completion shape, and shaping the model's draft (no network)."""

from __future__ import annotations

import pytest

from quickdraft.lsp_bridge.languages import BRACES, INDENT
from quickdraft.lsp_bridge.postprocess import Completion, Draft, Shape, decide_shape, gate, syntax_region
from quickdraft.lsp_bridge.workspace import Workspace


def _at(source: str, language: str = "python"):
    """Open ``source`` with the cursor at "|" (removed)."""
    offset = source.index("|")
    text = source.replace("|", "", 1)
    ws = Workspace()
    ext = {"python": "py", "javascript": "js", "go": "go", "rust": "rs", "c": "c"}[language]
    opened = ws.open(f"file:///t.{ext}", text, language_id=language)
    return opened, len(text[:offset].encode())


@pytest.mark.parametrize(
    ("source", "language", "region"),
    [
        ("x = 1  # note |", "python", "comment"),
        ("x = 1  # note|\ny = 2", "python", "comment"),
        ('s = "ab|c"', "python", "string"),
        ('s = f"a{ma|}"', "python", "code"),
        ('s = "abc"|', "python", "code"),
        ('s = "unterminated |', "python", "string"),
        ("let s = `a ${b|} c`;", "javascript", "code"),
        ("let s = `a |`;", "javascript", "string"),
        ("/* block | */ x", "javascript", "comment"),
        ("/* block */| x", "javascript", "code"),
        ("// line |", "go", "comment"),
        ("let c = 'x|';", "rust", "string"),
        ("int x; /* c */|", "c", "code"),
    ],
)
def test_syntax_region(source, language, region):
    opened, offset = _at(source, language)
    assert syntax_region(opened, opened.tree, offset) == region


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("x = fo|o", "cursor inside a word"),
        ("x = |foo()", "cursor inside a word"),
        ("x = | + y", "code after the cursor on its line"),
        ("print(|)", None),
        ('print("a", |)  ', None),
        ("x = 1  # |", "inside a comment"),
        ('s = "|"', "inside a string"),
        ("def f():\n    |", None),
    ],
)
def test_gate(source, reason):
    opened, offset = _at(source)
    assert gate(opened, opened.tree, offset, in_comments=False, in_strings=False) == reason


def test_gate_allows_comments_and_strings_when_configured():
    opened, offset = _at("x = 1  # |")
    assert gate(opened, opened.tree, offset, in_comments=True, in_strings=False) is None
    opened, offset = _at('s = "|"')
    assert gate(opened, opened.tree, offset, in_comments=False, in_strings=True) is None


@pytest.mark.parametrize(
    ("source", "language", "multiline"),
    [
        ("def f(x):\n    |", "python", True),
        ("def f(x):\n    |\n\ny = 1\n", "python", True),
        ("class A:\n    def f(self):\n        |\n", "python", True),
        ("def f(x):\n    y = 1\n    |\n    return y\n", "python", False),
        ("def f(x):\n    return |", "python", False),
        ("if x:\n    pass\nelse:\n    |", "python", True),
        ("function f() {\n  |\n}\n", "javascript", True),
        ("function f() {\n  |\n", "javascript", True),
        ("function f() {\n  a();\n  |\n}\n", "javascript", False),
        ("func f() {\n\t|\n}\n", "go", True),
        ("fn f() {\n    |\n}\n", "rust", True),
        ("x = 1\n|", "python", False),
    ],
)
def test_decide_shape(source, language, multiline):
    opened, offset = _at(source, language)
    assert decide_shape(opened, opened.tree, offset).multiline is multiline


def _shape(multiline, line_prefix="", line_suffix="", next_lines=(), style=INDENT, max_lines=20, from_line_start=False):
    return Shape(multiline, line_prefix, line_suffix, tuple(next_lines), style, max_lines, from_line_start)


def _run(shape, chunks):
    draft = Draft(shape)
    stopped_at = None
    for i, chunk in enumerate(chunks):
        if draft.feed(chunk):
            stopped_at = i
            break
    return draft, stopped_at


def test_single_line_stops_streaming_at_the_first_newline():
    draft, stopped = _run(_shape(False, "x = "), ["compute(", "a)\n", "y = 2"])
    assert stopped == 1
    assert draft.result() == Completion("compute(a)")


def test_multiline_python_stops_at_the_dedent():
    shape = _shape(True, "    ", next_lines=["", "def g():"])
    draft, stopped = _run(shape, ["total = 0\n", "    for v in values:\n", "        total += v\n", "    return total\n", "\n", "def g():\n", "    pass\n"])
    assert stopped == 5
    assert draft.result() == Completion("total = 0\n    for v in values:\n        total += v\n    return total")


def test_multiline_braces_drop_the_closing_brace_the_document_has():
    shape = _shape(True, "  ", next_lines=["}"], style=BRACES)
    draft, stopped = _run(shape, ["if (x) {\n", "    y();\n", "  }\n", "  return 1;\n", "}\n", "function g() {}\n"])
    assert stopped == 4
    assert draft.result() == Completion("if (x) {\n    y();\n  }\n  return 1;")


def test_multiline_braces_keep_the_closing_brace_the_document_lacks():
    shape = _shape(True, "  ", next_lines=[], style=BRACES)
    draft, _ = _run(shape, ["return 1;\n", "}\n", "\n", "function g() {}\n"])
    assert draft.result() == Completion("return 1;\n}")


def test_brackets_inside_strings_do_not_count():
    shape = _shape(True, "  ", next_lines=["}"], style=BRACES)
    draft, _ = _run(shape, ['log("}}}");\n', "  done();\n", "}\n"])
    assert draft.result() == Completion('log("}}}");\n  done();')


def test_draft_repeating_the_following_lines_is_cut():
    shape = _shape(True, "    ", next_lines=["    return x", ""])
    draft, _ = _run(shape, ["x = compute()\n", "    return x\n"])
    assert draft.result() == Completion("x = compute()")


def test_draft_that_only_repeats_the_following_lines_is_dropped():
    shape = _shape(True, "    ", next_lines=["    return x"])
    draft, _ = _run(shape, ["return x\n"])
    assert draft.result() is None


def test_line_suffix_already_present_is_not_repeated():
    draft, _ = _run(_shape(False, "print(", ")"), ["value)"])
    assert draft.result() == Completion("value")


def test_line_suffix_contained_in_the_draft_is_replaced():
    draft, _ = _run(_shape(False, "print(", ")"), ["value, end='');"])
    assert draft.result() == Completion("value, end='');", replace_bytes=1)


def test_line_suffix_not_in_the_draft_is_kept():
    draft, _ = _run(_shape(False, "f(", "]"), ["a, b"])
    assert draft.result() == Completion("a, b")


def test_empty_or_blank_drafts_give_nothing():
    assert Draft(_shape(False, "x = ")).result() is None
    draft, _ = _run(_shape(False, "x = "), ["\n  more"])  # the line was left as it is
    assert draft.result() is None
    draft, _ = _run(_shape(False, "    "), ["\n", "   \n", "\n"])
    assert draft.result() is None
    draft, _ = _run(_shape(True, "    "), ["   \n", "\n"])
    assert draft.result() is None


def test_on_a_blank_line_the_first_line_that_is_not_blank_is_the_completion():
    """The model's leading line break is the blank line the cursor is on: the
    next line, without its indentation, is what goes at the cursor, and the
    stream stops once that line is complete (no server-side stop there)."""
    draft, stopped = _run(_shape(False, "        "), ["\n", "\n        ", "return", " total\n", "x = 1"])
    assert stopped == 3
    assert draft.result() == Completion("return total")
    draft, stopped = _run(_shape(False, "    "), ["\n    last(", "a"])  # the stream ended mid-line
    assert stopped is None and draft.result() == Completion("last(a")
    draft, _ = _run(_shape(False, "    "), ["  nested = 1\n"])  # no line break first: as written
    assert draft.result() == Completion("  nested = 1")


def test_from_the_line_start_the_indentation_the_cursor_has_is_dropped():
    """The prompt started the blank line afresh: the model writes the line with
    its indentation, possibly in pieces; the cursor's own indentation is left
    out, deeper indentation kept, shallower dropped (ghost text cannot dedent)."""
    shape = _shape(False, "    ", from_line_start=True)
    draft, stopped = _run(shape, [" ", "   ", "return total\n", "more"])
    assert stopped == 2 and draft.result() == Completion("return total")
    assert _run(shape, ["        deeper()\n"])[0].result() == Completion("    deeper()")
    assert _run(shape, ["  shallow()\n"])[0].result() == Completion("shallow()")
    assert _run(shape, ["\tx = 1\n"])[0].result() == Completion("x = 1")
    assert _run(shape, ["   "])[0].result() is None  # only whitespace ever came
    assert _run(_shape(False, "", from_line_start=True), ["    x = 1\n"])[0].result() == Completion("    x = 1")
    block = _shape(True, "    ", from_line_start=True)
    draft, _ = _run(block, ["    a = 1\n", "    b = 2\n", "c = 3\n"])
    assert draft.result() == Completion("a = 1\n    b = 2")


def test_max_lines_stops_a_runaway_block():
    shape = _shape(True, "    ", max_lines=3)
    draft, stopped = _run(shape, [f"x_{i} = {i}\n    " for i in range(10)])
    assert stopped == 2
    assert draft.result().text.count("\n") == 2


def test_crlf_drafts_are_normalised():
    draft, _ = _run(_shape(True, "    "), ["a = 1\r\n", "    b = 2\r\n"])
    assert draft.result() == Completion("a = 1\n    b = 2")
