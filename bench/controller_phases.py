"""The controller under a changing load: closed-loop phases back to back on
one server, 1 concurrent stream, then 8, then 1 again, against every static
speculative config and against the adaptive controller.

    python -m quickdraft.bench.controller_phases [--phase-seconds 60] [--configs off,p3,p5,p7,ar3,ar5,controller]
        [--statics-from bench/results/sweep/sweep.json] [--out bench/results/phases]
    quickdraft bench phases ...                                   (the same)

Each config gets its own freshly started ``quickdraft serve`` (a child
process, as in the sweep: off, ar1..ar7, p1..p7 and ``controller.enabled=true``),
a few warm-up requests, then the phases without a pause between them: the
controller's server sees the load change. The controller's server first gets
``--controller-warmup`` seconds of load at the first phase's concurrency (it
explores), straight into phase 1. It starts without a profile (a cold start)
unless ``--controller-profile-dir`` names a directory of them (e.g. the one
``quickdraft tune`` wrote), which is copied into --out, never written to.

Request *k* of phase *p* is the same for every config: task k of phase p's own
slice of the tasks (``task_slices``; deterministic by seed and index). Use
``--heldout-packages --tasks 4400`` so that no prompt repeats and no config finds
another phase's prompts in its prefix cache. The workload defaults to no
cancellations and no chat class (``--cancel-share 0 --chat-share 0``),
greedy: TPOT compares like with like.

Per phase, with requests bucketed by the phase they STARTED in (client-side
timings, token-weighted TPOT = decode time / decode tokens):

- the best static config's TPOT and the controller's, over the phase after
  its first ``--settle-seconds`` (30) and over the whole phase; regret =
  controller / best static - 1. Target: within 5 % in every phase after the
  first 30 s. Also when (on a 5-s grid) the controller's TPOT from then to the
  phase's end first came within 5 % of the best static's over the same window;
- the same regret against the best static config that met the inline TTFT
  SLO (the controller server's ``controller.ttft_slo_s``), with every
  config's TTFT p95;
- the controller against the seed's fixed config (parallel K=5), as a ratio;
- engine rebuilds (GetControllerState's ``engine_rebuilds``, read at every
  phase boundary, and the switch decisions it lists), and requests that failed
  (any status but OK) in each phase and while a rebuild was under way. Target: 0.

``--reanalyse PHASES_JSON --out DIR`` measures nothing: it recomputes an
earlier run's verdicts and report with this code.

``--statics-from FILE`` (repeatable) takes static configs' figures from an
earlier run's phases.json, or from a sweep.json (the level at each phase's
concurrency), so the controller can be rerun alone; configs measured in this
run win over loaded ones.

Output (``--out``, default bench/results/phases): phases.json (machine, load
averages, versions, command, every config's per-phase figures and per-request
timings, the servers' polled state, the verdicts), phases.md, phases.png
(TPOT over time per config with the phase boundaries and the controller's
switches; per-phase bars), and the servers' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from quickdraft.bench import report, servers
from quickdraft.bench.figures import summarize_run
from quickdraft.bench.loadgen import GrpcTarget, Result, RunOutcome, RunSpec, send_safely
from quickdraft.bench.stats import percentile
from quickdraft.bench.sweep import SweepConfig, all_configs, controller_available
from quickdraft.bench.workload import Planned, Workload, WorkloadSpec

PHASE_CONCURRENCY = (1, 8, 1)
SETTLE_S = 30.0
TOLERANCE = 0.05
SEED_CONFIG = "p5"  # the seed's fixed config: P-EAGLE K=5
STATIC_MODES = ("off", "autoregressive", "parallel")
SWITCHING_STATES = ("switching", "restarting")  # ServerInfo.state while an engine is being (re)built


def known_configs() -> dict[str, SweepConfig]:
    return {c.label: c for c in all_configs() if c.mode != "peer"}


@dataclass
class PhasesSpec:
    configs: list[str] = field(default_factory=lambda: list(known_configs()))
    concurrency: list[int] = field(default_factory=lambda: list(PHASE_CONCURRENCY))
    phase_seconds: float = 60.0
    settle_s: float = SETTLE_S
    tolerance: float = TOLERANCE
    warmup_requests: int = 3  # per server, one at a time, not recorded
    controller_warmup_s: float = 60.0
    controller_profile_dir: str | None = None  # profiles to start from (copied); None: none, a cold start
    statics_from: list[str] = field(default_factory=list)
    seed_config: str = SEED_CONFIG
    poll_s: float = 1.0  # GetServerInfo (engine state and config) on every server, alike
    state_every_s: float = 10.0  # GetControllerState, besides the reads at every phase boundary
    preset: str | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    # Rounds: every config measured this many times, the order reversed every
    # other round (so a slow drift of the machine hits all alike); the verdicts
    # pool each config's requests over its rounds and show each round's figure.
    rounds: int = 1

    def validate(self) -> None:
        if not self.concurrency or any(not 1 <= c <= 256 for c in self.concurrency):
            raise ValueError(f"phases {self.concurrency}: need at least one, each 1..256 streams")
        if not 0 < self.phase_seconds <= 3600:
            raise ValueError(f"--phase-seconds {self.phase_seconds}: must be within (0, 3600]")
        if not 0 <= self.settle_s < self.phase_seconds:
            raise ValueError(f"--settle-seconds {self.settle_s}: must be within [0, phase seconds {self.phase_seconds})")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"--tolerance {self.tolerance}: must be within [0, 1)")
        if self.controller_warmup_s < 0 or self.warmup_requests < 0:
            raise ValueError("warm-ups cannot be negative")
        if self.poll_s <= 0 or self.state_every_s <= 0:
            raise ValueError("poll intervals must be positive")
        if not 1 <= self.rounds <= 10:
            raise ValueError(f"--rounds {self.rounds}: must be within 1..10")


# --- the phases ---------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    index: int  # 0, 1, 2, ...; -1: the controller's warm-up (not measured)
    concurrency: int
    start_s: float  # since the first measured phase began
    end_s: float

    @property
    def measured(self) -> bool:
        return self.index >= 0

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    def name(self) -> str:
        return "warm-up" if self.index < 0 else f"phase {self.index + 1}"

    def to_dict(self) -> dict:
        return {"index": self.index, "concurrency": self.concurrency, "start_s": self.start_s, "end_s": self.end_s}


def schedule(concurrency: Sequence[int], phase_s: float, warmup_s: float = 0.0) -> list[Phase]:
    """The measured phases back to back from t=0, after an optional warm-up phase ending at 0."""
    out = [Phase(-1, concurrency[0], -warmup_s, 0.0)] if warmup_s > 0 else []
    out += [Phase(i, c, i * phase_s, (i + 1) * phase_s) for i, c in enumerate(concurrency)]
    return out


def phase_at(t: float, phases: Sequence[Phase]) -> Phase | None:
    for p in phases:
        if p.start_s <= t < p.end_s:
            return p
    return None


def task_slices(n_tasks: int, phases: Sequence[Phase]) -> dict[int, tuple[int, int]]:
    """Phase p's request k is workload index start + k of its slice ``(start, size)``.

    The tasks are cut into one slice per measured phase, sized by its streams,
    plus one (key -1) for the warm-up load: the controller's warm-up phase, and
    every server's warm-up requests, which take the last tasks. So no phase
    meets another's prompts in the prefix cache unless it runs past its slice
    (``repeated_prompts``). The slices depend on the measured phases only:
    every config, controller or static, gets the same requests.
    """
    measured = [p for p in phases if p.measured]
    keys = [p.index for p in measured] + [-1]
    weights = [p.concurrency for p in measured] + [measured[0].concurrency]
    unit = n_tasks / sum(weights)
    edges = [round(unit * sum(weights[:i])) for i in range(len(weights) + 1)]
    return {k: (edges[i], max(1, edges[i + 1] - edges[i])) for i, k in enumerate(keys)}


def repeated_prompts(reqs: Sequence["Req"], phases: Sequence[Phase], slices: dict[int, tuple[int, int]]) -> dict[int, int]:
    """Per measured phase, how many of its requests ran past its slice of tasks (a prompt seen before)."""
    out = {}
    for p in phases:
        if p.measured:
            start, size = slices[p.index]
            out[p.index] = sum(1 for r in reqs if r.index >= start + size and phase_at(r.start_s, phases) == p)
    return out


REQ_COLUMNS = ["index", "start_s", "end_s", "outcome", "tokens", "decode_s", "ttft_s", "error"]


@dataclass
class Req:
    """One request's timing, compact: what the analysis needs (and what the JSON keeps per request)."""

    index: int
    start_s: float  # since the first measured phase began (negative: warm-up)
    end_s: float
    outcome: str  # ok | cancelled | failed
    tokens: int = 0
    decode_s: float | None = None
    ttft_s: float | None = None
    error: str = ""

    @property
    def decode_tokens(self) -> int:
        return self.tokens - 1 if self.outcome == "ok" and self.decode_s is not None and self.tokens >= 2 else 0

    def row(self) -> list:
        r = lambda v: None if v is None else round(v, 5)  # noqa: E731
        return [self.index, r(self.start_s), r(self.end_s), self.outcome, self.tokens, r(self.decode_s), r(self.ttft_s), self.error]

    @classmethod
    def from_row(cls, row: Sequence) -> "Req":
        return cls(**dict(zip(REQ_COLUMNS, row)))

    @classmethod
    def from_result(cls, r: Result, start_s: float, end_s: float) -> "Req":
        return cls(r.index, start_s, end_s, r.outcome, r.tokens, r.decode_s, r.ttft_s, r.error)


