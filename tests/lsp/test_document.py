"""Documents: position conversion, incremental edits, line index, incremental parse.

The fuzz tests apply random edits with non-ASCII text through LSP positions
computed by an independent reference (conftest.position_of) and compare the
document with the reference text after every edit.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quickdraft.lsp_bridge.document import Document, line_starts_of
from quickdraft.lsp_bridge.languages import load
from quickdraft.lsp_bridge.syntax import parser_for
from quickdraft.lsp_bridge.text import UTF8, UTF16, UTF32, bytes_to_units, units_to_bytes
from quickdraft.lsp_bridge.workspace import Change, Workspace
from tests.lsp.conftest import position_of

ENCODINGS = [UTF8, UTF16, UTF32]
SAMPLE = "a😀b\n你好 e\u0301x\r\n🇫🇷\rend"


@pytest.mark.parametrize(
    ("encoding", "character", "expected_bytes"),
    [
        (UTF16, 1, 1),  # after "a"
        (UTF16, 3, 5),  # after "a😀" (the emoji is two UTF-16 units, four bytes)
        (UTF16, 2, 1),  # inside the surrogate pair: rounds down to the emoji's start
        (UTF8, 5, 5),
        (UTF8, 3, 1),  # inside the emoji's bytes: rounds down
        (UTF32, 2, 5),
        (UTF16, 99, 6),  # past the end of the line: clamped to its length
    ],
)
def test_units_to_bytes(encoding, character, expected_bytes):
    assert units_to_bytes("a😀b".encode(), character, encoding) == expected_bytes


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_positions_round_trip_on_sample(encoding):
    doc = Document("file:///s.txt", SAMPLE, encoding=encoding)
    assert doc.line_count == 4
    assert [doc.line_text(i) for i in range(4)] == ["a😀b", "你好 e\u0301x", "🇫🇷", "end"]
    for index in range(len(SAMPLE) + 1):
        if SAMPLE[index - 1 : index + 1] == "\r\n":
            continue  # between \r and \n is not a position
        pos = position_of(SAMPLE, index, encoding)
        offset = doc.offset_at(pos.line, pos.character)
        assert offset == len(SAMPLE[:index].encode())
        assert doc.position_at(offset) == (pos.line, pos.character)


def test_bytes_to_units_inside_a_character_counts_whole_characters():
    line = "😀x".encode()
    assert bytes_to_units(line, 2, UTF16) == 0
    assert bytes_to_units(line, 4, UTF16) == 2
    assert bytes_to_units(line, 5, UTF32) == 2


def test_offsets_clamp_past_the_end():
    doc = Document("file:///a", "ab\ncd")
    assert doc.offset_at(0, 10) == 2
    assert doc.offset_at(7, 0) == 5
    assert doc.offset_at(-1, 0) == 0
    assert not doc.is_valid_position(2, 0)
    assert doc.is_valid_position(1, 50)


def test_edit_reports_byte_offsets_and_points():
    doc = Document("file:///a", "x😀\nyz\n")
    edit = doc.apply_change("Q\nR", (0, 3), (1, 1))  # replace "\ny" after the emoji
    assert doc.text == "x😀Q\nRz\n"
    assert (edit.start_byte, edit.old_end_byte, edit.new_end_byte) == (5, 7, 8)
    assert edit.start_point == (0, 5)
    assert edit.old_end_point == (1, 1)
    assert edit.new_end_point == (1, 1)


def test_crlf_joined_and_split_by_edits():
    doc = Document("file:///a", "a\rb")
    doc.apply_change("\n", (1, 0), (1, 0))  # "\r" + "\n" become one line break
    assert doc.text == "a\r\nb" and doc.line_count == 2 and doc.line_starts == line_starts_of(doc.data)
    doc.apply_change("x", (0, 1), (1, 0))  # replace the whole break
    assert doc.text == "axb" and doc.line_count == 1 and doc.line_starts == [0]


# -- fuzzing -------------------------------------------------------------------

_PIECES = ["a", "b", "x", " ", "    ", "(", ")", ":", "\n", "\r\n", "\r", "😀", "你", "é", "e\u0301", "🇫🇷", "\t", "\udc80"]
pieces = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)


@st.composite
def edit_scripts(draw):
    text = draw(pieces)
    edits = []
    current = text
    for _ in range(draw(st.integers(1, 8))):
        a = draw(st.integers(0, len(current)))
        b = draw(st.integers(a, len(current)))
        # Never split a "\r\n": positions cannot point between them.
        if current[a - 1 : a + 1] == "\r\n":
            a -= 1
        if current[b - 1 : b + 1] == "\r\n":
            b += 1
        new = draw(pieces)
        edits.append((a, b, new))
        current = current[:a] + new + current[b:]
    return text, edits


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=edit_scripts(), encoding=st.sampled_from(ENCODINGS))
def test_random_edits_match_reference(script, encoding):
    text, edits = script
    doc = Document("file:///f.txt", text, encoding=encoding)
    reference = text
    for a, b, new in edits:
        start = position_of(reference, a, encoding)
        end = position_of(reference, b, encoding)
        doc.apply_change(new, (start.line, start.character), (end.line, end.character))
        reference = reference[:a] + new + reference[b:]
        assert doc.text == reference
        assert doc.line_starts == line_starts_of(doc.data)
        assert doc.line_count == len(re.split(r"\r\n|\r|\n", reference))
    for index in range(0, len(reference) + 1, 3):
        if reference[index - 1 : index + 1] == "\r\n":
            continue
        pos = position_of(reference, index, encoding)
        assert doc.position_at(doc.offset_at(pos.line, pos.character)) == (pos.line, pos.character)


_CODE = ["def f(x):\n", "    return x\n", "class A:\n", "    pass\n", "if x:\n", "y = [1, 2]\n", "# é\n", "s = '😀'\n", "\n", "    ", "(", ")", ":", "z", "\n"]
code = st.lists(st.sampled_from(_CODE), max_size=10).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=code, data=st.data(), background=st.booleans())
def test_incremental_tree_equals_fresh_parse(text, data, background):
    # With background=True reparses run on the worker thread while later edits queue up.
    ws = Workspace(encoding=UTF16, background_parse=background)
    opened = ws.open("file:///t.py", text, language_id="python")
    reference = text
    for version in range(data.draw(st.integers(1, 6))):
        a = data.draw(st.integers(0, len(reference)))
        b = data.draw(st.integers(a, min(len(reference), a + 12)))
        new = data.draw(code)
        start = position_of(reference, a, UTF16)
        end = position_of(reference, b, UTF16)
        ws.change(opened.uri, version + 2, [Change(new, (start.line, start.character), (end.line, end.character))])
        reference = reference[:a] + new + reference[b:]
        if data.draw(st.booleans()):  # sometimes reparse between edits, sometimes batch them
            assert opened.tree is not None
    fresh = parser_for(load("python")).parse(reference.encode())
    assert opened.doc.text == reference
    assert str(opened.tree.root_node) == str(fresh.root_node)


def test_full_document_change_replaces_text_and_tree():
    ws = Workspace()
    opened = ws.open("file:///t.py", "x = 1\n", language_id="python")
    ws.change(opened.uri, 2, [Change("def g():\n    pass\n")])
    assert opened.doc.text == "def g():\n    pass\n"
    assert opened.tree.root_node.children[0].type == "function_definition"


def test_edits_past_the_size_limit_stop_parsing_and_resume():
    ws = Workspace(max_file_bytes=20)
    opened = ws.open("file:///t.py", "x = 1\n", language_id="python")
    assert opened.skip_reason is None
    ws.change(opened.uri, 2, [Change("y = 2\n" * 10, (1, 0), (1, 0))])
    assert opened.skip_reason is not None and opened.tree is None
    ws.change(opened.uri, 3, [Change("z = 3\n")])
    assert opened.skip_reason is None and opened.tree is not None


async def test_background_reparse_with_queued_edits_matches_fresh_parse():
    from quickdraft.bench.lsp_common import generate_python

    text = generate_python(3000)
    ws = Workspace(background_parse=True)
    opened = ws.open("file:///big.py", text, language_id="python")
    reference = text
    # Edits at the end of blocks (slow to reparse) arrive faster than the
    # worker parses, so most of them queue behind a running parse.
    for version, index in enumerate(m.end() for m in re.finditer("return results", text)):
        if version >= 12:
            break
        at = index + version  # earlier insertions shifted the text
        pos = position_of(reference, at, UTF16)
        ws.change(opened.uri, version + 2, [Change("x", (pos.line, pos.character), (pos.line, pos.character))])
        reference = reference[:at] + "x" + reference[at:]
    tree = await opened.fresh_tree()
    assert opened.doc.text == reference
    assert str(tree.root_node) == str(parser_for(load("python")).parse(reference.encode()).root_node)
