"""Suggestion outcomes, from the editor to the server.

Each inline completion item the bridge answers carries an opaque suggestion
id (in its ``command``'s arguments). The editor echoes it back in
``quickdraft/completionOutcome`` notifications (shown, accepted, rejected;
docs/lsp.md); the bridge relates the id to the server request that wrote the
suggestion, adds the language, and forwards the outcomes to the server in
batches (``ReportOutcomes``).

Nothing here may slow a completion or grow without bound: a notification is
checked and queued (a full queue drops it, counted); a background task sends
batches; a batch the server does not take is dropped, counted, never retried.
No code text is ever part of an outcome: ids, counts, durations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger(__name__)

NOTIFICATION = "quickdraft/completionOutcome"
ACCEPT_COMMAND = "quickdraft.didAcceptSuggestion"
# What a client sets in ClientCapabilities.experimental to say it reports
# outcomes; only then do items carry the accept command (another client might
# try to run a command it does not know).
CAPABILITY = "quickdraftCompletionOutcomes"

KINDS = {"shown": pb.OUTCOME_KIND_SHOWN, "accepted": pb.OUTCOME_KIND_ACCEPTED, "rejected": pb.OUTCOME_KIND_REJECTED}
ACCEPTANCES = {"whole": pb.ACCEPTANCE_WHOLE, "word": pb.ACCEPTANCE_WORD, "line": pb.ACCEPTANCE_LINE}
REJECTIONS = {"dismissed": pb.REJECTION_DISMISSED, "typedOver": pb.REJECTION_TYPED_OVER, "replaced": pb.REJECTION_REPLACED}
MAX_SHOWN_MS = 24 * 3600 * 1000.0

Send = Callable[[list[pb.Outcome], str], Awaitable["grpc.StatusCode | None"]]


@dataclass(frozen=True)
class Suggestion:
    """What the bridge knows of a suggestion it answered."""

    request_id: str
    language: str
    chars: int  # code points of the suggestion as first answered


def _field(params: Any, name: str) -> Any:
    """A notification parameter: pygls hands custom params over as namedtuples (or dicts)."""
    if isinstance(params, dict):
        return params.get(name)
    return getattr(params, name, None)


def _choice(params: Any, name: str, names: dict[str, int], default: int | None) -> int | None:
    value = _field(params, name)
    return names.get(value, default) if isinstance(value, str) else default


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


class OutcomeReporter:
    """Suggestion ids for answered completions, and the queue of outcomes to send."""

    def __init__(self, send: Send | None = None, *, max_queue: int = 512, batch: int = 64, flush_delay_s: float = 1.0,
                 max_suggestions: int = 1024):
        # Request ids of this session start with it; declared to the server, it
        # opts them into the never-shown count (server/outcomes.py).
        self.prefix = f"lsp-{secrets.token_hex(4)}-"
        self.send = send
        self.max_queue = max_queue
        self.batch = batch
        self.flush_delay_s = flush_delay_s
        self.max_suggestions = max_suggestions
        self._numbers = itertools.count(1)
        self._suggestions: OrderedDict[str, Suggestion] = OrderedDict()
        self._by_request: dict[str, str] = {}
        self._queue: deque[pb.Outcome] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.sent = 0
        self.dropped = 0  # queue full, or a batch the server did not take
        self.ignored = 0  # notifications that named no known suggestion or were malformed
        self.enabled = True  # off once the server says it takes no reports

    def new_request_id(self) -> str:
        return f"{self.prefix}{next(self._numbers)}"

    def suggestion_id(self, request_id: str, language: str, chars: int) -> str:
        """The id of the suggestion a request wrote: one per request, so the
        same suggestion shown again (typed through) keeps its id."""
        existing = self._by_request.get(request_id)
        if existing is not None and existing in self._suggestions:
            self._suggestions.move_to_end(existing)
            return existing
        sid = secrets.token_hex(8)
        self._suggestions[sid] = Suggestion(request_id, language, chars)
        self._by_request[request_id] = sid
        while len(self._suggestions) > self.max_suggestions:
            _, old = self._suggestions.popitem(last=False)
            self._by_request.pop(old.request_id, None)
        return sid

    def on_notification(self, params: Any) -> pb.Outcome | None:
        """An editor's ``quickdraft/completionOutcome``: checked and queued; the
        outcome queued, or None when it was ignored or dropped. Never raises."""
        sid = _field(params, "suggestionId")
        suggestion = self._suggestions.get(sid) if isinstance(sid, str) else None
        kind = _choice(params, "kind", KINDS, None)
        if suggestion is None or kind is None:
            self.ignored += 1
            log.debug("ignoring an outcome for no known suggestion, or of no known kind: %.200r", params)
            return None
        if not self.enabled:
            return None
        outcome = pb.Outcome(request_id=suggestion.request_id, kind=kind, suggestion_chars=suggestion.chars, language_id=suggestion.language)
        shown_ms = _number(_field(params, "shownMs"))
        if kind != pb.OUTCOME_KIND_SHOWN and shown_ms is not None:
            outcome.shown_ms = min(max(0.0, shown_ms), MAX_SHOWN_MS)
        if kind == pb.OUTCOME_KIND_ACCEPTED:
            chars = _number(_field(params, "acceptedChars"))
            # Missing: the whole suggestion. Editors count in their own units now
            # and then (a UTF-16 pair, a typed-through rest): kept within the suggestion.
            chars = suggestion.chars if chars is None else int(max(0.0, chars))
            outcome.accepted_chars = min(chars, suggestion.chars) if suggestion.chars else min(chars, 1 << 20)
            outcome.acceptance = _choice(params, "acceptance", ACCEPTANCES, pb.ACCEPTANCE_WHOLE)
        elif kind == pb.OUTCOME_KIND_REJECTED:
            outcome.rejection = _choice(params, "rejection", REJECTIONS, pb.REJECTION_UNSPECIFIED)
        if len(self._queue) >= self.max_queue:
            self.dropped += 1
            return None
        self._queue.append(outcome)
        self._wake.set()
        return outcome

    # -- sending ------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        """Stop; what is queued gets one last try."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        try:
            await asyncio.wait_for(self.flush(), 2.0)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        log.info("suggestion outcomes: %d sent, %d dropped, %d ignored", self.sent, self.dropped, self.ignored)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.flush_delay_s)  # gather a batch rather than one call per keystroke
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Send what is queued, in batches; what the server does not take is dropped."""
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
            code = grpc.StatusCode.UNAVAILABLE if self.send is None else await self._send(batch)
            if code is None:
                self.sent += len(batch)
                continue
            self.dropped += len(batch)
            if code == grpc.StatusCode.UNIMPLEMENTED:
                # A server from before outcome reports: stop queueing for it.
                log.info("the server takes no outcome reports; not sending them")
                self.enabled = False
                self.dropped += len(self._queue)
                self._queue.clear()

    async def _send(self, batch: list[pb.Outcome]) -> grpc.StatusCode | None:
        assert self.send is not None
        try:
            return await self.send(batch, self.prefix)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - figures must never take the bridge down
            log.exception("sending outcomes failed")
            return grpc.StatusCode.INTERNAL