def reqs_of(run: dict) -> list[Req] | None:
    """A run's per-request timings (None: a run with figures only, e.g. from a sweep)."""
    table = run.get("requests")
    if not table:
        return None
    cols = table.get("columns") or REQ_COLUMNS
    return [Req(**{k: v for k, v in zip(cols, row) if k in REQ_COLUMNS}) for row in table["rows"]]


def bucket(items: Sequence, phases: Sequence[Phase], settle_s: float, start: Callable = lambda r: r.start_s) -> dict[int, dict[str, list]]:
    """Requests by the measured phase they STARTED in: ``whole`` (all of them)
    and ``settled`` (those that started ``settle_s`` or more after the phase
    began). Warm-up requests and any that started after the last phase are left out."""
    out: dict[int, dict[str, list]] = {p.index: {"whole": [], "settled": []} for p in phases if p.measured}
    for r in items:
        t = start(r)
        p = phase_at(t, phases)
        if p is None or not p.measured:
            continue
        out[p.index]["whole"].append(r)
        if t >= p.start_s + settle_s:
            out[p.index]["settled"].append(r)
    return out


def max_in_flight(reqs: Sequence[Req]) -> int:
    """The most of these requests that were in flight at once."""
    events = sorted([(r.start_s, 1) for r in reqs] + [(r.end_s, -1) for r in reqs])
    peak = n = 0
    for _, d in events:
        n += d
        peak = max(peak, n)
    return peak


def token_weighted_ms(reqs: Sequence[Req]) -> float | None:
    """All decode time / all decode tokens of the completed requests, in ms (None: no decode tokens)."""
    n = sum(r.decode_tokens for r in reqs)
    if n == 0:
        return None
    return 1000.0 * sum(r.decode_s for r in reqs if r.decode_tokens) / n


def window_tpot_ms(reqs: Sequence[Req], t0: float, t1: float) -> float | None:
    return token_weighted_ms([r for r in reqs if t0 <= r.start_s < t1])


# --- driving the load ------------------------------------------------------------------


async def drive(target, workload: Workload, phases: Sequence[Phase], slices: dict[int, tuple[int, int]], origin: float,
                on_request: Callable[[Result, Req], None] | None = None) -> list[tuple[Result, Req]]:
    """A closed loop whose concurrency follows ``phases`` without a pause:
    slot j sends while the current phase has more than j streams, and sleeps
    (after its request in flight ends) while it has not. Nothing is sent after
    the last phase; requests in flight then finish. Times are relative to
    ``origin`` (a perf_counter value: the first measured phase's start)."""
    out: list[tuple[Result, Req]] = []
    counters = {p.index: 0 for p in phases}
    end = phases[-1].end_s

    def now() -> float:
        return time.perf_counter() - origin

    async def slot(j: int) -> None:
        while True:
            t = now()
            if t >= end:
                return
            p = phase_at(t, phases)
            if p is None:  # before the first phase
                await asyncio.sleep(max(0.001, phases[0].start_s - t))
                continue
            if j >= p.concurrency:
                nxt = next((q for q in phases if q.start_s >= p.end_s and j < q.concurrency), None)
                if nxt is None:
                    return
                await asyncio.sleep(max(0.001, nxt.start_s - t))
                continue
            k = counters[p.index]
            counters[p.index] += 1
            planned = workload.planned(slices[p.index][0] + k)
            t0 = now()
            r = await send_safely(target, planned, origin)
            q = Req.from_result(r, t0, now())
            out.append((r, q))
            if on_request is not None:
                on_request(r, q)

    await asyncio.gather(*(slot(j) for j in range(max(p.concurrency for p in phases))))
    return sorted(out, key=lambda x: x[1].start_s)


def _figures(results: list[Result], concurrency: int, wall_s: float) -> dict:
    fig = summarize_run(RunOutcome(RunSpec(concurrency=concurrency), sorted(results, key=lambda r: r.index), max(wall_s, 1e-9)))
    fig.pop("histograms", None)  # every request's timing is kept in the run's "requests"
    return fig


def phase_figures(pairs: Sequence[tuple[Result, Req]], phases: Sequence[Phase], settle_s: float) -> list[dict]:
    """Per measured phase: the load generator's figures over the whole phase and over its settled part."""
    # (Workload indices can repeat across phases: bucket the pairs themselves.)
    groups = bucket(pairs, phases, settle_s, start=lambda pair: pair[1].start_s)
    out = []
    for p in phases:
        if not p.measured:
            continue
        g = groups[p.index]
        out.append({
            "phase": p.index,
            "concurrency": p.concurrency,
            "whole": _figures([r for r, _ in g["whole"]], p.concurrency, p.seconds),
            "settled": _figures([r for r, _ in g["settled"]], p.concurrency, p.seconds - settle_s),
        })
    return out


# --- watching the server ------------------------------------------------------------------


def short_label(label: str) -> str:
    """The controller's "parallel K=5" / "autoregressive K=3" as p5 / ar3 (other labels as they are)."""
    for long, short in (("parallel K=", "p"), ("autoregressive K=", "ar")):
        if label.startswith(long) and label[len(long):].isdigit():
            return short + label[len(long):]
    return label


def spec_label(sc) -> str:
    """A ServerInfo/ControllerState SpeculativeConfig as a config label: off, p5, ar3 (``*``: a per-batch-size K schedule)."""
    if not sc.method:
        return "off"
    return f"{'p' if sc.parallel_drafting else 'ar'}{sc.num_speculative_tokens}" + ("*" if len(sc.per_batch_size) else "")


