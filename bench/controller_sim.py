"""A deterministic simulated engine and a harness that drives the controller
with it on a fake clock, for the controller's tests and the bench gate.

Costs follow the shape the controller's model assumes (verification by
tokens in the batch, K autoregressive drafter passes or one parallel pass),
optionally with a flat region (a GPU's memory-bound regime, which the linear
model does not have) so tests can check robustness to misspecification.
Acceptance is drawn step by step from per-position conditional rates.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from quickdraft.server.config import ControllerSettings
from quickdraft.server.controller import (
    Controller,
    EngineSnapshot,
    LatencyClass,
    Observation,
    run_sweep,
)
from quickdraft.server.controller.measured import Window
from quickdraft.server.speculative import AUTOREGRESSIVE, OFF, PARALLEL, Mode, SpecConfig

ANCHOR_AR_MARGINAL = (0.72, 0.50, 0.33, 0.21, 0.14, 0.09, 0.06)
"""anchors.md: EAGLE-3 per-position acceptance (HumanEval), extended by two positions."""
ANCHOR_PARALLEL_MARGINAL = (0.64, 0.40, 0.25, 0.15, 0.10, 0.065, 0.042)
"""anchors.md: parallel drafting per-position acceptance, extended by two positions."""


def conditional_from_marginal(marginal: Sequence[float]) -> tuple[float, ...]:
    out, prev = [], 1.0
    for m in marginal:
        out.append(m / prev if prev > 0 else 0.0)
        prev = m
    return tuple(out)


@dataclass(frozen=True)
class SimAcceptance:
    """Conditional acceptance per draft position, per mode."""

    autoregressive: tuple[float, ...] = conditional_from_marginal(ANCHOR_AR_MARGINAL)
    parallel: tuple[float, ...] = conditional_from_marginal(ANCHOR_PARALLEL_MARGINAL)

    def rates(self, mode: Mode) -> tuple[float, ...]:
        return self.parallel if mode == PARALLEL else self.autoregressive

    def expected_length(self, mode: Mode, k: int) -> float:
        if mode == OFF or k <= 0:
            return 1.0
        rates = self.rates(mode)
        total, prod = 1.0, 1.0
        for i in range(k):
            prod *= rates[i] if i < len(rates) else rates[-1]
            total += prod
        return total

    @classmethod
    def collapsed(cls) -> "SimAcceptance":
        """A wrong drafter: almost nothing is accepted."""
        return cls((0.02,) * 8, (0.02,) * 8)

    def scaled(self, factor: float) -> "SimAcceptance":
        return SimAcceptance(tuple(min(0.99, r * factor) for r in self.autoregressive),
                             tuple(min(0.99, r * factor) for r in self.parallel))


@dataclass(frozen=True)
class SimCost:
    """Seconds per engine step and per prefill."""

    base_s: float = 0.010
    per_token_s: float = 0.0002
    flat_tokens: int = 0
    """Verified tokens that cost nothing extra (memory-bound region)."""
    ar_pass_s: float = 0.0015
    ar_pass_per_req_s: float = 0.0001
    par_pass_s: float = 0.002
    par_per_slot_s: float = 0.0002
    prefill_s: float = 0.02
    noise: float = 0.08
    """Log-normal sigma of a request's step time (and of its prefill)."""

    def scaled(self, factor: float) -> "SimCost":
        """Every cost times ``factor`` (another workload or machine state), same noise."""
        return replace(self, **{f: getattr(self, f) * factor for f in (
            "base_s", "per_token_s", "ar_pass_s", "ar_pass_per_req_s", "par_pass_s", "par_per_slot_s", "prefill_s")})

    def step(self, mode: Mode, k: int, batch: float) -> float:
        b = max(1.0, batch)
        k = 0 if mode == OFF else k
        tokens = b * (k + 1)
        t = self.base_s + self.per_token_s * max(0.0, tokens - self.flat_tokens)
        if mode == AUTOREGRESSIVE:
            t += k * (self.ar_pass_s + self.ar_pass_per_req_s * b)
        elif mode == PARALLEL:
            t += self.par_pass_s + self.par_per_slot_s * b * k
        return t


