"""Recent completions, so that repeated requests and typing along cost no RPC.

Two lookups: the exact (uri, version, offset) of an earlier request, and
"typed through": the user typed the first characters of the completion that
was shown last, so the rest of it is still the suggestion.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from quickdraft.lsp_bridge.postprocess import Completion
from quickdraft.lsp_bridge.text import decode
from quickdraft.lsp_bridge.workspace import OpenDocument


@dataclass(frozen=True)
class _Shown:
    offset: int
    line_start: int
    line_prefix: bytes
    completion: Completion


class CompletionCache:
    def __init__(self, size: int = 64):
        self.size = size
        self._entries: OrderedDict[tuple[str, int, int], Completion | None] = OrderedDict()
        self._last: dict[str, _Shown] = {}

    def get(self, uri: str, version: int, offset: int) -> tuple[bool, Completion | None]:
        """(hit, completion); a hit may be a remembered "nothing to complete"."""
        key = (uri, version, offset)
        if key not in self._entries:
            return False, None
        self._entries.move_to_end(key)
        return True, self._entries[key]

    def put(self, opened: OpenDocument, offset: int, completion: Completion | None) -> None:
        doc = opened.doc
        self._entries[(opened.uri, doc.version, offset)] = completion
        self._entries.move_to_end((opened.uri, doc.version, offset))
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        if completion is not None:
            line_start = doc.line_starts[doc.line_of(offset)]
            self._last[opened.uri] = _Shown(offset, line_start, doc.data[line_start:offset], completion)

    def typed_through(self, opened: OpenDocument, offset: int) -> Completion | None:
        shown = self._last.get(opened.uri)
        if shown is None or offset <= shown.offset:
            return None
        doc = opened.doc
        if doc.line_starts[doc.line_of(offset)] != shown.line_start:
            return None
        if doc.data[shown.line_start : shown.offset] != shown.line_prefix:
            return None
        typed = decode(doc.data[shown.offset : offset])
        text = shown.completion.text
        if "\n" in typed or not text.startswith(typed) or len(typed) >= len(text):
            return None
        return replace(shown.completion, text=text[len(typed) :])  # the same suggestion, from the same request

    def forget(self, uri: str) -> None:
        self._last.pop(uri, None)
        for key in [k for k in self._entries if k[0] == uri]:
            del self._entries[key]
