"""Prefetch after an accepted suggestion, and reuse of a shown suggestion (issue 25)."""

from __future__ import annotations

import asyncio

import pytest

from quickdraft.lsp_bridge.cache import CompletionCache
from quickdraft.lsp_bridge.postprocess import Completion, next_line_shape
from quickdraft.lsp_bridge.workspace import Change, Workspace
from tests.lsp.test_backend import _completer

URI = "file:///r/a.py"
SHOWN = "return a + b"


async def _shown_then_accepted(fake_server, **settings):
    """A suggestion shown at the end of "def f():\\n    ", then accepted (its whole text inserted)."""
    ws, completer = _completer(fake_server.address, **settings)
    opened = ws.open(URI, "def f():\n    ", language_id="python")
    first = await completer.complete(URI, 1, 4)
    assert first.completion.text == SHOWN
    ws.change(URI, 2, [Change(SHOWN, (1, 4), (1, 4))])
    completer.on_change(URI)
    return ws, completer, opened


LANDING = (1, 4 + len(SHOWN))


def _enter(ws, completer, version: int, indent: str = "    ", at: tuple[int, int] = LANDING) -> tuple[int, int]:
    """The user presses Enter at ``at``; the editor indents the new line with ``indent``."""
    ws.change(URI, version, [Change("\n" + indent, at, at)])
    completer.on_change(URI)
    return at[0] + 1, len(indent)


@pytest.mark.parametrize("enabled", [False, True])
async def test_prefetch_only_when_enabled(fake_server, enabled):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=enabled)
    if not enabled:
        assert completer.stats["prefetch_started"] == 0 and not completer._prefetch
        assert len(fake.requests) == 1
        await completer.complete(URI, *_enter(ws, completer, 3))
        assert len(fake.requests) == 2
        return
    # Asked at once, before the editor asks: the line after the accepted one, from its start.
    await fake.wait_for(lambda: len(fake.requests) == 2)
    assert completer.stats["prefetch_next_line"] == 1
    ask = fake.requests[1]
    assert ask.prefix.endswith("    " + SHOWN + "\n") and ask.suffix == ""
    assert list(ask.stop) == [] and ask.max_tokens == 48  # "return a + b" opens no block: one line
    result = await completer.complete(URI, *_enter(ws, completer, 3))
    assert len(fake.requests) == 2  # the editor's request after Enter took the prefetched answer
    assert result.completion.text == SHOWN and result.offset == opened.doc.offset_at(2, 4)
    assert result.completion.request_id == ask.request_id or not ask.request_id
    assert completer.stats["prefetch_started"] == completer.stats["prefetch_used"] == 1
    # Remembered as if asked there: asked again, no RPC.
    again = await completer.complete(URI, 2, 4)
    assert again.completion.text == SHOWN and len(fake.requests) == 2


async def test_the_request_at_the_end_of_the_accepted_line_keeps_the_next_lines_prefetch(fake_server):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    await fake.wait_for(lambda: len(fake.requests) == 2)
    # Editors ask where the accept left the cursor: the line is finished, nothing is asked there.
    assert await completer.complete(URI, *LANDING) is None
    assert len(fake.requests) == 2 and completer.stats["prefetch_landing_skipped"] == 1
    # Asked explicitly, the model is asked; the prefetch stays.
    await completer.complete(URI, *LANDING, invoked=True)
    assert len(fake.requests) == 3 and completer.stats["prefetch_cancelled"] == 0
    await completer.complete(URI, *_enter(ws, completer, 3))
    assert len(fake.requests) == 3 and completer.stats["prefetch_used"] == 1


@pytest.mark.parametrize(("answer", "indent", "shown"), [
    ("    x = 1", "    ", "x = 1"),          # the guessed indentation
    ("        x = 1", "    ", "    x = 1"),  # deeper than the editor's: kept
    ("    x = 1", "", "    x = 1"),          # the editor dedented: the model's indentation is the suggestion's
    ("x = 1", "    ", "x = 1"),              # shallower than the editor's: dropped (ghost text cannot dedent)
])
async def test_the_answer_is_shaped_for_the_indentation_enter_made(fake_server, answer, indent, shown):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.deltas = [answer[:3], answer[3:] + "\n"]
    await fake.wait_for(lambda: len(fake.requests) == 2)
    result = await completer.complete(URI, *_enter(ws, completer, 3, indent))
    assert len(fake.requests) == 2
    assert result.completion.text == shown


