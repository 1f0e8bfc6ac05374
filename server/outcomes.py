"""Suggestion outcomes: what users did with the completions the server wrote.

Editors report, through the LSP bridge, each suggestion shown, accepted
(whole, or by word or line) or rejected; both front ends hand the reports to
``OutcomeBook.report``. The book relates each outcome to what the server
knows of its request (language, latency class, speculative config, output
tokens), remembered for recent finished requests, and exports the figures
(server/telemetry.py) labelled by those, never by the client's word alone.

Never-shown waste: a finished request whose suggestion was not reported shown
within ``grace_s`` is engine work nobody saw. Only requests of clients that
report are judged, and only those whose id starts with a ``request_id_prefix``
the same user declared in a report within ``reporting_window_s`` (the LSP
bridge declares one per session). A client that never reports, or another
editor of the same user that does not, is never judged: it cannot make
everything look wasted.

No outcome carries code; an exported attribute is an id, a count, a duration
or a label from a closed set.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

from quickdraft.server.admission import Client
from quickdraft.server.errors import RequestError, invalid
from quickdraft.server.request_validation import MAX_REQUEST_ID
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.outcomes")

MAX_BATCH = 256  # outcomes per call: a bridge flushes far fewer
MAX_SHOWN_MS = 24 * 3600 * 1000.0
MAX_CHARS = 1 << 20  # more than any completion the server writes
MAX_PREFIX = 64
MIN_PREFIX = 4  # shorter would opt in another editor's server-made (hex) ids by chance
MAX_LANGUAGE_ID = 64

# LSP language ids kept as metric labels; any other is "other", none "unknown":
# a client's free text must not grow the series.
LANGUAGES = frozenset({
    "c", "clojure", "cpp", "csharp", "css", "cuda-cpp", "dart", "dockerfile", "elixir", "erlang", "fsharp", "go", "groovy",
    "haskell", "html", "java", "javascript", "javascriptreact", "json", "jsonc", "julia", "kotlin", "latex", "lua", "makefile",
    "markdown", "objective-c", "ocaml", "perl", "php", "plaintext", "powershell", "python", "r", "ruby", "rust", "scala", "scss",
    "shellscript", "sql", "swift", "terraform", "toml", "typescript", "typescriptreact", "vue", "xml", "yaml", "zig",
})
OTHER = "other"
UNKNOWN = "unknown"

ACCEPTANCE_NAMES = {pb.ACCEPTANCE_UNSPECIFIED: "whole", pb.ACCEPTANCE_WHOLE: "whole", pb.ACCEPTANCE_WORD: "word", pb.ACCEPTANCE_LINE: "line"}
REJECTION_NAMES = {pb.REJECTION_UNSPECIFIED: "unspecified", pb.REJECTION_DISMISSED: "dismissed", pb.REJECTION_TYPED_OVER: "typed_over",
                   pb.REJECTION_REPLACED: "replaced"}
KIND_NAMES = {pb.OUTCOME_KIND_SHOWN: "shown", pb.OUTCOME_KIND_ACCEPTED: "accepted", pb.OUTCOME_KIND_REJECTED: "rejected"}
# Finishes whose output was complete, and so could have been shown. Cancelled
# requests are counted as wasted already (reason "cancelled"); errors wrote nothing usable.
FINISHED = ("stop", "length")


def language_label(language_id: str) -> str:
    lid = (language_id or "").strip().lower()
    if not lid:
        return UNKNOWN
    return lid if lid in LANGUAGES else OTHER


@dataclass
class Finished:
    """A finished request as the book remembers it."""

    request_id: str
    user: str
    language: str  # a label (language_label), or "" when the request named none
    latency_class: str
    config: str
    completion_tokens: int
    finish: str
    finished_at: float
    shown: bool = False
    ended: bool = False  # an ACCEPTED or REJECTED was counted


@dataclass
class Figures:
    """Running totals of one group (language, latency class, config)."""

    shown: int = 0
    accepted: int = 0
    partially_accepted: int = 0
    rejected: int = 0
    accepted_chars: int = 0
    ended: int = 0
    shown_ms: float = 0.0
    wasted_cancelled: int = 0
    wasted_never_shown: int = 0

    def add(self, other: "Figures") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def proto(self, group: tuple[str, str, str] = ("", "", "")) -> pb.OutcomeFigures:
        return pb.OutcomeFigures(
            language=group[0], latency_class=group[1], speculative_config=group[2],
            shown=self.shown, accepted=self.accepted, partially_accepted=self.partially_accepted, rejected=self.rejected,
            accepted_chars=self.accepted_chars,
            acceptance_rate=self.accepted / self.shown if self.shown else 0.0,
            accepted_chars_per_shown=self.accepted_chars / self.shown if self.shown else 0.0,
            mean_shown_ms=self.shown_ms / self.ended if self.ended else 0.0,
            wasted_tokens_cancelled=self.wasted_cancelled, wasted_tokens_never_shown=self.wasted_never_shown,
        )


@dataclass
class _Bucket:
    """A client's outcome allowance: refills at ``rate`` per second up to ``burst``."""

    tokens: float
    at: float