class ServerWatch:
    """Polls a server while it is measured: GetServerInfo every ``poll_s``
    (engine state, e.g. "switching", and the engine's speculative config), the
    same way for every config; on the controller's server also
    GetControllerState every ``state_every_s`` and at each phase boundary
    (engine rebuilds, decisions). Static servers are not asked for a
    controller state: they have none to give."""

    def __init__(self, address: str, origin: float, poll_s: float = 1.0, state_every_s: float = 10.0, controller: bool = True):
        self.address = address
        self.controller = controller
        self.origin = origin
        self.origin_unix = time.time() - (time.perf_counter() - origin)
        self.poll_s = poll_s
        self.state_every_s = state_every_s
        self.samples: list[list] = []  # [t sent, t answered, state, config]
        self.reads: list[dict] = []  # {"tag", "t", "enabled", "engine_rebuilds", "active"}
        self.decisions: dict[tuple, dict] = {}
        self.errors: list[str] = []
        self._client = None

    def t(self) -> float:
        return time.perf_counter() - self.origin

    async def open(self) -> None:
        from quickdraft.client.aio import AsyncCompletionClient

        self._client = AsyncCompletionClient(self.address)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _error(self, what: str, e: Exception) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{what} at {self.t():.1f} s: {type(e).__name__}: {str(e)[:200]}")

    async def sample(self) -> None:
        import grpc

        t0 = self.t()
        try:
            info = await self._client.server_info(timeout=5)
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            self._error("GetServerInfo", e)
            return
        self.samples.append([round(t0, 3), round(self.t(), 3), info.state, spec_label(info.speculative)])

    async def read_state(self, tag: str) -> None:
        import grpc

        if not self.controller:
            return
        t0 = self.t()
        try:
            st = await self._client.controller_state(timeout=10)
        except (grpc.RpcError, asyncio.TimeoutError) as e:
            self._error(f"GetControllerState ({tag})", e)
            return
        self.reads.append({"tag": tag, "t": round(t0, 3), "enabled": st.enabled, "engine_rebuilds": st.engine_rebuilds, "active": spec_label(st.active)})
        for d in st.decisions:
            key = (round(d.unix_time, 3), d.action, d.to_config)
            self.decisions.setdefault(key, {"t": round(d.unix_time - self.origin_unix, 3), "action": d.action, "from": d.from_config, "to": d.to_config, "reason": d.reason})

    async def run(self, stop: asyncio.Event) -> None:
        next_state = self.t() + self.state_every_s
        while not stop.is_set():
            await self.sample()
            if self.controller and self.t() >= next_state:
                await self.read_state("poll")
                next_state = self.t() + self.state_every_s
            try:
                await asyncio.wait_for(stop.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def at_boundaries(self, phases: Sequence[Phase]) -> None:
        """A GetControllerState read as each measured phase begins."""
        for p in phases:
            if not p.measured:
                continue
            await asyncio.sleep(max(0.0, p.start_s - self.t()))
            await self.read_state(f"phase {p.index} start")

    def to_dict(self) -> dict:
        return {
            "poll_s": self.poll_s,
            "state_every_s": self.state_every_s,
            "sample_columns": ["t_sent_s", "t_answered_s", "state", "config"],
            "samples": self.samples,
            "controller_reads": self.reads,
            "decisions": sorted(self.decisions.values(), key=lambda d: d["t"]),
            "errors": self.errors,
        }


# --- rebuilds and failures -----------------------------------------------------------------


def rebuild_windows(decisions: Sequence[dict], samples: Sequence[Sequence], end_s: float) -> list[dict]:
    """When the server was building another engine: from each decision that
    is not a hold to the first poll sent after it that found the server no
    longer switching (the end of the run if none did); plus any polled stretch
    of switching/restarting that no decision explains (an engine restart),
    from the last poll that saw it serving to the first that saw it serving again."""
    wins = []
    for d in sorted(decisions, key=lambda d: d["t"]):
        if d["action"] == "hold":
            continue
        after = [s for s in samples if s[0] > d["t"] and s[2] not in SWITCHING_STATES]
        wins.append({"start_s": d["t"], "end_s": min(after[0][1], end_s) if after else end_s, "action": d["action"], "from": d["from"], "to": d["to"]})
    i = 0
    ordered = sorted(samples, key=lambda s: s[0])
    while i < len(ordered):
        if ordered[i][2] not in SWITCHING_STATES:
            i += 1
            continue
        j = i
        while j < len(ordered) and ordered[j][2] in SWITCHING_STATES:
            j += 1
        start = ordered[i - 1][1] if i > 0 else ordered[i][0]
        end = ordered[j][1] if j < len(ordered) else end_s
        if not any(w["start_s"] <= ordered[i][1] and ordered[i][0] <= w["end_s"] for w in wins):
            wins.append({"start_s": start, "end_s": end, "action": ordered[i][2], "from": ordered[i - 1][3] if i > 0 else "", "to": ordered[j][3] if j < len(ordered) else ""})
        i = j
    return sorted(wins, key=lambda w: w["start_s"])


def refused_as_invalid(r: Req) -> bool:
    """Refused for what it asked (e.g. a prompt over the limit): it fails the same on every config,
    at any time, so a rebuild did not lose it."""
    return r.outcome == "failed" and r.error.startswith("INVALID_ARGUMENT")


def failed_during(reqs: Sequence[Req], windows: Sequence[dict]) -> list[Req]:
    """Failed requests (any status but OK, not the client's own cancel, not refused as invalid) in
    flight during a rebuild window."""
    return [r for r in reqs if r.outcome == "failed" and not refused_as_invalid(r)
            and any(r.start_s <= w["end_s"] and r.end_s >= w["start_s"] for w in windows)]


def rebuild_accounting(run: dict, phases: Sequence[Phase]) -> dict:
    """Engine rebuilds per phase (GetControllerState's engine_rebuilds at the
    phase boundaries; the switch decisions it listed) and the requests that
    failed per phase and during rebuilds."""
    server = run.get("server") or {}
    reads = server.get("controller_reads") or []
    decisions = server.get("decisions") or []
    samples = server.get("samples") or []
    reqs = reqs_of(run) or []
    measured = [p for p in phases if p.measured]
    end_s = max([measured[-1].end_s] + [r.end_s for r in reqs]) if measured else 0.0

    def read(tag: str) -> int | None:
        r = next((r for r in reads if r["tag"] == tag), None)
        return None if r is None else r["engine_rebuilds"]

    marks = [read(f"phase {p.index} start") for p in measured] + [read("end")]
    windows = rebuild_windows(decisions, samples, end_s)
    during = failed_during(reqs, windows)
    groups = bucket(reqs, phases, 0.0)
    per_phase = []
    for i, p in enumerate(measured):
        a, b = marks[i], marks[i + 1]
        switches = [d for d in decisions if d["action"] != "hold" and p.start_s <= d["t"] < p.end_s]
        per_phase.append({
            "phase": p.index,
            "engine_rebuilds": None if a is None or b is None else b - a,
            "switch_decisions": len(switches),
            "failed": sum(r.outcome == "failed" for r in groups[p.index]["whole"]),
            "refused_as_invalid": sum(refused_as_invalid(r) for r in groups[p.index]["whole"]),
            "failed_during_rebuilds": sum(1 for r in during if p.start_s <= r.start_s < p.end_s),
        })
    total = None if marks[0] is None or marks[-1] is None else marks[-1] - marks[0]
    if total is None and all(x["engine_rebuilds"] is None for x in per_phase):
        total = sum(x["switch_decisions"] for x in per_phase)  # no reads: count the decisions
        source = "switch decisions (GetControllerState could not be read at the boundaries)"
    else:
        source = "GetControllerState engine_rebuilds at the phase boundaries"
    warmup = [d for d in decisions if d["action"] != "hold" and d["t"] < 0]
    return {
        "engine_rebuilds": total,
        "source": source,
        "switches_in_warmup": len(warmup),
        "per_phase": per_phase,
        "windows": windows,
        "failed": sum(x["failed"] for x in per_phase),
        "refused_as_invalid": sum(x["refused_as_invalid"] for x in per_phase),
        "failed_during_rebuilds": len([r for r in during if r.start_s >= 0]),
        "failed_during_rebuilds_examples": sorted({r.error for r in during})[:5],
    }


# --- verdicts ------------------------------------------------------------------------------


def tpot_in(run: dict, phase: Phase, t_from: float = 0.0, reqs: list[Req] | None = None) -> float | None:
    """``run``'s token-weighted TPOT (ms) over the requests that started in
    ``phase`` ``t_from`` s or more after it began. A run with figures only (a
    sweep's level) gives its one figure, whatever ``t_from``."""
    reqs = reqs if reqs is not None else reqs_of(run)
    if reqs is not None:
        return window_tpot_ms(reqs, phase.start_s + t_from, phase.end_s)
    ph = next((x for x in run.get("phases") or [] if x and x.get("phase") == phase.index), None)
    if ph is None:
        return None
    fig = ph.get("settled" if t_from > 0 else "whole") or ph.get("whole")
    return None if fig is None else fig.get("tpot_ms_token_weighted")


def ttft_p95_in(run: dict, phase: Phase, t_from: float = 0.0, reqs: list[Req] | None = None) -> float | None:
    """``run``'s TTFT p95 (s) over the completed requests that started in ``phase`` ``t_from`` s or
    more after it began (a run with figures only: its phase figure's)."""
    reqs = reqs if reqs is not None else reqs_of(run)
    if reqs is not None:
        xs = [r.ttft_s for r in reqs if r.ttft_s is not None and phase.start_s + t_from <= r.start_s < phase.end_s]
        return percentile(xs, 95) if xs else None
    ph = next((x for x in run.get("phases") or [] if x and x.get("phase") == phase.index), None)
    fig = None if ph is None else (ph.get("settled" if t_from > 0 else "whole") or ph.get("whole"))
    p95_ms = ((fig or {}).get("ttft_ms") or {}).get("p95")
    return None if p95_ms is None else p95_ms / 1000.0


def best_static(statics: Sequence[tuple[dict, list[Req] | None]], phase: Phase, t_from: float) -> tuple[dict | None, float | None]:
    best, value = None, None
    for run, reqs in statics:
        v = tpot_in(run, phase, t_from, reqs)
        if v is not None and (value is None or v < value):
            best, value = run, v
    return best, value


def grid(phase: Phase) -> list[float]:
    """Offsets into a phase at which "within tolerance from here on" is tested: every 5 s (finer
    for short phases), leaving at least a quarter of the phase to measure."""
    step = max(0.05, min(5.0, phase.seconds / 12))
    out, t = [], 0.0
    while phase.seconds - t >= phase.seconds / 4 - 1e-9:
        out.append(round(t, 3))
        t += step
    return out


def reached_within(ctl: tuple[dict, list[Req] | None], statics, phase: Phase, tolerance: float) -> float | None:
    """The first offset t (on ``grid``) at which the controller's TPOT over the
    rest of the phase is within ``tolerance`` of the best static's over the same window."""
    for t in grid(phase):
        c = tpot_in(ctl[0], phase, t, ctl[1])
        _, b = best_static(statics, phase, t)
        if c is not None and b is not None and c <= (1 + tolerance) * b:
            return t
    return None


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 4)