# Scenarios with known answers (tests and dry runs) ---------------------------

CROSSING_COST = SimCost(base_s=0.010, per_token_s=0.0005, flat_tokens=8, ar_pass_s=0.0015,
                        ar_pass_per_req_s=0.00005, par_pass_s=0.0015, par_per_slot_s=0.00005)
"""GPU-like: verification is flat up to 8 tokens, so at batch 1 parallel K=7
wins; at batch 8 verifying 64 tokens is dear and K=1-3 win (the cost curves
cross, as in vLLM PR #32887's B200 numbers)."""
CROSSING_ACCEPTANCE = SimAcceptance(
    conditional_from_marginal((0.80, 0.62, 0.48, 0.37, 0.28, 0.21, 0.16)),
    conditional_from_marginal((0.75, 0.55, 0.42, 0.33, 0.26, 0.20, 0.15)),
)
"""Code-completion-like acceptance (higher tails than anchors.md's HumanEval)."""
CPU_COST = SimCost(base_s=0.006, per_token_s=0.0008, ar_pass_s=0.0004, ar_pass_per_req_s=0.0001,
                   par_pass_s=0.0006, par_per_slot_s=0.0004)
"""CPU-like: every verified token costs; with anchors.md acceptance,
autoregressive K=3 wins at batch 1, K=1 at 4-8, no speculation at 16."""


@dataclass
class SimulatedEngine:
    cost: SimCost = field(default_factory=SimCost)
    acceptance: SimAcceptance = field(default_factory=SimAcceptance)
    seed: int = 0
    tokens: tuple[int, int] = (32, 96)
    classes: tuple[LatencyClass, ...] = ("inline", "inline", "inline", "chat")

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def true_tpot(self, config: SpecConfig, batch: float) -> float:
        return self.cost.step(config.mode, config.k, batch) / self.acceptance.expected_length(config.mode, config.k)

    def request_seconds(self, config: SpecConfig, batch: float) -> float:
        """Mean duration of one request (sets how fast requests finish)."""
        return self.cost.prefill_s + sum(self.tokens) / 2 * self.true_tpot(config, batch)

    def true_ttft_p95(self, config: SpecConfig, batch: float) -> float:
        st = self.cost.step(config.mode, config.k, batch)
        return self.cost.prefill_s * math.exp(1.645 * self.cost.noise) + 1.95 * st * math.exp(1.645 * self.cost.noise)

    def best_static(self, configs: Iterable[SpecConfig], batch: float,
                    ttft_limit_s: float | None = None) -> SpecConfig:
        cands = [c for c in configs if ttft_limit_s is None or self.true_ttft_p95(c, batch) <= ttft_limit_s]
        return min(cands, key=lambda c: self.true_tpot(c, batch))

    def requests(self, engine: SpecConfig, batch: float, n: int) -> list[Observation]:
        """``n`` finished requests run at ``batch`` concurrent requests by an
        engine running ``engine`` (its K schedule included)."""
        return [self._one(engine.at(batch), batch) for _ in range(n)]

    def _one(self, cfg: SpecConfig, batch: float) -> Observation:
        rng = self.rng
        mode, k = cfg.mode, cfg.k
        want = rng.randint(*self.tokens)
        rates = self.acceptance.rates(mode) if k else ()
        acc_pos = [0] * k
        generated, drafts = 1, 0
        while generated < want:
            n_acc = 0
            for i in range(k):
                r = rates[i] if i < len(rates) else rates[-1]
                if rng.random() < r:
                    acc_pos[i] += 1
                    n_acc += 1
                else:
                    break
            generated += n_acc + 1
            drafts += 1
        noise = math.exp(rng.gauss(0.0, self.cost.noise))
        step = self.cost.step(mode, k, batch) * noise
        tpot = drafts * step / max(1, generated - 1)
        ttft = self.cost.prefill_s * math.exp(rng.gauss(0.0, self.cost.noise)) + (1.0 + rng.random()) * step
        cls = self.classes[rng.randrange(len(self.classes))]
        return Observation(
            latency_class=cls, ttft_s=ttft, tpot_s=tpot, output_tokens=generated, batch_size=float(batch),
            config=cfg, num_drafts=drafts if k else 0, num_draft_tokens=drafts * k,
            accepted_per_position=acc_pos,
        )