async def test_after_a_block_opener_the_next_line_is_a_block(fake_server):
    fake = fake_server.fake
    fake.deltas = ["def g(a):"]
    ws, completer = _completer(fake_server.address, prefetchAfterAccept=True)
    ws.open(URI, "class C:\n    ", language_id="python")
    first = await completer.complete(URI, 1, 4)
    assert first.completion.text == "def g(a):"
    fake.deltas = ["        y = a\n", "        return y\n", "    def h(self):\n"]
    ws.change(URI, 2, [Change("def g(a):", (1, 4), (1, 4))])
    completer.on_change(URI)
    await fake.wait_for(lambda: len(fake.requests) == 2)
    assert fake.requests[1].max_tokens == 128
    result = await completer.complete(URI, *_enter(ws, completer, 3, "        ", at=(1, 13)))
    assert len(fake.requests) == 2
    assert result.completion.text == "y = a\n        return y"  # up to the block's end


async def test_typing_on_cancels_the_prefetch(fake_server):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.block = 1  # the prefetch waits until it is cancelled
    await fake.wait_for(lambda: len(fake.requests) == 2)
    ws.change(URI, 3, [Change("x", LANDING, LANDING)])  # not Enter
    completer.on_change(URI)
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert completer.stats["prefetch_cancelled"] == 1 and not completer._prefetch


async def test_typing_after_enter_cancels_the_prefetch(fake_server):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.block = 1
    await fake.wait_for(lambda: len(fake.requests) == 2)
    line, col = _enter(ws, completer, 3)
    assert completer._prefetch  # Enter keeps it
    ws.change(URI, 4, [Change("p", (line, col), (line, col))])
    completer.on_change(URI)
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert completer.stats["prefetch_cancelled"] == 1 and not completer._prefetch


async def test_an_edit_elsewhere_that_looks_like_enter_cancels_the_prefetch(fake_server):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.block = 1
    await fake.wait_for(lambda: len(fake.requests) == 2)
    ws.change(URI, 3, [Change("\n    ", (0, 0), (0, 0))])  # a line break and indentation, at the top
    completer.on_change(URI)
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert not completer._prefetch


async def test_a_request_elsewhere_cancels_the_prefetch(fake_server):
    fake = fake_server.fake
    fake.block = 0
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.block = 1
    await fake.wait_for(lambda: len(fake.requests) == 2)
    await completer.complete(URI, 0, 3)  # the user moved the cursor up and asked there
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert completer.stats["prefetch_used"] == 0


async def test_a_request_that_joined_the_prefetch_takes_it_down_when_superseded(fake_server):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.block = 1
    await fake.wait_for(lambda: len(fake.requests) == 2)
    line, col = _enter(ws, completer, 3)
    joined = asyncio.ensure_future(completer.complete(URI, line, col))
    await asyncio.sleep(0)
    assert completer.stats["prefetch_used"] == 1
    ws.change(URI, 4, [Change("x", (line, col), (line, col))])
    completer.on_change(URI)
    fake.block = 0
    await completer.complete(URI, line, col + 1)
    assert await joined is None
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert completer.stats["prefetch_cancelled"] == 1


async def test_with_code_after_the_accepted_text_the_prefetch_is_at_its_end(fake_server):
    fake = fake_server.fake
    fake.deltas = ["a, b"]
    ws, completer = _completer(fake_server.address, prefetchAfterAccept=True)
    ws.open(URI, "def f(a, b):\n    print()", language_id="python")
    first = await completer.complete(URI, 1, 10)
    assert first.completion.text == "a, b"
    ws.change(URI, 2, [Change("a, b", (1, 10), (1, 10))])
    completer.on_change(URI)
    await fake.wait_for(lambda: len(fake.requests) == 2)
    assert completer.stats["prefetch_next_line"] == 0
    assert fake.requests[1].prefix.endswith("print(a, b") and list(fake.requests[1].stop) == ["\n"]
    await completer.complete(URI, 1, 14)
    assert len(fake.requests) == 2 and completer.stats["prefetch_used"] == 1


