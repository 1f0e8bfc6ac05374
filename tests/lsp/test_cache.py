"""The completion cache and typing through a shown completion."""

from __future__ import annotations

from quickdraft.lsp_bridge.cache import CompletionCache
from quickdraft.lsp_bridge.postprocess import Completion
from quickdraft.lsp_bridge.workspace import Change, Workspace


def _doc(text="x = "):
    ws = Workspace()
    return ws, ws.open("file:///a.py", text, language_id="python")


def test_hits_by_uri_version_offset_and_remembers_nothing():
    ws, opened = _doc()
    cache = CompletionCache(size=2)
    cache.put(opened, 4, Completion("1"))
    assert cache.get(opened.uri, opened.doc.version, 4) == (True, Completion("1"))
    assert cache.get(opened.uri, opened.doc.version + 1, 4) == (False, None)
    cache.put(opened, 3, None)
    assert cache.get(opened.uri, opened.doc.version, 3) == (True, None)
    cache.put(opened, 2, None)  # evicts the oldest
    assert cache.get(opened.uri, opened.doc.version, 4) == (False, None)


def test_typed_through_follows_the_suggestion_only():
    ws, opened = _doc("value = ")
    cache = CompletionCache()
    cache.put(opened, 8, Completion("compute(a)", replace_bytes=0))
    ws.change(opened.uri, 2, [Change("comp", (0, 8), (0, 8))])
    assert cache.typed_through(opened, 12) == Completion("ute(a)")
    ws.change(opened.uri, 3, [Change("X", (0, 12), (0, 12))])
    assert cache.typed_through(opened, 13) is None


def test_typed_through_needs_the_same_line_prefix():
    ws, opened = _doc("value = ")
    cache = CompletionCache()
    cache.put(opened, 8, Completion("compute(a)"))
    ws.change(opened.uri, 2, [Change("other", (0, 0), (0, 5)), Change("c", (0, 8), (0, 8))])
    assert cache.typed_through(opened, 9) is None
    cache.forget(opened.uri)
    assert cache.get(opened.uri, 1, 8) == (False, None)