Rounds = list[tuple[dict, "list[Req] | None"]]


def by_config(runs: Sequence[dict]) -> list[tuple[dict, list[Req] | None, Rounds]]:
    """Runs grouped by config label, in first-seen order: (its first run, the
    requests of all its rounds pooled, each round's (run, requests)). Pooled is
    None when a round has figures only (loaded from a sweep)."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(r["label"], []).append(r)
    out = []
    for rs in groups.values():
        rounds = [(r, reqs_of(r)) for r in rs]
        pooled = None if any(q is None for _, q in rounds) else [x for _, q in rounds for x in q]
        out.append((rs[0], pooled, rounds))
    return out


def combine_accounting(accs: Sequence[dict]) -> dict:
    """Rebuild accounting of several controller rounds, summed."""
    if len(accs) == 1:
        return accs[0]
    total = lambda key: None if any(a[key] is None for a in accs) else sum(a[key] for a in accs)  # noqa: E731
    per_phase = []
    for rows in zip(*(a["per_phase"] for a in accs)):
        per_phase.append({"phase": rows[0]["phase"], **{k: None if any(r[k] is None for r in rows) else sum(r[k] for r in rows)
                                                         for k in ("engine_rebuilds", "switch_decisions", "failed", "refused_as_invalid",
                                                                   "failed_during_rebuilds")}})
    return {
        "engine_rebuilds": total("engine_rebuilds"), "source": accs[0]["source"] + f", summed over {len(accs)} rounds",
        "switches_in_warmup": total("switches_in_warmup"), "per_phase": per_phase,
        "windows": [dict(w, round=i + 1) for i, a in enumerate(accs) for w in a["windows"]],
        "failed": total("failed"), "refused_as_invalid": total("refused_as_invalid"), "failed_during_rebuilds": total("failed_during_rebuilds"),
        "failed_during_rebuilds_examples": sorted({e for a in accs for e in a["failed_during_rebuilds_examples"]})[:5],
    }


def verdicts(runs: Sequence[dict], phases: Sequence[Phase], settle_s: float, tolerance: float, seed: str = SEED_CONFIG,
             ttft_slo_s: float | None = None) -> dict:
    """Controller against the best static config per phase; with ``ttft_slo_s`` (the inline TTFT
    SLO at p95 the controller works under) also against the best static config that met it,
    the one the controller is asked to find (a static over the SLO is not a config it may pick)."""
    groups = by_config([r for r in runs if r.get("phases") and not r.get("error")])
    statics = [(r, q) for r, q, _ in groups if r.get("mode") in STATIC_MODES]
    static_rounds = {r["label"]: rounds for r, _, rounds in groups if r.get("mode") in STATIC_MODES}
    ctl_group = next((g for g in groups if g[0].get("mode") == "controller"), None)
    ctl = None if ctl_group is None else ctl_group[:2]
    seed_run = next(((r, q) for r, q in statics if r["label"] == seed), None)
    rows = []
    for p in phases:
        if not p.measured:
            continue
        b_s, v_s = best_static(statics, p, settle_s)
        b_w, v_w = best_static(statics, p, 0.0)
        row = {
            "phase": p.index, "concurrency": p.concurrency,
            "best_static": b_s and b_s["label"], "best_static_source": b_s and b_s.get("source"), "best_static_tpot_ms": _round(v_s),
            "best_static_whole": b_w and b_w["label"], "best_static_tpot_ms_whole": _round(v_w),
            "controller_tpot_ms": None, "controller_tpot_ms_whole": None, "regret": None, "regret_whole": None,
            "within_tolerance": None, "reached_s": None,
            "seed_tpot_ms": None, "seed_tpot_ms_whole": None, "controller_vs_seed": None, "controller_vs_seed_whole": None,
        }
        if ttft_slo_s is not None:
            p95 = {r["label"]: ttft_p95_in(r, p, settle_s, q) for r, q in statics}
            feasible = [(r, q) for r, q in statics if p95[r["label"]] is not None and p95[r["label"]] <= ttft_slo_s]
            b_f, v_f = best_static(feasible, p, settle_s)
            row["static_ttft_p95_ms"] = {k: _round(None if v is None else 1000 * v, 1) for k, v in p95.items()}
            row["best_feasible_static"], row["best_feasible_static_tpot_ms"] = b_f and b_f["label"], _round(v_f)
            row["regret_vs_feasible"] = row["within_tolerance_vs_feasible"] = row["controller_ttft_p95_ms"] = None
        if seed_run is not None:
            row["seed_tpot_ms"] = _round(tpot_in(seed_run[0], p, settle_s, seed_run[1]))
            row["seed_tpot_ms_whole"] = _round(tpot_in(seed_run[0], p, 0.0, seed_run[1]))
        if ctl is not None:
            c_s = tpot_in(ctl[0], p, settle_s, ctl[1])
            c_w = tpot_in(ctl[0], p, 0.0, ctl[1])
            row["controller_tpot_ms"], row["controller_tpot_ms_whole"] = _round(c_s), _round(c_w)
            r_s, r_w = _rel(c_s, v_s), _rel(c_w, v_w)
            row["regret"] = None if r_s is None else round(r_s - 1, 4)
            row["regret_whole"] = None if r_w is None else round(r_w - 1, 4)
            row["within_tolerance"] = None if r_s is None else r_s - 1 <= tolerance
            if ttft_slo_s is not None:
                c_p95 = ttft_p95_in(ctl[0], p, settle_s, ctl[1])
                row["controller_ttft_p95_ms"] = _round(None if c_p95 is None else 1000 * c_p95, 1)
                r_f = _rel(c_s, row["best_feasible_static_tpot_ms"])
                row["regret_vs_feasible"] = None if r_f is None else round(r_f - 1, 4)
                row["within_tolerance_vs_feasible"] = None if r_f is None else r_f - 1 <= tolerance
            row["reached_s"] = reached_within(ctl, statics, p, tolerance) if statics else None
            if seed_run is not None:
                row["controller_vs_seed"] = _rel(c_s, row["seed_tpot_ms"])
                row["controller_vs_seed_whole"] = _rel(c_w, row["seed_tpot_ms_whole"])
            if len(ctl_group[2]) > 1 and b_s is not None:
                # Round by round (round i of each config ran close in time): the spread is the machine's noise.
                ctl_r = [tpot_in(r, p, settle_s, q) for r, q in ctl_group[2]]
                best_r = [tpot_in(r, p, settle_s, q) for r, q in static_rounds[b_s["label"]]]
                row["rounds"] = {"controller_tpot_ms": [_round(x) for x in ctl_r], "best_static_tpot_ms": [_round(x) for x in best_r],
                                 "regret": [None if _rel(c, b) is None else round(_rel(c, b) - 1, 4) for c, b in zip(ctl_r, best_r)]}
        rows.append(row)
    out: dict = {"tolerance": tolerance, "settle_s": settle_s, "seed_config": seed, "ttft_slo_s": ttft_slo_s,
                 "statics": [r["label"] for r, _ in statics], "phases": rows}
    if ctl is not None:
        acc = combine_accounting([rebuild_accounting(r, phases) for r, _ in ctl_group[2]])
        out["controller"] = acc
        measured = [r for r in rows]
        all_within = all(r["within_tolerance"] for r in measured) if measured and all(r["within_tolerance"] is not None for r in measured) else None
        reached = [r["reached_s"] for r in measured]
        out["targets"] = {
            "within_tolerance_every_phase": all_within,
            "reached_within_settle_every_phase": None if all_within is None else all(t is not None and t <= settle_s for t in reached),
            "failed_during_rebuilds_zero": acc["failed_during_rebuilds"] == 0,
            "met": bool(all_within) and acc["failed_during_rebuilds"] == 0,
        }
        if ttft_slo_s is not None:
            vs_f = [r["within_tolerance_vs_feasible"] for r in rows]
            # None when a phase had no static config within the SLO (nothing to compare with).
            out["targets"]["within_tolerance_vs_feasible_every_phase"] = None if None in vs_f else all(vs_f)
    return out


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)


# --- statics from an earlier run -------------------------------------------------------------

FIGURE_KEYS = ("mode", "concurrency", "wall_s", "requests", "completed", "cancelled", "failed", "failures", "ttft_ms", "tpot_ms",
               "tpot_ms_token_weighted", "e2e_ms", "output_tokens", "output_tokens_per_s", "mean_acceptance_length")


def load_statics(path: Path, spec: PhasesSpec, wspec: WorkloadSpec | None = None) -> tuple[list[dict], list[str]]:
    """Static configs' runs from an earlier phases.json, or from a sweep.json
    (its closed-loop level at each phase's concurrency; figures only, the same
    for the whole phase and its settled part). (runs, notes)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--statics-from {path}: cannot read it ({e})") from None
    notes = []
    date = doc.get("date", "?")
    runs = []
    if doc.get("benchmark") == "controller_phases":
        if list(doc["spec"]["concurrency"]) != list(spec.concurrency):
            raise ValueError(f"--statics-from {path}: its phases are {doc['spec']['concurrency']} streams, this run's {spec.concurrency}")
        for key, ours in (("phase_seconds", spec.phase_seconds), ("settle_s", spec.settle_s)):
            if doc["spec"].get(key) != ours:
                notes.append(f"statics from {path}: {key} {doc['spec'].get(key)} there, {ours} here")
        for r in doc["runs"]:
            if r.get("mode") in STATIC_MODES and r.get("phases") and not r.get("error"):
                src = r.get("source") or "this run"
                runs.append({**r, "source": f"{path} ({date})" if src == "this run" else src})
        theirs = doc.get("workload") or {}
    elif "sweep" in doc and "runs" in doc:
        for r in doc["runs"]:
            if r.get("mode") not in STATIC_MODES or not r.get("levels") or r.get("error"):
                continue
            ph = []
            for i, c in enumerate(spec.concurrency):
                lv = next((lv for lv in r["levels"] if lv.get("concurrency") == c and lv.get("mode", "closed") == "closed"), None)
                fig = None if lv is None else {k: lv.get(k) for k in FIGURE_KEYS}
                ph.append({"phase": i, "concurrency": c, "whole": fig, "settled": fig})
            runs.append({"label": r["label"], "mode": r["mode"], "k": r.get("k"), "source": f"{path} (sweep, {date})", "phases": ph})
        theirs = doc.get("workload") or {}
        notes.append(f"statics from the sweep {path} ({date}): each phase's figure is the sweep's closed-loop level at that concurrency "
                     "(a separate run of at most its --requests, after its own warm-up); no per-request timings, so settled = whole and "
                     "their TPOT is the same for every window")
    else:
        raise ValueError(f"--statics-from {path}: neither a phases.json nor a sweep.json")
    if wspec is not None and theirs:
        diffs = [f"{k} {theirs.get(k)!r} there, {v!r} here" for k, v in asdict(wspec).items()
                 if k in theirs and (list(v) if isinstance(v, tuple) else v) != theirs.get(k)]
        if diffs:
            notes.append(f"statics from {path}: another workload ({'; '.join(diffs)})")
    if not runs:
        notes.append(f"statics from {path}: no static config with figures in it")
    return runs, notes


