"""The bridge driven as an editor drives it: a subprocess speaking LSP over stdio,
in front of a real gRPC server with a fake Completion servicer."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from quickdraft.v1 import completion_pb2 as pb


def texts(result: types.InlineCompletionList) -> list[str]:
    return [item.insert_text for item in result.items]


async def test_open_and_complete(editor, fake_server):
    text = "def add(a, b):\n    "
    uri = editor.open("calc.py", text)
    result = await editor.inline(uri)
    assert texts(result) == ["return a + b"]
    request = fake_server.fake.requests[-1]
    assert request.prefix == "def add(a, b):\n"  # a blank line is asked from its start
    assert request.suffix == ""
    assert request.language_id == "python"
    assert request.file_path == "calc.py"
    assert request.repo_name == editor.root.name
    assert request.latency_class == pb.LATENCY_CLASS_INLINE
    capabilities = editor.init_result.capabilities
    assert capabilities.inline_completion_provider is not None
    assert capabilities.completion_provider is None  # inline clients get no duplicate list


async def test_incremental_edits_reach_the_prompt(editor, fake_server):
    uri = editor.open("edit.py", "def f(x):\n    return x\n")
    editor.type(uri, len("def f(x"), ", y")  # def f(x, y):
    editor.edit(uri, len("def f(x, y):\n    return "), len("def f(x, y):\n    return x"), "x * y")
    editor.type(uri, len(editor.texts[uri]), "\ndef g():\n    ")
    result = await editor.inline(uri)
    assert result.items
    assert editor.texts[uri] == "def f(x, y):\n    return x * y\n\ndef g():\n    "
    assert fake_server.fake.requests[-1].prefix == editor.texts[uri].removesuffix("    ")


@pytest.mark.parametrize(
    ("offered", "expected"),
    [(None, "utf-16"), (["utf-32"], "utf-16")],
)
async def test_position_encoding_negotiation(fake_server, bridge_factory, offered, expected):
    ed = await bridge_factory(fake_server.address, encodings=offered)
    assert ed.encoding == expected


@pytest.mark.parametrize(("offered", "encoding"), [(None, "utf-16"), (["utf-16", "utf-8"], "utf-8")])
async def test_non_ascii_positions(fake_server, bridge_factory, offered, encoding):
    ed = await bridge_factory(fake_server.address, encodings=offered)
    assert ed.encoding == encoding
    # Emoji (two UTF-16 units, four UTF-8 bytes), CJK, a combining accent, a flag (two code points).
    text = 'greeting = "😀 你好 e\u0301 🇫🇷"\nnames = ["é", "😀"]\nresult = combine(greeting, '
    uri = ed.open("uni.py", text)
    ed.type(uri, len(text), "\u4e2d")  # one more CJK character at the cursor line
    ed.edit(uri, len("greeting = \"😀"), len("greeting = \"😀 你好"), " 世界")
    fake_server.fake.deltas = ["names)"]
    index = len(ed.texts[uri])
    position = ed.position(uri, index)
    result = await ed.inline(uri, position=position)
    request = fake_server.fake.requests[-1]
    assert request.prefix == ed.texts[uri]
    assert request.prefix.startswith('greeting = "😀 世界 e\u0301 🇫🇷"')
    [item] = result.items
    assert item.insert_text == "names)"
    assert item.range.start == position and item.range.end == position

    # On a line that already has the closer, the draft's ")" replaces it instead of doubling it.
    line = 'label = pick("😀", 你好)\n'
    uri = ed.open("close.py", line)
    cursor = line.index(")")
    fake_server.fake.deltas = ["1, 2);"]
    result = await ed.inline(uri, cursor)
    request = fake_server.fake.requests[-1]
    assert request.prefix == line[:cursor] and request.suffix == line[cursor:]
    [item] = result.items
    assert item.insert_text == "1, 2);"
    assert item.range.start == ed.position(uri, cursor)
    assert item.range.end == ed.position(uri, cursor + 1)


async def test_cancel_request_cancels_the_grpc_stream(editor, fake_server):
    fake = fake_server.fake
    fake.block = 1
    uri = editor.open("slow.py", "def slow():\n    ")
    params = editor.inline_params(uri, editor.position(uri, len(editor.texts[uri])))
    pending = asyncio.ensure_future(
        editor.client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id="slow-1")
    )
    await fake.wait_for(lambda: len(fake.requests) == 1)
    editor.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="slow-1"))
    await fake.wait_for(lambda: fake.cancelled == 1)
    with pytest.raises(JsonRpcException):
        await pending
    assert fake.finished == 0


async def test_newer_request_cancels_the_older_stream(editor, fake_server):
    fake = fake_server.fake
    fake.block = 1
    uri = editor.open("race.py", "def race():\n    ")
    first = asyncio.ensure_future(editor.inline(uri))
    await fake.wait_for(lambda: len(fake.requests) == 1)
    editor.type(uri, len(editor.texts[uri]), "r")
    second = await editor.inline(uri)
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert texts(await first) == []
    assert texts(second) == ["return a + b"]
    assert len(fake.requests) == 2


async def test_server_down_then_up(fake_server, bridge_factory):
    fake = fake_server.fake
    await fake_server.stop()
    ed = await bridge_factory(fake_server.address)
    await ed.status.wait_for("down")
    uri = ed.open("later.py", "def later():\n    ")
    assert texts(await ed.inline(uri)) == []
    assert fake.requests == []
    await fake_server.start()  # same port
    await ed.status.wait_for("up")
    result = await ed.inline(uri)
    assert texts(result) == ["return a + b"]
    assert len(fake.requests) == 1


async def test_server_dies_mid_session(editor, fake_server):
    uri = editor.open("dies.py", "def dies():\n    ")
    assert (await editor.inline(uri)).items
    await fake_server.stop()
    editor.type(uri, len(editor.texts[uri]), "x")
    assert texts(await editor.inline(uri)) == []
    await editor.status.wait_for("down")
    editor.status.states.clear()
    await fake_server.start()
    await editor.status.wait_for("up")
    editor.type(uri, len(editor.texts[uri]), " = ")
    assert (await editor.inline(uri)).items


async def test_bad_input_gets_empty_results(editor, fake_server):
    unknown = editor.uri("never-opened.py")
    result = await editor.inline(unknown, position=types.Position(0, 0))
    assert texts(result) == []
    uri = editor.open("short.py", "x = 1\n")
    past_end = await editor.inline(uri, position=types.Position(line=40, character=3))
    assert texts(past_end) == []
    # A character past the end of a line is clamped to the line's end (as the spec says).
    clamped = await editor.inline(uri, position=types.Position(line=0, character=99))
    assert fake_server.fake.requests[-1].prefix == "x = 1"
    assert clamped.items


async def test_huge_and_binary_files_are_skipped(fake_server, bridge_factory):
    ed = await bridge_factory(fake_server.address, options={"maxFileBytes": 2000})
    await ed.status.wait_for("up")
    huge = ed.open("huge.py", "x = 1\n" * 1000)
    binary = ed.open("blob.py", "abc\x00def\n")
    assert texts(await ed.inline(huge)) == []
    assert texts(await ed.inline(binary)) == []
    assert fake_server.fake.requests == []
    logged = " ".join(m.message for m in ed.client.log_messages)
    assert "huge.py" in logged and "larger than 2000 bytes" in logged
    assert "blob.py" in logged and "binary" in logged


async def test_no_completion_in_comments_unless_enabled(fake_server, bridge_factory):
    ed = await bridge_factory(fake_server.address)
    uri = ed.open("c.py", "x = 1  # a comment ")
    assert texts(await ed.inline(uri)) == []
    assert fake_server.fake.requests == []
    ed.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"quickdraft": {"enableInComments": True}})
    )
    fake_server.fake.deltas = ["about x"]
    result = await ed.inline(uri)
    assert texts(result) == ["about x"]


async def test_settings_change_max_tokens(editor, fake_server):
    editor.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"maxTokens": 7}))
    uri = editor.open("m.py", "def m():\n    ")
    await editor.inline(uri)
    assert fake_server.fake.requests[-1].max_tokens == 7


async def test_completion_fallback_without_inline_support(fake_server, bridge_factory):
    ed = await bridge_factory(fake_server.address, inline=False)
    assert ed.init_result.capabilities.completion_provider is not None
    uri = ed.open("fb.py", "def add(a, b):\n    ret")
    fake_server.fake.deltas = ["urn a + b"]
    result = await ed.client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=ed.position(uri, len(ed.texts[uri])))
    )
    [item] = result.items
    assert item.text_edit.new_text == "return a + b"
    assert item.text_edit.range.start == types.Position(1, 4)
    assert item.text_edit.range.end == types.Position(1, 7)


async def test_context_from_open_documents_and_imported_files(editor, fake_server):
    pkg = editor.root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "geometry.py").write_text("import math\n\n\ndef area(radius):\n    return math.pi * radius ** 2\n\n\ndef unused():\n    pass\n")
    editor.open("util.py", "def clamp(value, low, high):\n    return max(low, min(value, high))\n")
    text = "from pkg.geometry import area\n\n\ndef report(r):\n    size = clamp(area(r), 0, 10)\n    "
    uri = editor.open("main.py", text)
    await editor.inline(uri)
    request = fake_server.fake.requests[-1]
    files = {f.path: f.content for f in request.context_files}
    assert "def area(radius):" in files["pkg/geometry.py"]
    assert "def unused" not in files["pkg/geometry.py"]
    assert "def clamp(value, low, high):" in files["util.py"]
    assert request.prefix == text.removesuffix("    ")  # a blank line: the prompt starts it afresh


async def test_a_blank_line_is_asked_from_its_start_and_gets_the_line_without_its_indentation(editor, fake_server):
    """On a blank line the prompt ends where the line begins and resumes after
    it, so the model writes a whole line; the editor gets it without the
    indentation the cursor already has. The server was not told to stop at the
    first line break (an answer may begin with one)."""
    text = "def area(r):\n    x = r * r\n    \n    return x\n"
    uri = editor.open("blank.py", text)
    fake_server.fake.deltas = ["  ", "  y = x * 3.14\n", "    z = 1\n"]
    result = await editor.inline(uri, position=types.Position(line=2, character=4))
    assert texts(result) == ["y = x * 3.14"]
    request = fake_server.fake.requests[-1]
    assert list(request.stop) == []
    assert request.prefix == "def area(r):\n    x = r * r\n" and request.suffix == "    return x\n"
    # with the setting off, the prompt is cut at the cursor and a leading line break is skipped
    editor.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"quickdraft": {"blankLineFromLineStart": False}})
    )
    uri3 = editor.open("blank3.py", text)
    fake_server.fake.deltas = ["\n", "    y = x * 3.14\n", "    z = 1\n"]
    result = await editor.inline(uri3, position=types.Position(line=2, character=4))
    assert texts(result) == ["y = x * 3.14"]
    assert fake_server.fake.requests[-1].prefix == "def area(r):\n    x = r * r\n    "
    # with text before the cursor, the line still ends at the first line break, server-side
    uri2 = editor.open("typed.py", "def area(r):\n    x = \n    return x\n")
    fake_server.fake.deltas = ["r * r\n", "more\n"]
    result = await editor.inline(uri2, position=types.Position(line=1, character=8))
    assert texts(result) == ["r * r"]
    assert list(fake_server.fake.requests[-1].stop) == ["\n"]
