"""Recent completions, so that repeated requests and typing along cost no RPC.

Two lookups: the exact (uri, version, offset) of an earlier request, and
"typed through": the user typed the first characters of the completion that
was shown last (line breaks included: a block suggestion stays while its lines
are typed), or deleted back to where it was shown, so the rest of it is still
the suggestion. ``accepted`` tells when the last edit inserted the whole of
it (prefetching starts there).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from quickdraft.lsp_bridge.postprocess import Completion
from quickdraft.lsp_bridge.text import decode, encode
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
        """The rest of the last shown completion when the text from where it
        was shown to ``offset`` is its beginning (possibly empty: deleted back
        to where it was shown); None when the user typed anything else."""
        shown = self._last.get(opened.uri)
        if shown is None or offset < shown.offset:
            return None
        data = opened.doc.data
        if data[shown.line_start : shown.offset] != shown.line_prefix:
            return None
        if shown.line_start and data[shown.line_start - 1 : shown.line_start] not in (b"\n", b"\r"):
            return None  # an edit above moved the line: not the same place
        typed = data[shown.offset : offset]
        text = shown.completion.text
        written = encode(text)
        if len(typed) >= len(written) or not written.startswith(typed):
            return None
        # The same suggestion, from the same request.
        return replace(shown.completion, text=text[len(decode(typed)) :]) if typed else shown.completion

    def accepted(self, opened: OpenDocument) -> int | None:
        """Where the cursor landed if the document's last edit ended by inserting
        the whole of the last shown completion where it was shown (the user
        accepted it, or typed its last character); None otherwise. Either way
        that suggestion is spent: it is not typed through any more."""
        shown = self._last.get(opened.uri)
        if shown is None:
            return None
        doc = opened.doc
        written = encode(shown.completion.text)
        landing = shown.offset + len(written)
        if doc.last_edit_offset != landing or doc.data[shown.offset : landing] != written:
            return None
        if doc.data[shown.line_start : shown.offset] != shown.line_prefix:
            return None
        del self._last[opened.uri]
        return landing

    def forget(self, uri: str) -> None:
        self._last.pop(uri, None)
        for key in [k for k in self._entries if k[0] == uri]:
            del self._entries[key]
