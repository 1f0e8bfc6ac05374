"""Typing sessions through the LSP bridge: what stable prompts and prefetching do (issue 25).

    quickdraft bench typing [--rounds 2] [--chars 120] [--variants base,stable,prefetch]
                            [--server HOST:PORT] [--set SECTION.KEY=VALUE] [--out bench/results/typing]
                            [--oracle P [--oracle-engine]] [--offline]

An LSP client drives ``python -m quickdraft.lsp_bridge`` over stdio as an
editor would (``didChange`` per keystroke, an automatic
``textDocument/inlineCompletion`` after each, ``$/cancelRequest`` for the
previous one, suggestion outcomes reported), against ``quickdraft serve``
(the embedded model; started here unless ``--server`` names one).

**Edit sequences.** The held-out packages (``bench/workload.py``'s
``HELDOUT_DISTRIBUTIONS``) are installed without their git history, so the
sessions are reconstructed from their source, not replayed from real
commits: a session opens one file with the body of one function removed
(what follows its docstring) and types it again, top to bottom, at human
speed: about 6 keys a second (log-normal gaps), Enter with the next line's
indentation (as an editor indents), a pause after each line and now and then
a longer one, a typo now and then noticed and deleted, and now and then a
line deleted and typed again. The typist accepts a suggestion (as Tab
would: the whole of it at once, after a reaction time) when it is exactly
what comes next in the file and holds at least 2 non-blank characters;
otherwise it types on, over it.

**Variants** (bridge settings), replayed on the same sessions in every round,
in turn (the order reversed every other round, so drift on a shared machine
hits all alike):

- ``base``: ``stablePrompt`` off, ``prefetchAfterAccept`` off (prompts as before issue 25);
- ``stable``: ``stablePrompt`` on;
- ``prefetch``: ``stablePrompt`` and ``prefetchAfterAccept`` on.

Each (round, variant) runs in its own bridge and its own copy of the
package, whose folder name (the prompt's repository name, its first line) is
the block's own: no block can meet another's prompts in the server's prefix
cache.

**Figures per variant**: time from a keystroke to a new suggestion on screen
(its request's answer; the bridge answers whole suggestions, so this is the
time to the first shown character), over all such requests and over those
right after an acceptance; new suggestions shown per minute of typing; the
share of them the typist accepted; engine output tokens wasted (cancelled,
and finished but never shown: the server's ``GetOutcomeStats``, read after
``telemetry.never_shown_grace_s``) per new suggestion shown; the prefix-cache
hit rate (``GetServerInfo``'s ``prefix_cache_hit_tokens`` over
``prefix_cache_queried_tokens``); the time from Enter right after an
acceptance to the answer on the new line (what the next-line prefetch is
for); and the bridge's own counters (``quickdraft/bridgeStats``). Ratios
against ``base`` per round and pooled, and prefetch on against off
(``prefetch`` / ``stable``). Written as JSON and Markdown to ``--out``.

``--oracle P`` replaces the server with a stand-in model that answers what
the typist will type, right for a share P of requests (bench/typing_oracle.py):
the embedded model's suggestions almost never match the code, so without it
no suggestion is accepted and prefetching never runs. With ``--oracle-engine``
the stand-in's text streams at the pace of the real server (started here, or
``--server``), which does the work and keeps the figures: what prefetching
costs and saves on the engine, with acceptances as often as ``P`` says. ``--offline`` starts
nothing: every keystroke's prompt is built in process and looked up in a model
of vLLM's prefix cache (``--block-size``: 16 as on a GPU, 128 as on a CPU),
base against stable, deterministically.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import itertools
import json
import math
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quickdraft.bench.lsp_common import start_bridge

VARIANTS: dict[str, dict[str, Any]] = {
    "base": {"stablePrompt": False, "prefetchAfterAccept": False},
    "stable": {"stablePrompt": True, "prefetchAfterAccept": False},
    "prefetch": {"stablePrompt": True, "prefetchAfterAccept": True},
}
BASE = "base"
GRACE_S = 3.0  # telemetry.never_shown_grace_s of the server started here
TABS = 2  # modules the typed file imports, open beside it
MAX_FILE_BYTES = 200_000


# --- edit sequences ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One function body to type again: ``text[start:end]`` of the file at ``path``."""

    package_dir: str  # the top-level package folder on disk (copied per block)
    rel: str  # the file inside it, e.g. "click/core.py"
    start: int  # character offsets in the file's text
    end: int

    def texts(self) -> tuple[str, str]:
        """(the file without the span, the span)."""
        text = (Path(self.package_dir).parent / self.rel).read_text(encoding="utf-8")
        return text[: self.start] + text[self.end :], text[self.start : self.end]

    def tabs(self, limit: int = TABS) -> list[str]:
        """Modules of the same folder this file imports (``from .name import``),
        open beside it as an editor's tabs would be: up to ``limit``, as paths like ``rel``."""
        text = (Path(self.package_dir).parent / self.rel).read_text(encoding="utf-8")
        folder = Path(self.rel).parent
        out = []
        for name in re.findall(r"^from \.(\w+) import", text, re.M):
            rel = (folder / f"{name}.py").as_posix()
            if rel not in out and (Path(self.package_dir).parent / rel).is_file():
                out.append(rel)
        return out[:limit]