# --- servers ---------------------------------------------------------------------------------


@dataclass
class Started:
    argv: list[str]
    log_path: str | None
    address: str = ""
    start_s: float | None = None
    obj: object = None


class SubprocessLauncher:
    """``quickdraft serve`` as a child process per config (bench/servers.py)."""

    def __init__(self, spec: PhasesSpec, log_dir: Path):
        self.spec = spec
        self.log_dir = log_dir
        self.started: dict[str, int] = {}

    def create(self, conf: SweepConfig, overrides: dict[str, str]) -> Started:
        n = self.started[conf.label] = self.started.get(conf.label, 0) + 1
        name = conf.label if n == 1 else f"{conf.label}.{n}"  # one log per server, rounds included
        s = servers.quickdraft_server(name, {**self.spec.overrides, **dict(conf.overrides), **overrides}, self.log_dir, preset=self.spec.preset)
        return Started(argv=s.argv, log_path=str(s.log_path), address=f"127.0.0.1:{s.port}", obj=s)

    async def launch(self, h: Started) -> None:
        h.obj.launch(servers.server_env(offline=self.spec.preset in (None, "embedded")))
        await servers.wait_grpc_serving(h.obj)
        h.start_s = h.obj.start_s

    async def stop(self, h: Started):
        await asyncio.to_thread(h.obj.stop)
        return h.obj.exit_code


# --- one config ------------------------------------------------------------------------------


