"""The phases back to back, the tasks each phase's requests send, and the
timing each request leaves (what the analysis reads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from quickdraft.bench.loadgen import Result
from quickdraft.bench.sweep import SweepConfig, all_configs

PHASE_CONCURRENCY = (1, 8, 1)
SETTLE_S = 30.0
TOLERANCE = 0.05
SEED_CONFIG = "p5"  # the seed's fixed config: P-EAGLE K=5
STATIC_MODES = ("off", "autoregressive", "parallel")


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
    config: str | None = None  # a TOML file for every server (quickdraft serve --config)
    overrides: dict[str, str] = field(default_factory=dict)
    # Rounds: every config measured this many times, the order reversed every
    # other round (so a slow drift of the machine hits all alike); the verdicts
    # pool each config's requests over its rounds and show each round's figure.
    rounds: int = 1
    # One live-switching server for every config: statics pinned in turn, then
    # the controller (bench/phases/shared.py). False: a fresh server per config.
    one_server: bool = False
    # Whose clock times each request's first token and decoding: "client" (when
    # the load generator received the first text and the last), or "server"
    # (the server's own figures: its first and last generated token, from the
    # final message). The server's clock leaves out text the server holds back,
    # as the detokenizer does for partial characters: random weights (the GPU
    # runs) write such tokens, and the client-side figure then moves by config.
    clock: str = "client"

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
        if self.clock not in ("client", "server"):
            raise ValueError(f"--clock {self.clock!r}: use client or server")
        if not 1 <= self.rounds <= 10:
            raise ValueError(f"--rounds {self.rounds}: must be within 1..10")


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


def streams(c: int) -> str:
    return f"{c} stream{'s' if c != 1 else ''}"