def function_spans(text: str, min_chars: int, max_chars: int) -> list[tuple[int, int]]:
    """Spans of function bodies worth typing: from the first statement after the
    docstring (on a line of its own) to the end of the function's last line;
    at least two lines, ``min_chars``..``max_chars`` characters, no tabs."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    starts = list(itertools.accumulate((len(line) for line in lines), initial=0))

    def offset(lineno: int, col_bytes: int) -> int:
        line = lines[lineno - 1]
        return starts[lineno - 1] + len(line.encode("utf-8")[:col_bytes].decode("utf-8", "ignore"))

    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = list(node.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]
        if not body or node.end_lineno is None:
            continue
        first = body[0]
        start = offset(first.lineno, first.col_offset)
        if text[starts[first.lineno - 1] : start].strip():
            continue  # "def f(): return x": no line of its own
        end = starts[node.end_lineno - 1] + len(lines[node.end_lineno - 1].rstrip("\r\n"))
        span = text[start:end]
        if min_chars <= len(span) <= max_chars and "\n" in span and "\t" not in span and "\r" not in span:
            spans.append((start, end))
    return sorted(spans)


def pick_targets(rounds: int, chars: int, seed: int, min_chars: int = 60, max_chars: int = 260) -> list[list[Target]]:
    """Per round, functions of the held-out packages (distinct across rounds)
    until ``chars`` characters are to be typed."""
    from quickdraft.bench.workload import heldout_package_files

    files = [(path, rel) for path, rel in heldout_package_files().items()
             if path.suffix == ".py" and path.stat().st_size <= MAX_FILE_BYTES and "/" in rel]
    if not files:
        raise ValueError("no held-out package is installed here (bench/workload.py HELDOUT_DISTRIBUTIONS)")
    rng = random.Random(seed)
    rng.shuffle(files)
    candidates: list[Target] = []
    for path, rel in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        package_dir = str(path)[: len(str(path)) - len(rel)] + rel.split("/", 1)[0]
        spans = function_spans(text, min_chars, max_chars)
        if spans:
            start, end = rng.choice(spans)  # one per file: sessions spread over files and packages
            candidates.append(Target(package_dir, rel, start, end))
        if sum(t.end - t.start for t in candidates) > 3 * rounds * chars + 20 * max_chars:
            break
    out: list[list[Target]] = []
    for _ in range(rounds):
        chosen: list[Target] = []
        while candidates and sum(t.end - t.start for t in chosen) < chars:
            chosen.append(candidates.pop())
        if not chosen:
            raise ValueError(f"not enough functions of {min_chars}-{max_chars} characters for {rounds} rounds of {chars}")
        out.append(chosen)
    return out


@dataclass(frozen=True)
class Typist:
    """How fast the replayed user types, and how often it errs (seconds, probabilities)."""

    keys_per_s: float = 6.0
    key_sigma: float = 0.35
    line_pause_s: float = 0.45
    think_share: float = 0.08
    think_s: float = 1.5
    typo_share: float = 0.02
    notice_s: float = 0.35
    redo_share: float = 0.04
    reaction_s: float = 0.3
    min_accept_chars: int = 2

    def key_gap(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(1 / self.keys_per_s), self.key_sigma)

    def line_gap(self, rng: random.Random) -> float:
        gap = rng.lognormvariate(math.log(self.line_pause_s), 0.4)
        if rng.random() < self.think_share:
            gap += rng.lognormvariate(math.log(self.think_s), 0.5)
        return gap


def next_chunk(span: str, i: int) -> str:
    """What one keystroke types at ``span[i]``: a character, or Enter with the
    indentation of the next line (as an editor indents)."""
    if span[i] != "\n":
        return span[i]
    j = i + 1
    while j < len(span) and span[j] == " ":
        j += 1
    return span[i:j]


# --- the editor ----------------------------------------------------------------------


def _units(text: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(text.encode("utf-8", "surrogatepass"))
    if encoding == "utf-32":
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


@dataclass
class Shown:
    sid: str
    text: str
    request: dict
    shown_at: float
    decided: bool = False


class Bridge:
    """One bridge process and the LSP client that drives it."""

    def __init__(self, client, encoding: str):
        self.client = client
        self.encoding = encoding
        self.ids = itertools.count(1)

    @classmethod
    async def start(cls, address: str, root: str, settings: dict) -> "Bridge":
        from quickdraft.lsp_bridge.outcomes import CAPABILITY

        client, up, result = await start_bridge(address, root, "quickdraft-bench-typing", settings=settings,
                                                experimental={CAPABILITY: True}, utf16=True)
        await asyncio.wait_for(up.wait(), 60)
        encoding = result.capabilities.position_encoding or "utf-16"
        return cls(client, str(encoding))

    def open(self, uri: str, text: str) -> None:
        from lsprotocol import types

        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

    def close(self, uri: str) -> None:
        from lsprotocol import types

        self.client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))

    async def stats(self) -> dict[str, int]:
        got = await self.client.protocol.send_request_async("quickdraft/bridgeStats", {})
        return dict(got) if isinstance(got, dict) else {k: getattr(got, k) for k in getattr(got, "_fields", ())}

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 10)
            self.client.exit(None)
        finally:
            await self.client.stop()


class Session:
    """One target typed through one bridge; appends to ``requests`` and ``suggestions``."""

    def __init__(self, bridge: Bridge, uri: str, before: str, span: str, start: int, typist: Typist, rng: random.Random,
                 tags: dict, requests: list[dict], suggestions: list[dict]):
        self.bridge = bridge
        self.uri = uri
        self.text = before
        self.before = before
        self.span = span
        self.start = start  # where the span goes in the document
        self.typist = typist
        self.rng = rng
        self.tags = tags
        self.requests = requests
        self.suggestions = suggestions
        self.version = 1
        self.cursor = start
        self.i = 0  # characters of the span in the document
        self.typo = False  # a wrong character sits before the cursor
        self.pending: tuple[str, asyncio.Future, dict] | None = None
        self.displayed: Shown | None = None
        self.changed = asyncio.Event()
        self.redone: set[int] = set()
        self.just_accepted = False  # the last edit was an acceptance: Enter next is "accept_enter"

    # -- LSP ---------------------------------------------------------------

    def position(self, index: int):
        from lsprotocol import types

        line = self.text.count("\n", 0, index)
        line_start = self.text.rfind("\n", 0, index) + 1
        return types.Position(line=line, character=_units(self.text[line_start:index], self.bridge.encoding))

    def edit(self, start: int, end: int, new: str, trigger: str) -> None:
        from lsprotocol import types

        rng = types.Range(start=self.position(start), end=self.position(end))
        self.text = self.text[:start] + new + self.text[end:]
        self.version += 1
        self.cursor = start + len(new)
        self.bridge.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version),
            content_changes=[types.TextDocumentContentChangePartial(range=rng, text=new)],
        ))
        self.ask(trigger)

    def ask(self, trigger: str) -> None:
        """The editor's automatic inline completion request, the previous one cancelled."""
        from lsprotocol import types

        if self.pending is not None:
            msg_id, future, record = self.pending
            if not future.done():
                record["superseded"] = True
                self.bridge.client.protocol.notify("$/cancelRequest", types.CancelParams(id=msg_id))
        msg_id = f"t{next(self.bridge.ids)}"
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri),
            position=self.position(self.cursor),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        record = {**self.tags, "trigger": trigger, "sent": time.monotonic(), "outcome": "pending", "superseded": False}
        self.requests.append(record)
        future = self.bridge.client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)
        self.pending = (msg_id, future, record)
        future.add_done_callback(lambda f, record=record, cursor=self.cursor, version=self.version: self.answered(f, record, cursor, version))

    def answered(self, future: asyncio.Future, record: dict, cursor: int, version: int) -> None:
        now = time.monotonic()
        record["latency_ms"] = (now - record["sent"]) * 1e3
        try:
            result = future.result()
        except BaseException:  # noqa: BLE001 - cancelled requests answer with an error
            record["outcome"] = "cancelled"
            return
        items = list(getattr(result, "items", None) or [])
        if record["superseded"] or version != self.version or cursor != self.cursor:
            record["outcome"] = "superseded"
            return
        if not items:
            record["outcome"] = "empty"
            if self.displayed is not None:
                self.end_displayed("rejected", rejection="typedOver")
            return
        item = items[0]
        text = item.insert_text if isinstance(item.insert_text, str) else item.insert_text.value
        args = item.command.arguments if item.command is not None and item.command.arguments else [{}]
        sid = (args[0] or {}).get("suggestionId", "") if isinstance(args[0], dict) else getattr(args[0], "suggestionId", "")
        empty_range = item.range is None or item.range.start == item.range.end
        record["chars"] = len(text)
        if self.displayed is not None and self.displayed.sid == sid and sid:
            record["outcome"] = "same"
            self.displayed.text = text if empty_range else ""
        else:
            if self.displayed is not None:
                self.end_displayed("rejected", rejection="replaced")
            record["outcome"] = "new"
            ahead = self.span[self.i :] if not self.typo else ""
            matched = next((k for k, (a, b) in enumerate(zip(text, ahead)) if a != b), min(len(text), len(ahead)))
            suggestion = {**self.tags, "sid": sid, "chars": len(text), "matched_chars": matched, "trigger": record["trigger"],
                          "latency_ms": record["latency_ms"], "accepted": False}
            self.suggestions.append(suggestion)
            self.displayed = Shown(sid, text if empty_range else "", suggestion, now)
            self.outcome(sid, "shown")
        self.changed.set()

    def outcome(self, sid: str, kind: str, **fields) -> None:
        if sid:
            self.bridge.client.protocol.notify("quickdraft/completionOutcome", {"suggestionId": sid, "kind": kind, **fields})

    def end_displayed(self, kind: str, **fields) -> None:
        shown = self.displayed
        self.displayed = None
        if shown is not None:
            self.outcome(shown.sid, kind, shownMs=(time.monotonic() - shown.shown_at) * 1e3, **fields)

    # -- the typist --------------------------------------------------------

    def acceptable(self, shown: Shown) -> bool:
        text = shown.text
        return (not self.typo and bool(text) and len(text.strip()) >= self.typist.min_accept_chars
                and self.span.startswith(text, self.i))

    async def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` before the next keystroke; True when a suggestion was accepted meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            shown = self.displayed
            if shown is not None and not shown.decided:
                shown.decided = True
                if self.acceptable(shown):
                    await asyncio.sleep(self.typist.reaction_s)
                    if self.displayed is shown and self.acceptable(shown):
                        self.accept(shown)
                        return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except asyncio.TimeoutError:
                return False

    def accept(self, shown: Shown) -> None:
        shown.request["accepted"] = True
        self.displayed = None
        self.outcome(shown.sid, "accepted", shownMs=(time.monotonic() - shown.shown_at) * 1e3, acceptance="whole")
        self.i += len(shown.text)
        self.edit(self.cursor, self.cursor, shown.text, "accept")
        self.just_accepted = True

    def type_text(self, chunk: str, trigger: str) -> None:
        self.just_accepted = False
        shown = self.displayed
        if shown is not None:
            if shown.text.startswith(chunk) and len(chunk) < len(shown.text):
                shown.text = shown.text[len(chunk):]  # typed through: the bridge keeps showing its rest
                shown.decided = True
            else:
                self.end_displayed("rejected", rejection="typedOver")
        self.edit(self.cursor, self.cursor, chunk, trigger)

    def delete_back(self, n: int, trigger: str) -> None:
        self.just_accepted = False
        if self.displayed is not None:
            self.end_displayed("rejected", rejection="typedOver")
        self.edit(self.cursor - n, self.cursor, "", trigger)

    async def run(self) -> float:
        """Type the span; returns the seconds it took."""
        from lsprotocol import types

        client, rng, typist = self.bridge.client, self.rng, self.typist
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=self.uri, language_id="python", version=self.version, text=self.text)))
        t0 = time.monotonic()
        self.ask("open")
        gap = typist.line_gap(rng)
        while self.i < len(self.span):
            if await self.wait(gap):
                gap = typist.key_gap(rng)
                continue
            chunk = next_chunk(self.span, self.i)
            line_start = self.span.rfind("\n", 0, self.i) + 1
            if chunk.startswith("\n") and line_start not in self.redone and rng.random() < typist.redo_share:
                # Delete the line just typed (its code, not its indentation) and type it again.
                self.redone.add(line_start)
                code = line_start + len(self.span[line_start:self.i]) - len(self.span[line_start:self.i].lstrip(" "))
                if self.i > code:
                    if await self.wait(typist.line_gap(rng)):
                        gap = typist.key_gap(rng)
                        continue
                    self.delete_back(self.i - code, "redo")
                    self.i = code
                    gap = typist.line_gap(rng)
                    continue
            if chunk.isalnum() and rng.random() < typist.typo_share:
                wrong = rng.choice([c for c in "etaoinshrdlu" if c != chunk])
                self.typo = True
                self.type_text(wrong, "typo")
                await asyncio.sleep(typist.notice_s * rng.uniform(0.6, 1.6))
                self.delete_back(1, "backspace")
                self.typo = False
                gap = typist.key_gap(rng)
                continue
            # Enter right after an acceptance: the request the next-line prefetch is for.
            self.type_text(chunk, "accept_enter" if self.just_accepted and chunk.startswith("\n") else "type")
            self.i += len(chunk)
            gap = typist.line_gap(rng) if chunk.startswith("\n") else typist.key_gap(rng)
        elapsed = time.monotonic() - t0
        if self.pending is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.pending[1]), 5)
            except BaseException:  # noqa: BLE001
                pass
        if self.displayed is not None:
            self.end_displayed("rejected", rejection="dismissed")
        if self.text != self.before[: self.start] + self.span + self.before[self.start :]:
            raise RuntimeError(f"the replay did not type {self.uri} as it is (a bug in the replay)")
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=self.uri)))
        return elapsed


# --- blocks and the run ------------------------------------------------------------


async def _server_counters(address: str) -> dict[str, int]:
    """The server's prefix-cache and outcome counters (0 for what a server does not answer)."""
    import grpc

    from quickdraft.client import AsyncCompletionClient, RetryPolicy
    from quickdraft.v1 import completion_pb2 as pb

    client = AsyncCompletionClient(address, retry=RetryPolicy(max_attempts=1))
    try:
        info = await client.server_info()
        try:
            stats = await client.outcome_stats()
        except grpc.aio.AioRpcError:
            stats = pb.OutcomeStats()
    finally:
        await client.close()
    return {"prefix_cache_queried_tokens": info.prefix_cache_queried_tokens, "prefix_cache_hit_tokens": info.prefix_cache_hit_tokens,
            "wasted_tokens_cancelled": stats.total.wasted_tokens_cancelled, "wasted_tokens_never_shown": stats.total.wasted_tokens_never_shown,
            "server_shown": stats.total.shown, "server_accepted": stats.total.accepted}


async def run_block(address: str, variant: str, round_no: int, targets: list[Target], typist: Typist, seed: int, workdir: Path,
                    grace_s: float, requests: list[dict], suggestions: list[dict], oracle=None) -> dict:
    """One variant's replay of one round's targets, in its own bridge and package copy
    (``oracle``: the stand-in model of bench/typing_oracle.py, told who types what)."""
    folder = workdir / f"{Path(targets[0].package_dir).name}-{round_no}{variant[:2]}"
    for target in targets:
        dest = folder / Path(target.package_dir).name
        if not dest.exists():
            shutil.copytree(target.package_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    before = await _server_counters(address)
    bridge = await Bridge.start(address, str(folder), dict(VARIANTS[variant]))
    tags = {"variant": variant, "round": round_no}
    typing_s = 0.0
    try:
        for n, target in enumerate(targets):
            text, span = target.texts()
            uri = (folder / target.rel).as_uri()
            tabs = [(folder / rel) for rel in target.tabs()]
            for tab in tabs:
                bridge.open(tab.as_uri(), tab.read_text(encoding="utf-8"))
            rng = random.Random(f"{seed}-{round_no}-{n}")  # the same typist for every variant
            session = Session(bridge, uri, text, span, target.start, typist, rng, {**tags, "session": n}, requests, suggestions)
            if oracle is not None:
                oracle.sessions[target.rel] = session
            typing_s += await session.run()
            for tab in tabs:
                bridge.close(tab.as_uri())
        bridge_stats = await bridge.stats()
    finally:
        await bridge.stop()  # flushes the outcome reports
    await asyncio.sleep(grace_s + 1.0)  # the server judges never-shown answers after its grace
    after = await _server_counters(address)
    return {"variant": variant, "round": round_no, "typing_s": typing_s, "bridge": bridge_stats,
            "server": {k: after[k] - before[k] for k in after}, "sessions": len(targets),
            "typed_chars": sum(t.end - t.start for t in targets)}


def schedule(variants: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, variant) in run order: every variant each round, the order reversed every other round."""
    out = []
    for r in range(rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        out += [(r + 1, v) for v in order]
    return out


# --- analysis (pure functions of the records) ----------------------------------------


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else float("nan")


def summarize(requests: list[dict], suggestions: list[dict], blocks: list[dict]) -> dict:
    """Figures of one group of blocks (one variant, or one variant's round)."""
    minutes = sum(b["typing_s"] for b in blocks) / 60
    server = {k: sum(b["server"].get(k, 0) for b in blocks) for k in
              ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "wasted_tokens_cancelled", "wasted_tokens_never_shown")}
    bridge: dict[str, int] = {}
    for b in blocks:
        for k, v in b.get("bridge", {}).items():
            bridge[k] = bridge.get(k, 0) + v
    latency = [s["latency_ms"] for s in suggestions]
    # The editor's request right after an acceptance, answered for the cursor
    # it was asked for (shown or empty): what prefetching is for.
    after_accept = [r["latency_ms"] for r in requests if r["trigger"] == "accept" and r["outcome"] in ("new", "same", "empty")]
    shown_after_accept = sum(1 for s in suggestions if s["trigger"] == "accept")
    # Enter right after an acceptance: the next line, what the next-line prefetch asks before Enter.
    next_line = [r for r in requests if r["trigger"] == "accept_enter" and r["outcome"] in ("new", "same", "empty")]
    shown = len(suggestions)
    accepted = sum(1 for s in suggestions if s["accepted"])
    wasted = server["wasted_tokens_cancelled"] + server["wasted_tokens_never_shown"]
    computed = server["prefix_cache_queried_tokens"] - server["prefix_cache_hit_tokens"]
    keystrokes = [r for r in requests if r["trigger"] != "open"]
    return {
        "requests": len(keystrokes),
        "superseded_share": _ratio(sum(1 for r in keystrokes if r["superseded"] or r["outcome"] in ("superseded", "cancelled")), len(keystrokes)),
        "shown": shown,
        "shown_per_min": _ratio(shown, minutes),
        "accepted": accepted,
        "accept_share": _ratio(accepted, shown),
        "shown_p50_ms": _pct(latency, 0.5),
        "shown_p90_ms": _pct(latency, 0.9),
        "shown_mean_ms": statistics.fmean(latency) if latency else float("nan"),
        "after_accept_n": len(after_accept),
        "after_accept_p50_ms": _pct(after_accept, 0.5),
        "after_accept_p90_ms": _pct(after_accept, 0.9),
        "after_accept_shown": shown_after_accept,
        "next_line_n": len(next_line),
        "next_line_p50_ms": _pct([r["latency_ms"] for r in next_line], 0.5),
        "next_line_shown": sum(1 for r in next_line if r["outcome"] in ("new", "same")),
        "wasted_tokens": wasted,
        "wasted_per_shown": _ratio(wasted, shown),
        "prefix_cache_hit_rate": _ratio(server["prefix_cache_hit_tokens"], server["prefix_cache_queried_tokens"]),
        "prompt_tokens_queried": server["prefix_cache_queried_tokens"],
        "prompt_tokens_computed": computed,
        "computed_per_model_request": _ratio(computed, bridge.get("model_requests", 0)),
        "matched_chars_mean": statistics.fmean(s.get("matched_chars", 0) for s in suggestions) if suggestions else float("nan"),
        "typing_minutes": minutes,
        "bridge": bridge,
    }


RATIO_KEYS = ("shown_p50_ms", "shown_p90_ms", "after_accept_p50_ms", "next_line_p50_ms", "shown_per_min", "accept_share",
              "wasted_per_shown", "prefix_cache_hit_rate", "computed_per_model_request")
# Prefetch on against off, the prompts alike: the variants compared besides base.
PREFETCH_PAIR = ("prefetch", "stable")


def analyze(requests: list[dict], suggestions: list[dict], blocks: list[dict], base: str = BASE) -> dict:
    """Per variant: pooled figures, their ratios to ``base``, and the same ratio per round."""
    variants = list(dict.fromkeys(b["variant"] for b in blocks))
    rounds = sorted({b["round"] for b in blocks})

    def pick(rows: list[dict], variant: str, round_no: int | None = None) -> list[dict]:
        return [r for r in rows if r["variant"] == variant and (round_no is None or r["round"] == round_no)]

    pooled = {v: summarize(pick(requests, v), pick(suggestions, v), pick(blocks, v)) for v in variants}
    per_round = {v: {r: summarize(pick(requests, v, r), pick(suggestions, v, r), pick(blocks, v, r)) for r in rounds} for v in variants}
    def compare(v: str, against: str) -> dict:
        return {k: {"pooled": _ratio(pooled[v][k], pooled[against][k]),
                    "rounds": [_ratio(per_round[v][r][k], per_round[against][r][k]) for r in rounds]} for k in RATIO_KEYS}

    ratios = {v: compare(v, base) for v in variants if v != base} if base in pooled else {}
    on, off = PREFETCH_PAIR
    prefetch = compare(on, off) if on in pooled and off in pooled else {}
    return {"variants": pooled, "per_round": per_round, "ratios_to_base": ratios, "prefetch_on_off": prefetch}


def markdown(doc: dict) -> str:
    a = doc["analysis"]
    variants = list(a["variants"])
    rows = [
        ("keystroke requests", "requests", "{:.0f}"),
        ("superseded before the answer", "superseded_share", "{:.0%}"),
        ("new suggestions shown", "shown", "{:.0f}"),
        ("shown per minute of typing", "shown_per_min", "{:.1f}"),
        ("keystroke to shown, p50 (ms)", "shown_p50_ms", "{:.1f}"),
        ("keystroke to shown, p90 (ms)", "shown_p90_ms", "{:.1f}"),
        ("acceptances answered before the next keystroke", "after_accept_n", "{:.0f}"),
        ("... of which shown (not empty)", "after_accept_shown", "{:.0f}"),
        ("acceptance to that answer, p50 (ms)", "after_accept_p50_ms", "{:.1f}"),
        ("acceptance to that answer, p90 (ms)", "after_accept_p90_ms", "{:.1f}"),
        ("Enter right after an acceptance, answered", "next_line_n", "{:.0f}"),
        ("... of which shown (the next line)", "next_line_shown", "{:.0f}"),
        ("Enter to that answer, p50 (ms)", "next_line_p50_ms", "{:.1f}"),
        ("accepted share of shown", "accept_share", "{:.1%}"),
        ("characters of a suggestion matching what came next (mean)", "matched_chars_mean", "{:.1f}"),
        ("wasted engine tokens per shown", "wasted_per_shown", "{:.1f}"),
        ("prefix-cache hit rate", "prefix_cache_hit_rate", "{:.1%}"),
        ("prompt tokens looked up", "prompt_tokens_queried", "{:.0f}"),
        ("prompt tokens computed (not cached) per model request", "computed_per_model_request", "{:.0f}"),
    ]
    lines = [f"### Typing sessions: {doc['rounds']} rounds x {len(variants)} variants, {doc.get('server', 'quickdraft serve')}, {doc['machine']}", "",
             "| figure | " + " | ".join(variants) + " |", "|---|" + "---:|" * len(variants)]
    for label, key, fmt in rows:
        cells = []
        for v in variants:
            x = a["variants"][v][key]
            cells.append("n/a" if isinstance(x, float) and math.isnan(x) else fmt.format(x))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if a["ratios_to_base"]:
        lines += ["", f"Ratios to `{BASE}` (pooled; per round in brackets):", "",
                  "| ratio | " + " | ".join(a["ratios_to_base"]) + " |", "|---|" + "---:|" * len(a["ratios_to_base"])]
        for key in RATIO_KEYS:
            cells = []
            for v, r in a["ratios_to_base"].items():
                per = ", ".join("n/a" if math.isnan(x) else f"{x:.2f}" for x in r[key]["rounds"])
                cells.append(("n/a" if math.isnan(r[key]["pooled"]) else f"{r[key]['pooled']:.2f}") + f" [{per}]")
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if a.get("prefetch_on_off"):
        on, off = PREFETCH_PAIR
        lines += ["", f"Prefetch on / off (`{on}` / `{off}`; pooled; per round in brackets):", "", "| ratio | value |", "|---|---:|"]
        for key, r in a["prefetch_on_off"].items():
            per = ", ".join("n/a" if math.isnan(x) else f"{x:.2f}" for x in r["rounds"])
            lines.append(f"| {key} | " + ("n/a" if math.isnan(r["pooled"]) else f"{r['pooled']:.2f}") + f" [{per}] |")
    keys = sorted({k for v in variants for k in a["variants"][v]["bridge"]})
    if keys:
        lines += ["", "Bridge counters (`quickdraft/bridgeStats`):", "", "| counter | " + " | ".join(variants) + " |",
                  "|---|" + "---:|" * len(variants)]
        lines += [f"| {k} | " + " | ".join(str(a["variants"][v]["bridge"].get(k, 0)) for v in variants) + " |" for k in keys]
    return "\n".join(lines) + "\n"


# --- offline: the prompts alone, against a model of vLLM's prefix cache -------------------


class PrefixCacheModel:
    """vLLM's prefix cache as its scheduler looks it up: full blocks of
    ``block_size`` tokens, each known by every token up to its end; a prompt
    hits the longest run of known blocks from its start, within its length
    less one token, and one block fewer with a draft head (EAGLE: vLLM
    recomputes that block for the head's hidden states). No eviction: a typing
    session's prompts fit any cache."""

    def __init__(self, block_size: int, eagle: bool):
        self.block_size = block_size
        self.eagle = eagle
        self.known: set[int] = set()

    def lookup(self, ids: list[int]) -> int:
        """Tokens of ``ids`` served from the cache; then ``ids`` is cached too."""
        bs = self.block_size
        chain, hashes = 0, []
        for k in range(len(ids) // bs):
            chain = hash((chain, tuple(ids[k * bs : (k + 1) * bs])))
            hashes.append(chain)
        n = 0
        while n < min(len(hashes), (len(ids) - 1) // bs) and hashes[n] in self.known:
            n += 1
        if self.eagle and n:
            n -= 1
        self.known.update(hashes)
        return n * bs


def offline_replay(plan: list[list[Target]], variants: list[str], block_size: int, eagle: bool, budget_tokens: int = 768,
                   chars_per_token: float = 3.45) -> dict:
    """Every keystroke of every session (no typos, no acceptances, no debounce)
    turned into the bridge's prompt in process, tokenized as the server does
    (the embedded model's tokenizer), looked up in a ``PrefixCacheModel`` of
    its own per variant. Deterministic: the prompt builder's share alone."""
    from transformers import AutoTokenizer

    from quickdraft.lsp_bridge.completer import make_request
    from quickdraft.lsp_bridge.context import Budget, ContextEngine
    from quickdraft.lsp_bridge.settings import Settings
    from quickdraft.lsp_bridge.token_ratio import BytesPerToken, prompt_bytes
    from quickdraft.lsp_bridge.workspace import Change, Workspace
    from quickdraft.server.presets import embedded_dir
    from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize

    tokens = PromptTokenizer(AutoTokenizer.from_pretrained(str(embedded_dir() / "target")))
    out = {}
    for variant in variants:
        settings = Settings().merged(VARIANTS[variant])
        cache = PrefixCacheModel(block_size, eagle)
        queried = hit = requests = 0
        for target in (t for targets in plan for t in targets):
            root = Path(target.package_dir).parent
            ws = Workspace([str(root)])
            engine = ContextEngine(ws, stable=settings.stable_prompt)
            for rel in target.tabs():
                ws.open((root / rel).as_uri(), (root / rel).read_text(encoding="utf-8"), language_id="python")
            before, span = target.texts()
            opened = ws.open((root / target.rel).as_uri(), before, language_id="python", version=1)
            ratio = BytesPerToken(chars_per_token)
            text, cursor, i = before, target.start, 0
            while i < len(span):
                chunk = next_chunk(span, i)
                at = _position(text, cursor)
                ws.change(opened.uri, opened.doc.version + 1, [Change(chunk, at, at)])
                text, cursor, i = text[:cursor] + chunk + text[cursor:], cursor + len(chunk), i + len(chunk)
                budget = Budget(budget_tokens, ratio.value(opened.uri, "python"))
                request, _ = make_request(ws, engine, opened, opened.doc.offset_at(*_position(text, cursor)), budget, settings)
                ids = tokenize(tokens, request, "qwen-fim")
                ratio.observe(opened.uri, "python", prompt_bytes(request), len(ids))
                queried += len(ids)
                hit += cache.lookup(ids)
                requests += 1
        out[variant] = {"requests": requests, "hit_rate": _ratio(hit, queried), "tokens_per_request": _ratio(queried, requests),
                        "computed_per_request": _ratio(queried - hit, requests)}
    return out


def _position(text: str, index: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, index) + 1
    return text.count("\n", 0, index), _units(text[line_start:index], "utf-16")


def offline_markdown(result: dict, block_size: int, eagle: bool) -> str:
    variants = list(result)
    lines = [f"### Typing sessions offline: prompts against a prefix-cache model, {block_size}-token blocks"
             + (", EAGLE's dropped block" if eagle else ""), "",
             "| figure | " + " | ".join(variants) + (f" | {variants[-1]} / {variants[0]} |" if len(variants) > 1 else " |"),
             "|---|" + "---:|" * (len(variants) + (len(variants) > 1))]
    for label, key, fmt in (("keystroke prompts", "requests", "{:.0f}"), ("prefix-cache hit rate", "hit_rate", "{:.1%}"),
                            ("prompt tokens per prompt", "tokens_per_request", "{:.0f}"),
                            ("tokens computed (not cached) per prompt", "computed_per_request", "{:.0f}")):
        cells = [fmt.format(result[v][key]) for v in variants]
        if len(variants) > 1:
            cells.append(f"{_ratio(result[variants[-1]][key], result[variants[0]][key]):.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- command line --------------------------------------------------------------------


async def _run_all(args: argparse.Namespace, address: str, plan: list[list[Target]], typist: Typist, workdir: Path, grace_s: float) -> dict:
    requests: list[dict] = []
    suggestions: list[dict] = []
    blocks: list[dict] = []
    variants = [v for v in args.variants.split(",") if v]
    from quickdraft.bench import typing_oracle

    oracle = oracle_server = None
    if args.oracle is not None:
        oracle = typing_oracle.EngineBacked(args.oracle, upstream=address) if args.oracle_engine else typing_oracle.Oracle(args.oracle)
        oracle_server, address = await typing_oracle.start(oracle)
    try:
        if args.warmup_chars > 0:
            warm = pick_targets(1, args.warmup_chars, args.seed + 1000, max_chars=max(60, args.warmup_chars))[0][:1]
            await run_block(address, variants[0], 0, warm, typist, args.seed, workdir, 0.0, [], [], oracle)
        for n, (round_no, variant) in enumerate(schedule(variants, args.rounds)):
            block = await run_block(address, variant, round_no, plan[round_no - 1], typist, args.seed, workdir, grace_s, requests, suggestions,
                                    oracle)
            blocks.append(block)
            print(f"typing: block {n + 1}/{len(variants) * args.rounds} round {round_no} {variant}: {block['typing_s']:.0f} s typing, "
                  f"{sum(1 for s in suggestions if s['variant'] == variant and s['round'] == round_no)} shown", file=sys.stderr, flush=True)
    finally:
        if oracle_server is not None:
            await oracle_server.stop(0)
        if isinstance(oracle, typing_oracle.EngineBacked):
            await oracle.close()
    return {"requests": requests, "suggestions": suggestions, "blocks": blocks}


def run(args: argparse.Namespace) -> int:
    from quickdraft.bench import servers
    from quickdraft.bench.lsp_common import machine

    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        print(f"quickdraft bench typing: unknown variants {unknown}; pick from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    if args.oracle_engine and args.oracle is None:
        print("quickdraft bench typing: --oracle-engine needs --oracle P (the share of places the stand-in answers right)", file=sys.stderr)
        return 2
    if args.oracle is not None and not 0.0 <= args.oracle <= 1.0:
        print(f"quickdraft bench typing: --oracle is a share between 0 and 1, not {args.oracle}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = pick_targets(args.rounds, args.chars, args.seed, args.min_function_chars, args.max_function_chars)
    if args.offline:
        # Prefetching changes no prompt: base against stable.
        offline_variants = [v for v in variants if v != "prefetch"] or ["base", "stable"]
        result = offline_replay(plan, offline_variants, args.block_size, not args.no_eagle)
        md = offline_markdown(result, args.block_size, not args.no_eagle)
        (out / "typing-offline.json").write_text(json.dumps({
            "title": "quickdraft bench typing --offline", "block_size": args.block_size, "eagle": not args.no_eagle,
            "rounds": args.rounds, "targets": [[{"file": t.rel, "chars": t.end - t.start} for t in r] for r in plan],
            "variants": result}, indent=2) + "\n")
        (out / "typing-offline.md").write_text(md)
        print(md)
        return 0
    typist = Typist(keys_per_s=args.keys_per_s)
    workdir = Path(tempfile.mkdtemp(prefix="quickdraft-typing-"))
    server = None
    grace_s = GRACE_S
    try:
        if args.oracle is not None and not args.oracle_engine:
            from quickdraft.bench.typing_oracle import GRACE_S as oracle_grace

            address, grace_s = "", oracle_grace  # started in _run_all
        elif args.server:
            address = args.server
            grace_s = args.grace
        else:
            overrides = {"telemetry.never_shown_grace_s": str(GRACE_S)}
            overrides.update(kv.split("=", 1) for kv in args.set)
            grace_s = float(overrides["telemetry.never_shown_grace_s"])
            server = servers.quickdraft_server("typing", overrides, out / "logs")
            server.launch(servers.server_env())
            asyncio.run(servers.wait_grpc_serving(server))
            address = f"127.0.0.1:{server.port}"
            print(f"typing: server ready in {server.start_s:.0f} s", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        records = asyncio.run(_run_all(args, address, plan, typist, workdir, grace_s))
        wall_s = time.monotonic() - t0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    doc = {
        "title": "quickdraft bench typing",
        "machine": machine(),
        "rounds": args.rounds,
        "variants": {v: VARIANTS[v] for v in variants},
        "typist": asdict(typist),
        "targets": [[{"file": t.rel, "chars": t.end - t.start} for t in r] for r in plan],
        "wall_s": wall_s,
        "server": _server_label(args),
        "server_overrides": list(args.set),
        "command": "quickdraft bench typing " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "typing"] else sys.argv[1:]),
        "analysis": analyze(records["requests"], records["suggestions"], records["blocks"]),
        "blocks": records["blocks"],
        "suggestions": records["suggestions"],
        "requests": records["requests"] if args.per_request else None,
    }
    (out / "typing.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    md = markdown(doc)
    (out / "typing.md").write_text(md)
    print(md)
    print(f"typing: wrote {out / 'typing.json'} and {out / 'typing.md'} ({wall_s / 60:.1f} min)", file=sys.stderr)
    return 0


def _server_label(args: argparse.Namespace) -> str:
    engine = args.server or "quickdraft serve (embedded), started here"
    if args.oracle is None:
        return engine
    stand_in = f"stand-in text right for {args.oracle:.0%} of requests (bench/typing_oracle.py)"
    return f"{stand_in}, at the pace and cost of {engine}" if args.oracle_engine else f"{stand_in}, no engine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=2, help="rounds; each replays every variant on its own functions")
    p.add_argument("--chars", type=int, default=120, help="characters of function bodies to type per round (whole functions)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)} (the first is the ratios' base when it is {BASE})")
    p.add_argument("--keys-per-s", type=float, default=6.0, help="the typist's median keys per second")
    p.add_argument("--min-function-chars", type=int, default=60)
    p.add_argument("--max-function-chars", type=int, default=260)
    p.add_argument("--warmup-chars", type=int, default=60, help="a function of about this size typed first, not recorded (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server", help="HOST:PORT of a running quickdraft server (default: start `quickdraft serve`)")
    p.add_argument("--grace", type=float, default=30.0, help="with --server: its telemetry.never_shown_grace_s")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="setting for the server started here (repeatable)")
    p.add_argument("--per-request", action="store_true", help="keep every request's record in typing.json")
    p.add_argument("--oracle", type=float, metavar="P",
                   help="instead of a server, a stand-in model that answers what the typist will type, right for a share P of "
                        "requests (bench/typing_oracle.py): measures prefetching, which the embedded model's rare matches never start")
    p.add_argument("--oracle-engine", action="store_true",
                   help="with --oracle: the stand-in's text at the pace and cost of the real server (started here, or --server), "
                        "whose prefix cache and waste figures are read")
    p.add_argument("--offline", action="store_true",
                   help="no server, no bridge process: every keystroke's prompt, built in process, against a model of vLLM's prefix cache")
    p.add_argument("--block-size", type=int, default=16, help="--offline: the cache's block size (16: vLLM on a GPU; 128: on a CPU)")
    p.add_argument("--no-eagle", action="store_true", help="--offline: no draft head (no block dropped from each hit)")
    p.add_argument("--out", default="bench/results/typing")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quickdraft.bench.typing_session", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