class TraceEngine:
    """Replays recorded observations: a request under (config, batch) is drawn
    (seeded) from those recorded under that config at the nearest recorded
    concurrency. ``true_tpot`` is the recorded median TPOT."""

    def __init__(self, observations: Sequence[Observation], seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self._by: dict[tuple[SpecConfig, float], list[Observation]] = {}
        for o in observations:
            self._by.setdefault((o.config, round(o.batch_size)), []).append(o)
        self.acceptance = None  # phases cannot swap acceptance on a recording

    def _pool(self, config: SpecConfig, batch: float) -> list[Observation]:
        keys = [k for k in self._by if k[0] == config]
        if not keys:
            raise KeyError(f"no recording for {config.label()}")
        key = min(keys, key=lambda k: (abs(math.log(max(1.0, batch) / max(1.0, k[1]))), k[1]))
        return self._by[key]

    def configs(self) -> list[SpecConfig]:
        return sorted({k[0] for k in self._by})

    def true_tpot(self, config: SpecConfig, batch: float) -> float:
        tp = sorted(o.tpot_s for o in self._pool(config, batch))
        return tp[len(tp) // 2]

    def request_seconds(self, config: SpecConfig, batch: float) -> float:
        pool = self._pool(config, batch)
        return sum(o.ttft_s + o.tpot_s * (o.output_tokens - 1) for o in pool) / len(pool)

    def best_static(self, configs: Iterable[SpecConfig], batch: float) -> SpecConfig:
        return min(configs, key=lambda c: self.true_tpot(c, batch))

    def requests(self, engine: SpecConfig, batch: float, n: int) -> list[Observation]:
        cfg = engine.at(batch)
        pool = self._pool(cfg, batch)
        out = []
        for _ in range(n):
            o = pool[self.rng.randrange(len(pool))]
            out.append(Observation(o.latency_class, o.ttft_s, o.tpot_s, o.output_tokens, float(batch), cfg,
                                   o.num_drafts, o.num_draft_tokens, o.accepted_per_position,
                                   o.draft_tokens_per_position, o.accepted_histogram, o.prompt_tokens))
        return out


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@dataclass(frozen=True)
class Phase:
    load: int
    """Concurrent requests."""
    duration_s: float
    kv_cache_usage: float = 0.3
    acceptance: SimAcceptance | None = None
    """Switch the engine's acceptance for this phase (None: keep)."""


@dataclass(frozen=True)
class Tick:
    t: float
    phase: int
    load: int
    config: SpecConfig
    """Config the engine ran at this load."""
    true_tpot_s: float
    best_tpot_s: float
    action: str
    reason: str
    observations: int = 0
    """Requests observed so far (cumulative)."""


@dataclass
class HarnessTrace:
    ticks: list[Tick] = field(default_factory=list)
    decisions: list = field(default_factory=list)
    observations: int = 0

    @property
    def switches(self) -> int:
        return sum(1 for d in self.decisions if d.action != "hold")

    def actions(self, action: str) -> list:
        return [d for d in self.decisions if d.action == action]

    def phase_ticks(self, phase: int) -> list[Tick]:
        return [t for t in self.ticks if t.phase == phase]

    def converged_after(self, phase: int, tolerance: float = 0.05) -> float | None:
        """Seconds from the phase's start until the engine stayed within
        ``tolerance`` of the best static TPOT for the rest of the phase."""
        ts = self.phase_ticks(phase)
        if not ts:
            return None
        last_bad = None
        for t in ts:
            if t.true_tpot_s > t.best_tpot_s * (1 + tolerance):
                last_bad = t
        if last_bad is None:
            return 0.0
        if last_bad is ts[-1]:
            return None
        return last_bad.t - ts[0].t + (ts[1].t - ts[0].t if len(ts) > 1 else 0.0)

    def observations_to_converge(self, phase: int, tolerance: float = 0.05) -> int | None:
        """Requests observed from the phase's start until the engine stayed
        within ``tolerance`` of the best static TPOT for the rest of the phase."""
        ts = self.phase_ticks(phase)
        if not ts:
            return None
        start = ts[0].observations
        bad = [i for i, t in enumerate(ts) if t.true_tpot_s > t.best_tpot_s * (1 + tolerance)]
        if not bad:
            return 0
        if bad[-1] == len(ts) - 1:
            return None
        return ts[bad[-1] + 1].observations - start

    def regret(self, phase: int) -> float:
        """Mean relative TPOT excess over the best static config during a phase."""
        ts = self.phase_ticks(phase)
        return sum(t.true_tpot_s / t.best_tpot_s - 1.0 for t in ts) / max(1, len(ts))


class Harness:
    """Drives a controller against a SimulatedEngine on a fake clock: requests
    finish at the rate the load and the engine's speed allow, snapshots come
    every tick, decide() runs every tick, and a switch takes ``rebuild_s``
    during which the old engine keeps serving (0: a live switch, in effect
    from the next tick). While the controller measures (live settings), each
    tick is also a measurement window: on a SimulatedEngine its step time is
    the true one times log-normal noise of sigma ``window_noise``, and its
    acceptance the engine's rates scaled by log-normal noise of sigma
    ``acceptance_noise`` (the code served in a short window accepts more or
    less than the average); on a TraceEngine only a decode TPOT, the
    recorded median times the ``window_noise``."""

    def __init__(self, controller: Controller, engine: SimulatedEngine | TraceEngine, clock: FakeClock, *,
                 tick_s: float = 1.0, rebuild_s: float = 15.0, decide_every: int = 1,
                 candidates: Sequence[SpecConfig] | None = None,
                 on_decision: Callable | None = None, window_noise: float = 0.04, acceptance_noise: float = 0.1,
                 seed: int = 0) -> None:
        self.ctl = controller
        self.engine = engine
        self.clock = clock
        self.tick_s = tick_s
        self.rebuild_s = rebuild_s
        self.candidates = tuple(candidates or controller.settings.candidates)
        self.on_decision = on_decision
        self.decide_every = decide_every
        self._ticks = 0
        self._running: SpecConfig = controller.active_engine
        self._pending = None
        self._ready_at = 0.0
        self._acc = 0.0
        self.window_noise = window_noise
        self.acceptance_noise = acceptance_noise
        self._rng = random.Random(seed)

    def run(self, phases: Sequence[Phase], trace: HarnessTrace | None = None) -> HarnessTrace:
        trace = trace or HarnessTrace()
        for pi, ph in enumerate(phases):
            if ph.acceptance is not None:
                if not isinstance(self.engine, SimulatedEngine):
                    raise ValueError("only a SimulatedEngine can change acceptance between phases")
                self.engine.acceptance = ph.acceptance
            end = self.clock.t + ph.duration_s
            start_load = phases[pi - 1].load if pi else ph.load
            while self.clock.t < end - 1e-9:
                self.clock.advance(self.tick_s)
                now = self.clock.t
                live = self.rebuild_s <= 0
                if live:
                    self._apply(now)
                cfg = self._running.at(ph.load)
                self._acc += ph.load * self.tick_s / self.engine.request_seconds(cfg, ph.load)
                n = int(self._acc)
                self._acc -= n
                served = self.engine.requests(self._running, ph.load, n)
                for obs in served:
                    self.ctl.observe(obs, now=now)
                trace.observations += n
                self.ctl.observe_engine(EngineSnapshot(running=ph.load, kv_cache_usage=ph.kv_cache_usage), now=now)
                if self.ctl.measuring:
                    self.ctl.observe_window(self._window(cfg, ph.load, start_load, served), now=now)
                    start_load = ph.load
                if not live:
                    self._apply(now)
                self._ticks += 1
                action, reason = "", ""
                if self._ticks % self.decide_every == 0:
                    d = self.ctl.decide(now=now)
                    action, reason = d.action, d.reason
                    if d.action != "hold":
                        self._pending = d
                        self._ready_at = now + self.rebuild_s
                        trace.decisions.append(d)
                    elif not trace.decisions or trace.decisions[-1].reason_code != d.reason_code:
                        trace.decisions.append(d)
                    if self.on_decision is not None:
                        self.on_decision(d)
                best = min(self.engine.true_tpot(c, ph.load) for c in self.candidates)
                if not live:
                    cfg = self._running.at(ph.load)
                trace.ticks.append(Tick(now, pi, ph.load, cfg, self.engine.true_tpot(cfg, ph.load), best,
                                        action, reason, trace.observations))
                if live:
                    self._apply(now)  # a switch within the tick: the next tick runs it
        return trace

    def _window(self, cfg: SpecConfig, load: int, start_load: int, served: list[Observation]) -> Window:
        rng = self._rng
        decode_s = 0.9 * load * self.tick_s  # the rest waits for first tokens
        first = tuple((o.latency_class, o.ttft_s) for o in served)
        if not isinstance(self.engine, SimulatedEngine):
            tpot = self.engine.true_tpot(cfg, load) * math.exp(rng.gauss(0.0, self.window_noise))
            return Window(cfg, self.tick_s, decode_s, max(1, round(decode_s / tpot)), float(load), start_load, load, first)
        step = self.engine.cost.step(cfg.mode, cfg.k, load) * math.exp(rng.gauss(0.0, self.window_noise))
        scale = math.exp(rng.gauss(0.0, self.acceptance_noise))
        rates = self.engine.acceptance.rates(cfg.mode) if cfg.enabled else ()
        marginal, prod = [], 1.0
        for i in range(cfg.k if cfg.enabled else 0):
            prod *= min(0.99, (rates[i] if i < len(rates) else rates[-1]) * scale)
            marginal.append(prod)
        steps = max(1, round(self.tick_s / step))
        drafts = steps * load if cfg.enabled else 0
        tpot = step / (1.0 + sum(marginal))
        return Window(cfg, self.tick_s, decode_s, max(1, round(decode_s / tpot)), float(load), start_load, load, first,
                      drafts=drafts,
                      accepted_per_position=tuple(round(drafts * m) for m in marginal))

    def _apply(self, now: float) -> None:
        if self._pending is not None and now >= self._ready_at:
            d, self._pending = self._pending, None
            self._running = d.engine
            self.ctl.applied(d, now=now, rebuilt=self.rebuild_s > 0)


def calibrated(engine: SimulatedEngine, settings: ControllerSettings | None = None, clock: FakeClock | None = None,
               requests: int = 24, concurrencies: Sequence[int] = (1, 4, 8, 16)) -> tuple[Controller, FakeClock]:
    """A controller fed by a calibration sweep on ``engine`` (as after
    ``quickdraft tune``), on a fake clock; returns (controller, clock)."""
    clock = clock or FakeClock()
    ctl = Controller(settings, clock=clock)
    run_sweep(lambda c, n: engine.requests(c, n, requests), controller=ctl,
              concurrencies=concurrencies, progress=False)
    return ctl, clock