async def test_no_prefetch_when_the_edit_is_not_the_suggestion(fake_server):
    ws, completer = _completer(fake_server.address, prefetchAfterAccept=True)
    ws.open(URI, "def f():\n    ", language_id="python")
    await completer.complete(URI, 1, 4)
    ws.change(URI, 2, [Change("return a - b", (1, 4), (1, 4))])
    completer.on_change(URI)
    assert completer.stats["prefetch_started"] == 0


def test_next_line_shape_guesses_the_editors_indentation_and_block():
    ws = Workspace()
    opened = ws.open("file:///b.py", "def f(a):\n    if a:\nx = 1\n", language_id="python")
    doc = opened.doc
    inside = next_line_shape(opened, doc.line_range(1)[1])  # after "    if a:"
    assert (inside.line_prefix, inside.multiline, inside.from_line_start) == ("        ", True, True)
    after = next_line_shape(opened, doc.line_range(2)[1])  # after "x = 1"
    assert (after.line_prefix, after.multiline) == ("", False)
    assert next_line_shape(opened, doc.line_range(0)[0] + 3) is None  # code follows on the line


# -- reuse: typing through what is shown ---------------------------------------


def _doc(text: str):
    ws = Workspace()
    return ws, ws.open("file:///a.py", text, language_id="python")


def test_typed_through_continues_across_lines():
    ws, opened = _doc("def f(a, b):\n    ")
    cache = CompletionCache()
    cache.put(opened, 17, Completion("total = a + b\n    return total"))
    ws.change(opened.uri, 2, [Change("total = a + b\n    ret", (1, 4), (1, 4))])
    assert cache.typed_through(opened, 17 + len("total = a + b\n    ret")) == Completion("urn total")
    # Deleted back to where it was shown: the whole suggestion again.
    ws.change(opened.uri, 3, [Change("", (1, 4), (2, 7))])
    assert cache.typed_through(opened, 17) == Completion("total = a + b\n    return total")
    # Diverging on the next line ends it.
    ws.change(opened.uri, 4, [Change("total = a + b\n    yield", (1, 4), (1, 4))])
    assert cache.typed_through(opened, 17 + len("total = a + b\n    yield")) is None


def test_accepted_is_the_whole_suggestion_inserted_where_it_was_shown():
    ws, opened = _doc("x = ")
    cache = CompletionCache()
    cache.put(opened, 4, Completion("compute(a)"))
    ws.change(opened.uri, 2, [Change("compute(", (0, 4), (0, 4))])
    assert cache.accepted(opened) is None  # typed part of it
    ws.change(opened.uri, 3, [Change("a)", (0, 12), (0, 12))])
    assert cache.accepted(opened) == 14  # typed its last character: the cursor is at its end
    assert cache.accepted(opened) is None  # spent
    assert cache.typed_through(opened, 14) is None


# -- through the LSP bridge --------------------------------------------------------


async def test_an_accept_through_the_bridge_prefetches_and_the_counters_say_so(fake_server, bridge_factory):
    fake = fake_server.fake
    editor = await bridge_factory(fake_server.address, options={"prefetchAfterAccept": True})
    await editor.status.wait_for("up")
    uri = editor.open("calc.py", "def add(a, b):\n    ")
    shown = await editor.inline(uri)
    assert [item.insert_text for item in shown.items] == [SHOWN]
    editor.type(uri, len(editor.texts[uri]), SHOWN)  # the editor inserts the accepted suggestion
    await fake.wait_for(lambda: len(fake.requests) == 2)  # the next line, asked before Enter
    editor.type(uri, len(editor.texts[uri]), "\n    ")
    after_enter = await editor.inline(uri)
    assert [item.insert_text for item in after_enter.items] == [SHOWN]
    assert len(fake.requests) == 2
    stats = await editor.client.protocol.send_request_async("quickdraft/bridgeStats", {})
    stats = stats if isinstance(stats, dict) else stats._asdict()
    assert stats["prefetch_started"] == 1 and stats["prefetch_used"] == 1 and stats["model_requests"] == 2
    assert stats["prefetch_next_line"] == 1
