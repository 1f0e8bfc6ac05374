"""Prefetch after an accepted suggestion, and reuse of a shown suggestion (issue 25)."""

from __future__ import annotations

import asyncio

import pytest

from quickdraft.lsp_bridge.cache import CompletionCache
from quickdraft.lsp_bridge.postprocess import Completion
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


@pytest.mark.parametrize("enabled", [False, True])
async def test_prefetch_only_when_enabled(fake_server, enabled):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=enabled)
    landing = (1, 4 + len(SHOWN))
    if not enabled:
        assert completer.stats["prefetch_started"] == 0 and not completer._prefetch
        assert len(fake.requests) == 1
        await completer.complete(URI, *landing)
        assert len(fake.requests) == 2
        return
    # Asked at once, before the editor asks, for the end of the accepted text.
    await fake.wait_for(lambda: len(fake.requests) == 2)
    assert fake.requests[1].prefix.endswith("    " + SHOWN)
    await completer.complete(URI, *landing)
    assert len(fake.requests) == 2  # the editor's request took the prefetched answer
    assert completer.stats["prefetch_started"] == completer.stats["prefetch_used"] == 1


async def test_typing_on_cancels_the_prefetch(fake_server):
    fake = fake_server.fake
    ws, completer, opened = await _shown_then_accepted(fake_server, prefetchAfterAccept=True)
    fake.block = 1  # the prefetch waits until it is cancelled
    await fake.wait_for(lambda: len(fake.requests) == 2)
    ws.change(URI, 3, [Change("x", (1, 4 + len(SHOWN)), (1, 4 + len(SHOWN)))])
    completer.on_change(URI)
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert completer.stats["prefetch_cancelled"] == 1 and not completer._prefetch


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
    landing = 4 + len(SHOWN)
    joined = asyncio.ensure_future(completer.complete(URI, 1, landing))
    await asyncio.sleep(0)
    assert completer.stats["prefetch_used"] == 1
    ws.change(URI, 3, [Change("x", (1, landing), (1, landing))])
    completer.on_change(URI)
    fake.block = 0
    await completer.complete(URI, 1, landing + 1)
    assert await joined is None
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert completer.stats["prefetch_cancelled"] == 1


async def test_no_prefetch_when_the_edit_is_not_the_suggestion(fake_server):
    ws, completer = _completer(fake_server.address, prefetchAfterAccept=True)
    ws.open(URI, "def f():\n    ", language_id="python")
    await completer.complete(URI, 1, 4)
    ws.change(URI, 2, [Change("return a - b", (1, 4), (1, 4))])
    completer.on_change(URI)
    assert completer.stats["prefetch_started"] == 0


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
    await fake.wait_for(lambda: len(fake.requests) == 2)  # asked before the editor asks
    await editor.inline(uri)
    assert len(fake.requests) == 2
    stats = await editor.client.protocol.send_request_async("quickdraft/bridgeStats", {})
    stats = stats if isinstance(stats, dict) else stats._asdict()
    assert stats["prefetch_started"] == 1 and stats["prefetch_used"] == 1 and stats["model_requests"] == 2