def check_report(req: pb.ReportOutcomesRequest) -> None:
    """Field checks; the first bad value refuses the whole batch, naming it (outcomes[3].shown_ms)."""
    if len(req.outcomes) > MAX_BATCH:
        raise invalid("outcomes", f"{len(req.outcomes)} outcomes; at most {MAX_BATCH} per call (send the rest in another)")
    prefix = req.request_id_prefix
    if prefix and not (MIN_PREFIX <= len(prefix) <= MAX_PREFIX and prefix.isprintable()):
        raise invalid("request_id_prefix", f"{len(prefix)} characters; use {MIN_PREFIX}-{MAX_PREFIX} printable characters unique to the session, or none")
    for i, o in enumerate(req.outcomes):
        def bad(name: str, detail: str) -> RequestError:
            return invalid("outcomes", detail, at=f"[{i}].{name}")

        if not o.request_id:
            raise bad("request_id", "empty; name the Complete request the suggestion came from")
        if len(o.request_id) > MAX_REQUEST_ID or not o.request_id.isprintable():
            raise bad("request_id", f"at most {MAX_REQUEST_ID} printable characters")
        if o.kind not in KIND_NAMES:
            raise bad("kind", f"{o.kind} is not an outcome; use SHOWN, ACCEPTED or REJECTED")
        if not math.isfinite(o.shown_ms) or not 0.0 <= o.shown_ms <= MAX_SHOWN_MS:
            raise bad("shown_ms", f"{o.shown_ms} is not a time on screen; use 0 to {MAX_SHOWN_MS:.0f} milliseconds")
        if o.suggestion_chars > MAX_CHARS or o.accepted_chars > MAX_CHARS:
            raise bad("accepted_chars" if o.accepted_chars > MAX_CHARS else "suggestion_chars", f"over {MAX_CHARS} characters")
        if o.suggestion_chars and o.accepted_chars > o.suggestion_chars:
            raise bad("accepted_chars", f"{o.accepted_chars} is more than the suggestion's {o.suggestion_chars} characters")
        if o.kind != pb.OUTCOME_KIND_ACCEPTED and o.accepted_chars:
            raise bad("accepted_chars", f"{o.accepted_chars} characters on a {KIND_NAMES[o.kind]} outcome; only ACCEPTED takes characters")
        if o.acceptance not in ACCEPTANCE_NAMES or (o.acceptance != pb.ACCEPTANCE_UNSPECIFIED and o.kind != pb.OUTCOME_KIND_ACCEPTED):
            raise bad("acceptance", "only an ACCEPTED outcome has one: WHOLE, WORD or LINE")
        if o.rejection not in REJECTION_NAMES or (o.rejection != pb.REJECTION_UNSPECIFIED and o.kind != pb.OUTCOME_KIND_REJECTED):
            raise bad("rejection", "only a REJECTED outcome has one: DISMISSED, TYPED_OVER or REPLACED")
        if len(o.language_id) > MAX_LANGUAGE_ID:
            raise bad("language_id", f"{len(o.language_id)} characters; at most {MAX_LANGUAGE_ID}")