class Progress:
    """A time-based progress bar over all configs' load seconds (engine starts not included)."""

    def __init__(self, total_s: float, show: bool = True):
        from tqdm import tqdm

        # Into a log file (not a terminal) a line every 30 s, not every half second.
        self.bar = tqdm(total=max(1, round(total_s)), unit="s", desc="phases", disable=not show, dynamic_ncols=True,
                        mininterval=0.5 if sys.stderr.isatty() else 30.0,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s of load [{elapsed}<{remaining}{postfix}]")
        self.done_s = 0.0
        self.counts = {"ok": 0, "cancelled": 0, "failed": 0}

    def note(self, msg: str) -> None:
        self.bar.set_description_str(msg[:48])
        self.bar.write(f"[{time.strftime('%H:%M:%S')}] {msg}")

    def request(self, r: Result, q: Req) -> None:
        self.counts[r.outcome if r.outcome in self.counts else "failed"] += 1

    async def follow(self, label: str, phases: Sequence[Phase], origin: float) -> None:
        first = phases[0].start_s
        span = phases[-1].end_s - first
        while True:
            t = time.perf_counter() - origin
            p = phase_at(t, phases)
            if p is not None:
                self.bar.set_description_str(f"{label} {p.name()} ({_streams(p.concurrency)})", refresh=False)
            self.bar.set_postfix_str(f"{self.counts['ok']} done, {self.counts['failed']} failed", refresh=False)
            self.bar.update(max(0, min(self.bar.total, round(self.done_s + min(span, max(0.0, t - first)))) - self.bar.n))
            await asyncio.sleep(0.5)

    def finish_config(self, seconds: float) -> None:
        self.done_s += seconds
        self.bar.update(max(0, min(self.bar.total, round(self.done_s)) - self.bar.n))

    def close(self) -> None:
        self.bar.close()


async def measure_config(conf: SweepConfig, spec: PhasesSpec, workload: Workload, launcher, ui: Progress, profile_dir: str | None = None) -> dict:
    """Start conf's server, warm it up, run the phases back to back while polling its state, stop it; the run's record."""
    is_ctl = conf.mode == "controller"
    row: dict = {"label": conf.label, "mode": conf.mode, "k": conf.k, "overrides": dict(conf.overrides), "source": "this run", "phases": []}
    extra = {"controller.profile_dir": profile_dir} if is_ctl and profile_dir else {}
    if extra:
        row["controller_profile_dir"] = profile_dir
    row["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    h = launcher.create(conf, extra)
    row["argv"], row["server_log"] = h.argv, h.log_path
    warm_s = spec.controller_warmup_s if is_ctl else 0.0
    phases = schedule(spec.concurrency, spec.phase_seconds, warm_s)
    ui.note(f"{conf.label}: starting server")
    try:
        await launcher.launch(h)
        row["server_start_s"] = None if h.start_s is None else round(h.start_s, 1)
        ui.note(f"{conf.label}: serving after {h.start_s or 0:.0f} s" + (f"; {warm_s:g} s of load before phase 1 (the controller explores)" if warm_s else ""))
        target = GrpcTarget(h.address)
        await target.open()
        watch = None
        try:
            warm_fail = 0
            for i in range(spec.warmup_requests):
                p = workload.planned(-1 - i)
                r = await send_safely(target, Planned(p.index, p.task, p.latency_class, None), time.perf_counter())
                warm_fail += r.outcome != "ok"
            row["warmup_failures"] = warm_fail
            origin = time.perf_counter() + warm_s
            watch = ServerWatch(h.address, origin, spec.poll_s, spec.state_every_s, controller=is_ctl)
            await watch.open()
            await watch.read_state("before")
            stop = asyncio.Event()
            tasks = [asyncio.create_task(watch.run(stop)), asyncio.create_task(watch.at_boundaries(phases))]
            follower = asyncio.create_task(ui.follow(conf.label, phases, origin))
            try:
                slices = task_slices(len(workload.tasks), phases)
                pairs = await drive(target, workload, phases, slices, origin, on_request=ui.request)
                await tasks[1]
                stop.set()
                await tasks[0]
                await watch.read_state("end")
            finally:
                for t in (*tasks, follower):
                    t.cancel()
            row["wall_s"] = round(time.perf_counter() - origin + warm_s, 2)
            row["phases"] = phase_figures(pairs, phases, spec.settle_s)
            row["warmup_phase"] = None if not warm_s else {"seconds": warm_s, "requests": sum(q.start_s < 0 for _, q in pairs),
                                                            "failed": sum(q.start_s < 0 and q.outcome == "failed" for _, q in pairs)}
            row["requests"] = {"columns": REQ_COLUMNS, "rows": [q.row() for _, q in pairs]}
            row["repeated_prompts"] = repeated_prompts([q for _, q in pairs], phases, slices)
            row["server"] = watch.to_dict()
            row["engine_configs_seen"] = sorted({s[3] for s in watch.samples})
            if not is_ctl and row["engine_configs_seen"] and row["engine_configs_seen"] != [conf.label]:
                row["warning"] = f"the server reported running {', '.join(row['engine_configs_seen'])}, not {conf.label}"
            row["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            if is_ctl:
                row["controller"] = rebuild_accounting(row, phases)
            figs = ", ".join(f"{x['concurrency']}: {_fmt(x['settled']['tpot_ms_token_weighted'], 2)} ms" for x in row["phases"])
            ui.note(f"{conf.label}: TPOT settled per phase {figs}; {sum(x['whole']['failed'] for x in row['phases'])} failed")
        finally:
            await target.close()
            if watch is not None:
                await watch.close()
    except Exception as e:  # noqa: BLE001 - one config failing must not lose the others
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
        ui.note(f"{conf.label}: FAILED: {row['error'][:300]}")
    finally:
        row["server_exit_code"] = await launcher.stop(h)
        ui.finish_config(sum(p.seconds for p in phases))
    return row


# --- the whole benchmark -----------------------------------------------------------------------


def inline_slo_s(spec: PhasesSpec) -> float | None:
    """The inline TTFT SLO (p95, s) the controller's server runs under: its default, or what
    ``--set controller.ttft_slo_s=...`` made it (the phases' requests are all inline)."""
    from quickdraft.server.config import load_config

    return load_config(env={}, overrides=spec.overrides).controller.ttft_slo_s.get("inline")


def run_bench(spec: PhasesSpec, wspec: WorkloadSpec, out: Path, show_progress: bool = True, launcher=None) -> dict:
    spec.validate()
    known = known_configs()
    unknown = [c for c in spec.configs if c not in known]
    if unknown:
        raise ValueError(f"unknown configs {unknown}; choose from {', '.join(known)}")
    if not spec.configs and not spec.statics_from:
        raise ValueError("nothing to measure: give --configs or --statics-from")
    workload = Workload.from_spec(wspec)
    out.mkdir(parents=True, exist_ok=True)
    phases = schedule(spec.concurrency, spec.phase_seconds)
    doc: dict = {**report.header(), "benchmark": "controller_phases", "spec": asdict(spec), "workload": {**workload.describe(), "source": wspec.source},
                 "phases": [p.to_dict() for p in phases], "runs": [], "notes": []}
    loaded: list[dict] = []
    for f in spec.statics_from:
        runs, notes = load_statics(Path(f), spec, wspec)
        loaded += runs
        doc["notes"] += notes
    ok, why = controller_available()
    confs = []
    for label in spec.configs:
        if label == "controller" and not ok:
            doc["runs"].append({"label": "controller", "mode": "controller", "k": None, "phases": [], "skipped": why})
            continue
        confs.append(known[label])
    src = None
    if spec.controller_profile_dir and any(c.mode == "controller" for c in confs):
        src = Path(spec.controller_profile_dir).expanduser()
        if not src.is_dir():
            raise ValueError(f"--controller-profile-dir {src}: not a directory")

    def fresh_profile_dir() -> str:
        # The controller starts cold (or from copies of --controller-profile-dir's profiles), every
        # round alike, and writes nothing into the user's cache or that directory.
        d = tempfile.mkdtemp(prefix="controller-profile-", dir=out)
        copied = []
        for f in sorted(src.glob("*.json")) if src else ():
            shutil.copy2(f, d)
            copied.append(f.name)
        doc["controller_profile"] = {"dir": d, "fresh": src is None, "copied_from": spec.controller_profile_dir, "files": copied}
        return d

    launcher = launcher or SubprocessLauncher(spec, out / "logs")
    total = spec.rounds * sum(len(spec.concurrency) * spec.phase_seconds + (spec.controller_warmup_s if c.mode == "controller" else 0) for c in confs)
    ui = Progress(total, show_progress)
    t0 = time.time()
    try:
        for rnd in range(spec.rounds):
            for conf in confs if rnd % 2 == 0 else confs[::-1]:
                profile_dir = fresh_profile_dir() if conf.mode == "controller" else None
                row = asyncio.run(measure_config(conf, spec, workload, launcher, ui, profile_dir))
                if spec.rounds > 1:
                    row["round"] = rnd + 1
                doc["runs"].append(row)
                doc["wall_s"] = round(time.time() - t0, 1)
                report.write_json(out / "phases.json", doc)
    finally:
        ui.close()
    measured = {r["label"] for r in doc["runs"] if r.get("phases")}
    taken_from: dict[str, str] = {}  # label -> the file its runs come from (all its rounds there)
    for r in loaded:
        if r["label"] in measured:
            doc["notes"].append(f"{r['label']}: measured in this run; the one from {r['source']} is left out")
            continue
        if taken_from.setdefault(r["label"], r["source"]) != r["source"]:
            continue  # an earlier file has this config
        doc["runs"].append(r)
    doc["machine_at_end"] = report.machine()
    doc["verdicts"] = verdicts(doc["runs"], phases, spec.settle_s, spec.tolerance, spec.seed_config, inline_slo_s(spec))
    doc["notes"].append("Configs ran one after another, each on a freshly started server; machine noise between them is not averaged out "
                        "(load averages before and after each are in phases.json)." if spec.rounds == 1 else
                        f"Configs ran one after another, each on a freshly started server, in {spec.rounds} rounds (order reversed every other "
                        "round); a config's figures pool its requests over the rounds, and the per-round figures show the machine's noise.")
    report.write_json(out / "phases.json", doc)
    (out / "phases.md").write_text(markdown(doc))
    plot(doc, out / "phases.png")
    return doc


# --- markdown ----------------------------------------------------------------------------------


def _fmt(v, digits: int = 2, suffix: str = "") -> str:
    return report._f(v, digits, suffix)  # noqa: SLF001 - the same "-" for missing numbers as the other tables


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.1f}%"


def _yes(v) -> str:
    return "-" if v is None else ("yes" if v else "**no**")


def _n(v) -> str:
    return "?" if v is None else str(v)


def _streams(c: int) -> str:
    return f"{c} stream{'s' if c != 1 else ''}"


def _repeats(doc: dict) -> str:
    """How many requests met a prompt seen before in their server's run (their phase ran past its tasks)."""
    counts = [sum((r.get("repeated_prompts") or {}).values()) for r in doc["runs"] if r.get("source", "this run") == "this run" and "repeated_prompts" in r]
    if not counts:
        return ""
    return f"; each phase has its own slice of the tasks, and {max(counts)} request(s) at most per server repeated a prompt (the phase ran past its slice)"


def markdown(doc: dict) -> str:
    spec = doc["spec"]
    phases = [Phase(**p) for p in doc["phases"]]
    v = doc.get("verdicts") or {}
    w = doc["workload"]
    settle, tol = spec["settle_s"], spec["tolerance"]
    prof = doc.get("controller_profile")
    lines = [
        f"# quickdraft bench phases — {doc['date']}", "",
        f"Machine: {doc['machine']['hardware']}, load average at start {doc['machine']['load_average']}"
        + (f", at end {doc['machine_at_end']['load_average']}" if doc.get("machine_at_end") else "")
        + f"; vLLM {doc['versions']['vllm']}; quickdraft {doc['versions']['quickdraft']} ({doc['versions']['git']}).", "",
        f"Command: `{doc['command']}`", "",
        f"Load: closed loop, {' → '.join(_streams(p.concurrency) for p in phases)}, {spec['phase_seconds']:.0f} s per phase, back to back "
        f"on one server per config (after {spec['warmup_requests']} warm-up request(s)). Workload: {w['tasks']} tasks from {w['source']}, "
        f"{w['single_line_share']:.0%} single-line, cancel share {w['cancel_share']:.0%}, chat share {w['chat_share']:.0%}, greedy; "
        "request k of phase p is the same for every config" + _repeats(doc) + ".", "",
        f"TPOT is token-weighted (decode time / decode tokens, client-side) over the requests that *started* in the phase; "
        f"**settled** leaves out those that started in its first {settle:g} s. Regret = controller / best static − 1.",
    ]
    if prof or any(r.get("mode") == "controller" for r in doc["runs"]):
        lines.append("")
        lines.append(f"Controller: {spec['controller_warmup_s']:.0f} s of load at {_streams(spec['concurrency'][0])} before phase 1; "
                     + ("no profile (a cold start)" if not prof or prof.get("fresh")
                        else f"started from the profiles in {prof.get('copied_from')} ({', '.join(prof.get('files') or []) or 'none found: a cold start'})") + ".")
    lines.append("")
    if v.get("targets"):
        t, acc = v["targets"], v["controller"]
        per = v["phases"]
        miss = ", ".join(f"phase {r['phase'] + 1} {_pct(r['regret'])}" for r in per if r["within_tolerance"] is False)
        per_phase_rebuilds = ", ".join(f"phase {x['phase'] + 1}: {_n(x['engine_rebuilds'])}" for x in acc["per_phase"])
        within = t["within_tolerance_every_phase"]
        within_text = "-" if within is None else "met" if within else "**missed**" + (f" ({miss})" if miss else "")
        reached_text = ", ".join("never" if r["reached_s"] is None else _fmt(r["reached_s"], 0, " s") for r in per)
        lines += ["## Targets", "", "| target | result |", "|---|---|",
                  f"| every phase: controller TPOT within {tol:.0%} of the best static config (settled) | {within_text} |",
                  f"| ... reached within {settle:g} s of the phase change | {_yes(t['reached_within_settle_every_phase'])} (from {reached_text}) |",
                  f"| engine rebuilds | {_n(acc['engine_rebuilds'])} ({per_phase_rebuilds}; {acc['switches_in_warmup']} switch(es) in the warm-up) |",
                  f"| requests failed during rebuilds (target 0) | {acc['failed_during_rebuilds']}{' ✓' if acc['failed_during_rebuilds'] == 0 else ''} "
                  f"(failed in all phases: {acc['failed']}, of which {acc.get('refused_as_invalid', 0)} refused as invalid, "
                  "e.g. a prompt over the limit, as on every config) |"]
        if v.get("ttft_slo_s") is not None:
            vs_f = t.get("within_tolerance_vs_feasible_every_phase")
            miss_f = ", ".join(f"phase {r['phase'] + 1} {_pct(r['regret_vs_feasible'])}" for r in per if r.get("within_tolerance_vs_feasible") is False)
            lines.append(f"| every phase: within {tol:.0%} of the best static config that met the TTFT SLO ({1000 * v['ttft_slo_s']:.0f} ms p95) "
                         f"| {'-' if vs_f is None else 'met' if vs_f else '**missed**' + (f' ({miss_f})' if miss_f else '')} |")
        lines.append("")
    if v.get("phases"):
        lines += ["## Controller vs the best static config, per phase", "",
                  f"| phase | load | best static (settled) | its TPOT ms | controller TPOT ms | regret settled | best static (whole) | regret whole "
                  f"| within {tol:.0%} | within {tol:.0%} from | {v['seed_config']} TPOT ms | controller / {v['seed_config']} settled | whole |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in v["phases"]:
            lines.append(f"| {r['phase'] + 1} | {_streams(r['concurrency'])} | {r['best_static'] or '-'} | {_fmt(r['best_static_tpot_ms'])} "
                         f"| {_fmt(r['controller_tpot_ms'])} | {_pct(r['regret'])} | {r['best_static_whole'] or '-'} | {_pct(r['regret_whole'])} "
                         f"| {_yes(r['within_tolerance'])} | {_fmt(r['reached_s'], 0, ' s') if r['reached_s'] is not None else '-'} "
                         f"| {_fmt(r['seed_tpot_ms'])} | {_fmt(r['controller_vs_seed'], 3, 'x')} | {_fmt(r['controller_vs_seed_whole'], 3, 'x')} |")
        lines.append("")
        if v.get("ttft_slo_s") is not None:
            lines += [f"Within the inline TTFT SLO ({1000 * v['ttft_slo_s']:.0f} ms at p95, settled), the SLO the controller works under:", "",
                      "| phase | best static within the SLO | its TPOT ms | regret | controller TTFT p95 ms | static TTFT p95 ms |", "|---|---|---|---|---|---|"]
            for r in v["phases"]:
                p95s = ", ".join(f"{k} {_fmt(x, 0)}" for k, x in (r.get("static_ttft_p95_ms") or {}).items())
                lines.append(f"| {r['phase'] + 1} | {r.get('best_feasible_static') or 'none'} | {_fmt(r.get('best_feasible_static_tpot_ms'))} "
                             f"| {_pct(r.get('regret_vs_feasible'))} | {_fmt(r.get('controller_ttft_p95_ms'), 0)} | {p95s} |")
            lines.append("")
        per_round = [r for r in v["phases"] if r.get("rounds")]
        if per_round:
            lines += ["Round by round (the controller's round i against the same best static config's round i, settled): "
                      + "; ".join(f"phase {r['phase'] + 1}: " + ", ".join(
                          f"{_fmt(c)} vs {_fmt(b)} ms ({_pct(g)})" for c, b, g in
                          zip(r["rounds"]["controller_tpot_ms"], r["rounds"]["best_static_tpot_ms"], r["rounds"]["regret"])) for r in per_round) + ".", ""]
    head = " | ".join(f"phase {p.index + 1}: {_streams(p.concurrency)}" for p in phases)
    lines += ["## Every config: token-weighted TPOT ms per phase (settled / whole), requests done / failed", "",
              f"| config | {head} | source |", "|---|" + "---|" * len(phases) + "---|"]
    best = {r["phase"]: r["best_static"] for r in v.get("phases", [])}
    for run in doc["runs"]:
        if not run.get("phases"):
            continue
        cells = []
        for p in phases:
            ph = next((x for x in run["phases"] if x and x.get("phase") == p.index), None)
            if ph is None or ph.get("whole") is None:
                cells.append("-")
                continue
            s, wh = ph["settled"] or {}, ph["whole"]
            cell = f"{_fmt(s.get('tpot_ms_token_weighted'))} / {_fmt(wh.get('tpot_ms_token_weighted'))} ({wh.get('completed', '-')} / {wh.get('failed', '-')})"
            cells.append(f"**{cell}**" if best.get(p.index) == run["label"] else cell)
        name = run["label"] + (f" (round {run['round']})" if run.get("round") else "")
        lines.append(f"| {name} | {' | '.join(cells)} | {run.get('source', 'this run')} |")
    lines += ["", "Bold: the best static config of the phase (settled).", ""]
    for ctl in [r for r in doc["runs"] if r.get("mode") == "controller" and r.get("server")]:
        decisions = [d for d in ctl["server"]["decisions"] if d["action"] != "hold"]
        lines += ["## The controller's engine switches" + (f" (round {ctl['round']})" if ctl.get("round") else ""), ""]
        if decisions:
            lines += ["| t (s) | phase | action | from → to | reason |", "|---|---|---|---|---|"]
            for d in decisions:
                p = phase_at(d["t"], schedule(spec["concurrency"], spec["phase_seconds"], spec["controller_warmup_s"]))
                lines.append(f"| {d['t']:.1f} | {p.name() if p else '-'} | {d['action']} | {d['from']} → {d['to']} | {d['reason'][:160]} |")
        else:
            lines.append("None: the controller kept its start config throughout.")
        acc = (v.get("controller") or {})
        windows = [x for x in acc.get("windows") or [] if x.get("round") == ctl.get("round")]
        if windows:
            lines += ["", "Rebuild windows (decision → first poll that found the server serving again): "
                      + "; ".join(f"{x['start_s']:.1f}-{x['end_s']:.1f} s ({x['from']} → {x['to']})" for x in windows) + "."]
        if ctl["server"].get("errors"):
            lines += ["", "Polling errors: " + "; ".join(ctl["server"]["errors"][:5])]
        lines.append("")
    notes = list(doc.get("notes", []))
    notes += [f"{r['label']}: {r.get('skipped') or r.get('error') or r.get('warning')}" for r in doc["runs"] if r.get("skipped") or r.get("error") or r.get("warning")]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# --- plot --------------------------------------------------------------------------------------


def rolling_tpot(reqs: Sequence[Req], window_s: float, t0: float, t1: float) -> tuple[list[float], list[float]]:
    """Token-weighted TPOT (ms) of the requests that started within ``window_s`` before each point, every window/4."""
    xs, ys = [], []
    step = window_s / 4
    t = t0 + window_s
    while t <= t1 + 1e-9:
        v = window_tpot_ms(reqs, t - window_s, t)
        if v is not None:
            xs.append(t - window_s / 2)
            ys.append(v)
        t += step
    return xs, ys


def plot(doc: dict, path: Path, window_s: float | None = None) -> Path | None:
    runs = [r for r in doc["runs"] if r.get("phases")]
    if not runs:
        return None
    plt = report._pyplot()
    spec = doc["spec"]
    phases = [Phase(**p) for p in doc["phases"]]
    window_s = window_s or max(0.5, min(10.0, spec["phase_seconds"] / 6))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [3, 2]})
    seed = spec.get("seed_config", SEED_CONFIG)
    palette = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i not in (2, 3)]  # green: the controller, red: the seed config
    others = [r["label"] for r in runs if r.get("mode") != "controller" and r["label"] != seed]

    def color(r: dict):
        if r.get("mode") == "controller":
            return "green"
        if r["label"] == seed:
            return "red"
        return palette[others.index(r["label"]) % len(palette)]
    t_lo = min([phases[0].start_s] + [-spec["controller_warmup_s"] for r in runs if r.get("mode") == "controller"])
    for i, r in enumerate(runs):
        reqs = reqs_of(r)
        is_ctl = r.get("mode") == "controller"
        style = {"color": color(r), "linewidth": 2.4, "zorder": 5} if is_ctl else \
                {"color": color(r), "linestyle": "--", "linewidth": 1.6} if r["label"] == seed else \
                {"color": color(r), "linewidth": 1.0, "alpha": 0.8}
        if reqs is not None:
            xs, ys = rolling_tpot(reqs, window_s, t_lo if is_ctl else phases[0].start_s, phases[-1].end_s)
            ax.plot(xs, ys, label=r["label"], **style)
        else:  # figures only: one level per phase
            for p in phases:
                v = tpot_in(r, p, 1.0)
                if v is not None:
                    ax.hlines(v, p.start_s, p.end_s, label=r["label"] if p.index == 0 else None, linestyles=":", **{k: val for k, val in style.items() if k != "linestyle"})
    ymax = ax.get_ylim()[1]
    for p in phases:
        ax.axvline(p.start_s, color="black", linewidth=0.8)
        ax.axvspan(p.start_s, min(p.end_s, p.start_s + spec["settle_s"]), color="grey", alpha=0.08)
        ax.text(p.start_s + 0.5, ymax, f" {_streams(p.concurrency)}", va="top", fontsize=8)
    ctl = next((r for r in runs if r.get("mode") == "controller" and r.get("server")), None)
    if ctl is not None:
        for d in ctl["server"]["decisions"]:
            if d["action"] != "hold":
                ax.axvline(d["t"], color="green", linestyle=":", linewidth=1)
                ax.text(d["t"], ymax * 0.97, f" →{short_label(d['to'])}", rotation=90, va="top", fontsize=7, color="green")
    ax.set_xlabel("seconds since phase 1 began (request start)")
    ax.set_ylabel(f"TPOT ms, token-weighted over {window_s:.0f}-s windows")
    ax.set_title("TPOT over time (shaded: the first seconds after each phase change)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    # per-phase bars: settled TPOT, every config
    n = len(runs)
    width = 0.8 / max(1, n)
    for i, r in enumerate(runs):
        vals = [tpot_in(r, p, spec["settle_s"]) for p in phases]
        bx.bar([j + (i - (n - 1) / 2) * width for j in range(len(phases))], [x if x is not None else 0 for x in vals], width,
               label=r["label"], color=color(r), alpha=0.9 if r.get("mode") == "controller" else 0.6)
    bx.set_xticks(range(len(phases)))
    bx.set_xticklabels([f"phase {p.index + 1}\n{_streams(p.concurrency)}" for p in phases])
    bx.set_ylabel("TPOT ms, token-weighted, settled")
    bx.set_title(f"per phase, after its first {spec['settle_s']:g} s", fontsize=9)
    bx.grid(alpha=0.3, axis="y")
    bx.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Controller under a changing load — {doc['machine']['hardware']}, {spec.get('preset') or 'embedded'} model", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- command line ---------------------------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from quickdraft.bench.cli import _ints, add_workload_args

    ap.add_argument("--configs", default=None,
                    help=f"comma list of {','.join(known_configs())} (default: all, less those --statics-from provides)")
    ap.add_argument("--phases", type=_ints, default=list(PHASE_CONCURRENCY), metavar="C,C,...", help="concurrent streams per phase (default 1,8,1)")
    ap.add_argument("--phase-seconds", type=float, default=60.0, help="seconds per phase (default 60)")
    ap.add_argument("--settle-seconds", type=float, default=SETTLE_S, help="left out of each phase's settled figures (default 30)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="target: controller TPOT within this of the best static (default 0.05)")
    ap.add_argument("--controller-warmup", type=float, default=60.0, help="seconds of load before the controller's phase 1 (default 60)")
    ap.add_argument("--controller-profile-dir", metavar="DIR",
                    help="start the controller from the profiles in DIR, e.g. the one `quickdraft tune` wrote (copied into a fresh "
                         "directory under --out; DIR is left as it is). Default: no profile, a cold start")
    ap.add_argument("--statics-from", action="append", default=[], metavar="FILE",
                    help="static configs' figures from an earlier phases.json or sweep.json (repeatable; a config measured in this "
                         "run wins, then the first file that has it)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up requests per server (default 3)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every config this many times, the order reversed every other round; figures pool the rounds, "
                         "and the report shows each round's (default 1)")
    ap.add_argument("--poll-seconds", type=float, default=1.0, help="GetServerInfo poll interval, every server alike (default 1)")
    ap.add_argument("--preset", help="model preset (default embedded)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override for every server (repeatable)")
    add_workload_args(ap)
    # Like with like: no typing cancellations, no chat class (greedy either way).
    ap.set_defaults(cancel_share=0.0, chat_share=0.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/phases"))
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--reanalyse", type=Path, metavar="PHASES_JSON",
                    help="measure nothing: recompute the verdicts, phases.md and phases.png of an earlier run's phases.json into --out")


def spec_from_args(args: argparse.Namespace) -> PhasesSpec:
    from quickdraft.bench.cli import _overrides

    all_labels = list(known_configs())
    if args.configs is None or args.configs == "all":
        configs = all_labels
        if args.statics_from and args.configs is None:
            provided = set()
            for f in args.statics_from:
                provided |= {r["label"] for r in load_statics(Path(f), PhasesSpec(concurrency=list(args.phases), phase_seconds=args.phase_seconds,
                                                                                   settle_s=min(args.settle_seconds, args.phase_seconds / 2)))[0]}
            configs = [c for c in all_labels if c not in provided]
    else:
        configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    return PhasesSpec(configs=configs, concurrency=list(args.phases), phase_seconds=args.phase_seconds, settle_s=args.settle_seconds,
                      tolerance=args.tolerance, warmup_requests=args.warmup, controller_warmup_s=args.controller_warmup,
                      controller_profile_dir=args.controller_profile_dir, statics_from=list(args.statics_from), poll_s=args.poll_seconds,
                      preset=args.preset, overrides=_overrides(args.set), rounds=args.rounds)


def reanalyse(path: Path, out: Path) -> dict:
    """An earlier run's phases.json with its verdicts recomputed by this code (the measurements as
    they were), written with its report into ``out``."""
    doc = json.loads(path.read_text())
    spec = PhasesSpec(**doc["spec"])
    phases = [Phase(**p) for p in doc["phases"]]
    doc["verdicts"] = verdicts(doc["runs"], phases, spec.settle_s, spec.tolerance, spec.seed_config, inline_slo_s(spec))
    v = report.versions()
    doc["notes"] = [*doc.get("notes", []), f"Verdicts recomputed from {path} by quickdraft {v['quickdraft']} ({v['git']})."]
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "phases.json", doc)
    (out / "phases.md").write_text(markdown(doc))
    plot(doc, out / "phases.png")
    return doc


def run(args: argparse.Namespace) -> int:
    from quickdraft.bench.cli import workload_spec

    if args.reanalyse is not None:
        if Path(args.out).resolve() == args.reanalyse.resolve().parent:
            print("quickdraft bench phases: --reanalyse writes into --out; give another folder than the run's own", file=sys.stderr)
            return 2
        reanalyse(args.reanalyse, Path(args.out))
        print((Path(args.out) / "phases.md").read_text())
        return 0
    try:
        spec = spec_from_args(args)
        wspec = workload_spec(args)
        doc = run_bench(spec, wspec, Path(args.out), show_progress=not args.no_progress)
    except ValueError as e:
        print(f"quickdraft bench phases: {e}", file=sys.stderr)
        return 2
    print((Path(args.out) / "phases.md").read_text())
    print(f"quickdraft bench phases: wrote {Path(args.out) / 'phases.json'}, phases.md, phases.png")
    failed = [r["label"] for r in doc["runs"] if r.get("error")]
    if failed:
        print(f"quickdraft bench phases: configs failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quickdraft.bench.controller_phases", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