class OutcomeBook:
    """Recent finished requests, the outcomes reported for them, and their figures.

    ``remember`` is a ``CompletionService.observers`` callback. Single event
    loop: no locks. Never-shown judgements happen lazily, on the next
    request, report or stats call after a request's grace period ends.
    """

    def __init__(self, telemetry: Telemetry, *, clock: Callable[[], float] = time.monotonic, grace_s: float = 30.0,
                 reporting_window_s: float = 600.0, remembered: int = 8192, rate_per_s: float = 50.0, burst: int = 2000,
                 max_clients: int = 4096, max_groups: int = 2048):
        self.telemetry = telemetry
        self.clock = clock
        self.grace_s = grace_s
        self.reporting_window_s = reporting_window_s
        self.remembered = remembered
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_clients = max_clients
        self.max_groups = max_groups
        self.since = time.time()
        self._requests: OrderedDict[str, Finished] = OrderedDict()
        self._awaiting: deque[Finished] = deque()  # finished in order, so deadlines are in order
        self._prefixes: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()  # user -> prefix -> last report
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._groups: dict[tuple[str, str, str], Figures] = {}
        self._overflow = Figures()  # groups past max_groups: in the total only
        self.unknown = 0
        self.duplicates = 0

    # -- requests ------------------------------------------------------------

    def remember(self, record: RequestRecord, spec: pb.SpeculativeStats | None = None) -> None:
        """A request finished (any way): keep what outcomes will be related to."""
        now = self.clock()
        self.sweep(now)
        if not record.request_id:
            return
        entry = Finished(record.request_id, record.user, language_label(record.language) if record.language else "",
                         record.latency_class, record.spec_label, record.completion_tokens, record.finish, now)
        if record.finish == "cancelled" and record.completion_tokens:
            self._group(entry).wasted_cancelled += record.completion_tokens
        self._requests[entry.request_id] = entry
        self._requests.move_to_end(entry.request_id)
        while len(self._requests) > self.remembered:
            self._requests.popitem(last=False)
        if entry.finish in FINISHED and entry.completion_tokens:
            self._awaiting.append(entry)
            while len(self._awaiting) > self.remembered:
                self._awaiting.popleft()  # unjudged: a flood of requests must not grow memory

    def sweep(self, now: float | None = None) -> None:
        """Judge the requests whose grace period has ended."""
        now = self.clock() if now is None else now
        while self._awaiting and self._awaiting[0].finished_at + self.grace_s <= now:
            entry = self._awaiting.popleft()
            if entry.shown or not self._reporting(entry, now):
                continue
            self._group(entry).wasted_never_shown += entry.completion_tokens
            self.telemetry.never_shown(entry.completion_tokens, entry.latency_class, entry.config)

    def _reporting(self, entry: Finished, now: float) -> bool:
        """Whether the request's client declared its id prefix recently: it would have reported the suggestion shown."""
        prefixes = self._prefixes.get(entry.user)
        if not prefixes:
            return False
        return any(entry.request_id.startswith(p) and now - seen <= self.reporting_window_s for p, seen in prefixes.items())

    # -- reports --------------------------------------------------------------

    def report(self, req: pb.ReportOutcomesRequest, client: Client, trace_context=None) -> pb.ReportOutcomesResponse:
        """Count one batch from ``client``. Raises RequestError (INVALID_ARGUMENT
        naming the field, RESOURCE_EXHAUSTED over the client's rate)."""
        check_report(req)
        now = self.clock()
        self._spend(client, len(req.outcomes), now)
        if req.request_id_prefix:
            self._declare(client.user, req.request_id_prefix, now)
        out = pb.ReportOutcomesResponse()
        span = self.telemetry.tracer.start_span("quickdraft.report_outcomes", context=trace_context,
                                                attributes={"enduser.id": client.user, "quickdraft.outcomes": len(req.outcomes)})
        try:
            for o in req.outcomes:
                self._one(o, client, out, span)
            span.set_attribute("quickdraft.outcomes.recorded", out.recorded)
            span.set_attribute("quickdraft.outcomes.unknown_request_ids", out.unknown_request_ids)
        finally:
            span.end()
        self.sweep(now)
        return out

    def _one(self, o: pb.Outcome, client: Client, out: pb.ReportOutcomesResponse, span) -> None:
        entry = self._requests.get(o.request_id)
        if entry is None or entry.user != client.user:
            # Restarted, forgotten, made up, or another user's request: nothing to relate it to.
            out.unknown_request_ids += 1
            self.unknown += 1
            self.telemetry.outcome_unmatched("unknown_request")
            return
        if not entry.language:
            entry.language = language_label(o.language_id)  # the request named none (HTTP): the editor's word
        group = self._group(entry)
        labels = self._labels(entry)
        if o.kind == pb.OUTCOME_KIND_SHOWN:
            if entry.shown:
                return self._duplicate(out)
            self._show(entry, group, labels)
        elif entry.ended:
            return self._duplicate(out)
        else:
            if not entry.shown:
                self._show(entry, group, labels)  # its SHOWN was lost: an accepted or rejected suggestion was on screen
            entry.ended = True
            group.ended += 1
            group.shown_ms += o.shown_ms
            if o.kind == pb.OUTCOME_KIND_ACCEPTED:
                how = ACCEPTANCE_NAMES[o.acceptance]
                group.accepted += 1
                group.partially_accepted += how != "whole"
                group.accepted_chars += o.accepted_chars
                self.telemetry.suggestion_accepted(labels, how, o.accepted_chars, o.shown_ms / 1000)
            else:
                group.rejected += 1
                self.telemetry.suggestion_rejected(labels, REJECTION_NAMES[o.rejection], o.shown_ms / 1000)
        out.recorded += 1
        event = {"quickdraft.request_id": o.request_id, **labels, "quickdraft.shown_ms": o.shown_ms,
                 "quickdraft.accepted_chars": o.accepted_chars, "quickdraft.suggestion_chars": o.suggestion_chars}
        if o.kind == pb.OUTCOME_KIND_ACCEPTED:
            event["quickdraft.acceptance"] = ACCEPTANCE_NAMES[o.acceptance]
        elif o.kind == pb.OUTCOME_KIND_REJECTED:
            event["quickdraft.rejection"] = REJECTION_NAMES[o.rejection]
        span.add_event(f"quickdraft.suggestion.{KIND_NAMES[o.kind]}", attributes=event)

    def _show(self, entry: Finished, group: Figures, labels: dict[str, str]) -> None:
        entry.shown = True
        group.shown += 1
        self.telemetry.suggestion_shown(labels)

    def _duplicate(self, out: pb.ReportOutcomesResponse) -> None:
        out.duplicates += 1
        self.duplicates += 1
        self.telemetry.outcome_unmatched("duplicate")

    def _spend(self, client: Client, n: int, now: float) -> None:
        """The per-client bound: a client cannot flood the book (or the metrics) with reports."""
        bucket = self._buckets.get(client.key)
        if bucket is None:
            bucket = self._buckets[client.key] = _Bucket(float(self.burst), now)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(client.key)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate_per_s)
        bucket.at = now
        if n > bucket.tokens:
            raise RequestError("RESOURCE_EXHAUSTED", f"this client reported more than {self.rate_per_s:g} outcomes a second "
                                                     f"(burst {self.burst}); these {n} were not counted, send fewer")
        bucket.tokens -= n

    def _declare(self, user: str, prefix: str, now: float) -> None:
        prefixes = self._prefixes.setdefault(user, OrderedDict())
        self._prefixes.move_to_end(user)
        prefixes[prefix] = now
        prefixes.move_to_end(prefix)
        while len(prefixes) > 16:  # sessions of one user; the oldest stop being judged
            prefixes.popitem(last=False)
        while len(self._prefixes) > self.max_clients:
            self._prefixes.popitem(last=False)

    # -- figures ----------------------------------------------------------------

    def _key(self, entry: Finished) -> tuple[str, str, str]:
        return (entry.language or UNKNOWN, entry.latency_class, entry.config)

    def _labels(self, entry: Finished) -> dict[str, str]:
        language, latency_class, config = self._key(entry)
        return {"quickdraft.language": language, "quickdraft.latency_class": latency_class, "quickdraft.speculative.config": config}

    def _group(self, entry: Finished) -> Figures:
        key = self._key(entry)
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) >= self.max_groups:
                return self._overflow
            group = self._groups[key] = Figures()
        return group

    def stats(self) -> pb.OutcomeStats:
        now = self.clock()
        self.sweep(now)
        total = Figures()
        total.add(self._overflow)
        for g in self._groups.values():
            total.add(g)
        reporting = sum(now - seen <= self.reporting_window_s for prefixes in self._prefixes.values() for seen in prefixes.values())
        return pb.OutcomeStats(
            total=total.proto(),
            groups=[g.proto(key) for key, g in sorted(self._groups.items())],
            unknown_request_ids=self.unknown,
            duplicates=self.duplicates,
            reporting_sessions=reporting,
            never_shown_grace_s=self.grace_s,
            since_unix_time=self.since,
        )
