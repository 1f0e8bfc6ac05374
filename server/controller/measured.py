"""Choosing by measurement where every candidate is a live switch away.

With live switching (server/vllm_live.py) a probe costs one engine step to
switch plus one short window served in the probed config, so the controller
measures the candidates at the load at hand instead of predicting them: the
serving config is measured all the time, every other one in a window of its
own when the load settles at a level where it has no current measurement.
Likely winners are measured first and configs the measurements already rule
out are skipped; then the config with the lowest measured TPOT that meets
the TTFT SLOs serves.

A config's TPOT at a level is its windows' decode TPOT (time between a
stream's outputs over the tokens they carried, every engine step included:
at 8 streams most steps also prefill someone's prompt, and what that costs
depends on the config), with the acceptance luck taken out: the windows'
own mean tokens per step, L, over E[L] from acceptance pooled per drafting
mode over every window (the engine's per-position counters). At one stream
a window serves one or two requests, whose code sets L; the step time under
it is the config's. Where the engine gives no draft counters, the decode
TPOT is used as it is.

What the measurements can rule out rests on one assumption: within a
drafting mode, TPOT as a function of K (K >= 1) has a single minimum. A K on
the far side of a worse measured K, seen from the mode's best measured K, is
then worse still. No speculation is not K=0 of those curves: it skips the
drafter altogether, so going from it to K=1 adds the drafter's fixed cost
(one pass, or one per draft token) at a step, and the curve can fall from
K=1 on and still have its minimum at no speculation, as at 8 streams on a
2-core CPU. It is always measured, and its measurement rules nothing out.

A probe that reads no faster than the level's choice goes back to it. With
``measure.switch_z`` set, another config replaces the choice only when
measured faster beyond the windows' noise (that many standard errors of the
difference): the serving config's figure is renewed window after window,
while the others keep the windows their probes took, the lowest of which
may be a lucky one.

A probe far behind the level's best (``measure.abandon_above``) ends its
window a quarter of the way in, and ends even when the moving load leaves
that window unfiled: one more second of it would not make it the choice,
and at high load each second of it slows every stream.

Measurements at other load levels leave out what is far off: a config
that ran ``measure.prune_above`` slower than the best at the nearest
other level, with its K beyond its mode's best K there in the direction
the load moved (a mode's best K does not rise with load), is not probed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable

from ..config.controller import ControllerSettings
from ..speculative import MAX_K, SpecConfig
from .decision import Verdict, ms, relative_gain
from .estimator import Plan, Prediction
from .policy import Banned


@dataclass(frozen=True)
class Window:
    """What the engine served between two controller ticks, in one config."""

    config: SpecConfig
    """The per-step setting the engine ran throughout."""
    seconds: float
    decode_seconds: float
    """Summed over streams: time between consecutive outputs of a stream."""
    decode_tokens: int
    """Tokens those outputs carried."""
    running: float
    """Mean running requests over the window (time-weighted over engine steps)."""
    running_start: int
    running_end: int
    first_tokens: tuple[tuple[str, float], ...] = ()
    """(latency class, TTFT seconds) of the requests whose first token came in the window."""
    drafts: int = 0
    """Draft sequences verified (one per request per step) ..."""
    accepted_per_position: tuple[int, ...] = ()
    """... and how many were accepted at each draft position."""
    offered: float = 0.0
    """Mean requests in the engine, running or waiting (0: not counted) ..."""
    offered_start: int = 0
    offered_end: int = 0
    """... and at the window's start and end."""
    steps: int = 0
    """Engine steps in the window."""
    prefill_tokens: int = 0
    """Prompt tokens prefilled while other requests ran (0 throughout: not counted)."""

    def to_dict(self) -> dict:
        """The window as JSON-ready values (``controller.observations_file``)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["config"] = self.config.to_dict()
        d["first_tokens"] = [list(x) for x in self.first_tokens]
        d["accepted_per_position"] = list(self.accepted_per_position)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Window":
        """The inverse of ``to_dict``; keys it does not know (an older or newer
        server's) are left out."""
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        return cls(**{**d, "config": SpecConfig.from_dict(d["config"]),
                      "first_tokens": tuple(tuple(x) for x in d.get("first_tokens", ())),
                      "accepted_per_position": tuple(d.get("accepted_per_position", ()))})

    @property
    def accepted(self) -> int:
        """Draft tokens accepted over the window."""
        return sum(self.accepted_per_position)

    @property
    def load(self) -> float:
        """The load the window ran at: the requests offered where counted, else
        those running. Running alone depends on the config: under a closed loop
        a faster config leaves more of each request's life queued for its
        prefill, so it would be filed at a lower level than a slower config
        serving the same streams."""
        return self.offered if self.offered > 0 else self.running

    def stable(self, ratio: float) -> bool:
        """Whether the load held still: requests (offered where counted, else
        running) at the start, at the end and on average within ``ratio`` of each other."""
        counts = (self.offered_start, self.offered_end, self.offered) if self.offered > 0 else \
            (self.running_start, self.running_end, self.running)
        vals = [max(1.0, float(v)) for v in counts]
        return max(vals) / min(vals) <= ratio


@dataclass
class Cell:
    """Measurements of one config at one load level."""

    windows: deque = field(default_factory=deque)
    """(time, decode seconds, decode tokens, drafts, accepted, prompt tokens
    prefilled beside decoding streams), newest last."""
    ttft: dict[str, deque] = field(default_factory=dict)
    """Recent TTFTs per latency class."""

    def add(self, w: Window, now: float, keep: int, ttft_keep: int, stale_before: float = -math.inf) -> None:
        """File ``w``; windows from before ``stale_before`` go: a config measured
        again is measured afresh, not averaged with what no longer counts."""
        while self.windows and self.windows[0][0] < stale_before:
            self.windows.popleft()
        self.windows.append((now, w.decode_seconds, w.decode_tokens, w.drafts, w.accepted, w.prefill_tokens))
        while len(self.windows) > keep:
            self.windows.popleft()
        for cls, t in w.first_tokens:
            self.ttft.setdefault(cls, deque(maxlen=ttft_keep)).append(t)

    @property
    def decode_tpot_s(self) -> float:
        """Token-weighted decode TPOT over the windows."""
        return sum(w[1] for w in self.windows) / max(1, sum(w[2] for w in self.windows))

    @property
    def prefill_rate(self) -> float:
        """Prompt tokens prefilled beside decoding streams per decode token, over the windows."""
        return sum(w[5] for w in self.windows) / max(1, sum(w[2] for w in self.windows))

    def prefill_moments(self) -> tuple[float, float, float]:
        """Token-weighted (sum of q·t, sum of q², degrees of freedom) of the
        windows' decode TPOT t against their prefill rate q, each about the
        cell's mean: one cell's share of a level's pooled slope."""
        ws = [(w[5] / w[2], w[1] / w[2], w[2]) for w in self.windows if w[2] > 0]
        total = sum(n for _q, _t, n in ws)
        if len(ws) < 2 or not total:
            return 0.0, 0.0, 0.0
        qm = sum(q * n for q, _t, n in ws) / total
        tm = sum(t * n for _q, t, n in ws) / total
        return (sum(n * (q - qm) * (t - tm) for q, t, n in ws), sum(n * (q - qm) ** 2 for q, _t, n in ws),
                float(len(ws) - 1))

    @property
    def tokens_per_step(self) -> float | None:
        """Mean tokens a request got per step over the windows whose drafts
        were counted (None: none were)."""
        drafts = sum(w[3] for w in self.windows)
        return 1.0 + sum(w[4] for w in self.windows) / drafts if drafts else None

    def log_deviations(self, slope: float = 0.0, rate: float = 0.0) -> tuple[float, int]:
        """(sum of squared deviations of the windows' log decode TPOT from
        their mean, degrees of freedom): one cell's share of a level's spread.
        Each window's own acceptance is taken out (TPOT times its tokens per
        step) and its arrivals (``slope`` times its prefill rate's distance
        from ``rate``), as ``MeasuredPolicy.tpot`` takes them out of the cell's mean."""
        xs = [w[1] / w[2] * (1.0 + w[4] / w[3] if w[3] else 1.0) + slope * (rate - w[5] / w[2])
              for w in self.windows if w[1] > 0 and w[2] > 0]
        xs = [math.log(x) for x in xs if x > 0]
        if len(xs) < 2:
            return 0.0, 0
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs), len(xs) - 1

    @property
    def measured_at(self) -> float:
        return self.windows[-1][0] if self.windows else -math.inf

    def ttft_quantile(self, cls: str, q: float, min_samples: int) -> float | None:
        xs = sorted(self.ttft.get(cls, ()))
        if len(xs) < min_samples:
            return None
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def ttft_over(self, cls: str, limit: float) -> tuple[int, int]:
        """(requests of ``cls`` over ``limit``, requests of ``cls``)."""
        xs = self.ttft.get(cls, ())
        return sum(1 for t in xs if t > limit), len(xs)


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) * p ** i * (1.0 - p) ** (n - i) for i in range(k, n + 1))


class Measurements:
    """Cells by (load level, config). A level is a band of requests offered
    (``Window.load``), ``levels_per_doubling`` per doubling."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.cells: dict[tuple[int, SpecConfig], Cell] = {}

    def position(self, load: float) -> float:
        return self.settings.measure.levels_per_doubling * math.log2(max(1.0, load))

    def level(self, load: float, previous: int | None = None) -> int:
        """The level of ``load`` requests; a load that has not reached the
        middle of another level stays in the ``previous`` one. A closed loop
        of 8 streams offers 6 to 7.4 requests (between a stream's requests
        none is out), right on the edge between 5.7 and 8: with a narrower
        band one window past the edge moved the level and every config was
        measured again there."""
        pos = self.position(load)
        if previous is not None and abs(pos - previous) < 1.0:
            return previous
        return round(pos)

    def levels_near(self, level: int, *, others_only: bool = False) -> list[int]:
        """Levels with measurements, nearest to ``level`` first."""
        levels = {lvl for (lvl, _c) in self.cells if not (others_only and lvl == level)}
        return sorted(levels, key=lambda lvl: abs(lvl - level))

    def load_of(self, level: int) -> float:
        return 2.0 ** (level / self.settings.measure.levels_per_doubling)

    def add(self, w: Window, now: float, previous: int | None = None) -> int:
        lvl = self.level(w.load, previous)
        cell = self.cells.setdefault((lvl, w.config), Cell())
        m = self.settings.measure
        cell.add(w, now, m.windows_kept, self.settings.slo.window, stale_before=now - m.stale_s)
        return lvl

    def get(self, level: int, config: SpecConfig) -> Cell | None:
        return self.cells.get((level, config))

    def spread(self, level: int) -> float | None:
        """Standard deviation of one window's log decode TPOT at ``level``,
        pooled over its configs (the load's own noise: prompts arriving,
        requests finishing); None before two windows of one config."""
        ss, df = 0.0, 0
        slope, rate = self.prefill_slope(level), self.prefill_rate(level)
        for (lvl, _c), cell in self.cells.items():
            if lvl == level:
                s, d = cell.log_deviations(slope, rate)
                ss, df = ss + s, df + d
        return math.sqrt(ss / df) if df else None

    MIN_SLOPE_DF = 4
    """Degrees of freedom (windows beyond each cell's first, over the level's
    cells) before a level's prefill slope counts."""

    def prefill_rate(self, level: int) -> float:
        """Prompt tokens prefilled beside decoding streams per decode token,
        over every window at ``level``, whichever config served it: the
        workload's, not a config's (prompts over completions, less what the
        prefix cache holds)."""
        prefilled = decoded = 0
        for (lvl, _c), cell in self.cells.items():
            if lvl == level:
                prefilled += sum(w[5] for w in cell.windows)
                decoded += sum(w[2] for w in cell.windows)
        return prefilled / decoded if decoded else 0.0

    def prefill_slope(self, level: int) -> float:
        """What one more prompt token prefilled per decode token adds to a
        window's decode TPOT at ``level``: the slope of TPOT on prefill rate
        within each config's windows, pooled over the level's configs (a
        config's own windows are too few for a slope of its own). 0 while
        ``measure.prefill_adjust`` is off, before ``MIN_SLOPE_DF`` windows
        say anything, or where the windows say it costs nothing."""
        if not self.settings.measure.prefill_adjust:
            return 0.0
        sxy = sxx = df = 0.0
        for (lvl, _c), cell in self.cells.items():
            if lvl == level:
                xy, xx, d = cell.prefill_moments()
                sxy, sxx, df = sxy + xy, sxx + xx, df + d
        return max(0.0, sxy / sxx) if df >= self.MIN_SLOPE_DF and sxx > 0 else 0.0

    def fresh(self, level: int, now: float) -> dict[SpecConfig, Cell]:
        stale_s = self.settings.measure.stale_s
        return {c: cell for (lvl, c), cell in self.cells.items() if lvl == level and now - cell.measured_at <= stale_s}

    def stale(self, level: int, now: float) -> dict[SpecConfig, Cell]:
        """Cells at ``level`` too old to count, but recent enough to say
        whether the config is worth measuring again."""
        stale_s = self.settings.measure.stale_s
        return {c: cell for (lvl, c), cell in self.cells.items()
                if lvl == level and stale_s < now - cell.measured_at <= 4 * stale_s}

    # -- profiles -------------------------------------------------------------
    def to_list(self, tpot: Callable[[SpecConfig, Cell, int], float]) -> list[dict]:
        return [{"level": lvl, "config": c.to_dict(), "tpot_s": tpot(c, cell, lvl),
                 "tokens": sum(w[2] for w in cell.windows)}
                for (lvl, c), cell in sorted(self.cells.items()) if cell.windows]

    def load_list(self, items: Iterable[dict], now: float) -> None:
        """Restore saved cells as stale ones: they order the first probes, and
        every config is measured again before it is chosen."""
        old = now - self.settings.measure.stale_s - 1.0
        for it in items:
            tokens = max(1, int(it["tokens"]))
            cell = Cell(deque([(old, float(it["tpot_s"]) * tokens, tokens, 0, 0, 0)]))
            self.cells[(int(it["level"]), SpecConfig.from_dict(it["config"]))] = cell


class AcceptancePool:
    """Per drafting mode and draft position: drafts that reached the position
    and were accepted there, over every window, old windows decaying."""

    MIN_TRIALS = 20.0
    """Drafts a position needs before its rate counts; beyond, the last rate carries on."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self.succ = {p: [0.0] * MAX_K for p in (False, True)}
        self.trials = {p: [0.0] * MAX_K for p in (False, True)}

    def add(self, w: Window) -> None:
        c = w.config
        if not c.enabled or w.drafts <= 0 or not w.accepted_per_position:
            return
        succ, trials = self.succ[c.parallel], self.trials[c.parallel]
        reached = float(w.drafts)
        for i in range(min(c.k, len(w.accepted_per_position), MAX_K)):
            accepted = float(min(w.accepted_per_position[i], reached))
            succ[i] = succ[i] * self.decay + accepted
            trials[i] = trials[i] * self.decay + reached
            reached = accepted

    def expected_length(self, config: SpecConfig) -> float | None:
        """E[L] = 1 + sum over i <= K of the product of conditional rates to i;
        None before position 1 has data."""
        if not config.enabled:
            return 1.0
        succ, trials = self.succ[config.parallel], self.trials[config.parallel]
        total, prod, rate = 1.0, 1.0, None
        for i in range(min(config.k, MAX_K)):
            if trials[i] >= self.MIN_TRIALS:
                rate = succ[i] / trials[i]
            elif rate is None:
                return None
            prod *= rate
            total += prod
        return total

    def forget(self, keep: float) -> None:
        """Scale every count by ``keep``: after an acceptance shift, the
        windows that follow set E[L] within a few windows."""
        for counts in (*self.succ.values(), *self.trials.values()):
            counts[:] = [v * keep for v in counts]


def mode_curve(config: SpecConfig, measured: dict[SpecConfig, float]) -> dict[int, float]:
    """TPOT by K of the measured configs in ``config``'s drafting mode."""
    return {c.k: t for c, t in measured.items() if c.enabled and c.parallel == config.parallel}


def bound_beyond(config: SpecConfig, measured: dict[SpecConfig, float], margin: float = 0.0) -> float | None:
    """Under a single-minimum TPOT curve over K within ``config``'s drafting
    mode, a lower bound on its TPOT: the slowest measured K of the mode
    between it and the mode's best, where that is more than ``margin``
    slower than the best (a window's own noise: within it, which of two Ks
    is the slower is not known); None where the curve says nothing of ``config``."""
    if not config.enabled:
        return None
    curve = mode_curve(config, measured)
    if len(curve) < 2:
        return None
    k_best = min(curve, key=curve.__getitem__)
    lo, hi = sorted((config.k, k_best))
    between = [t for k, t in curve.items() if lo < k < hi]
    return max(between) if between and max(between) > curve[k_best] * (1.0 + margin) else None


def ruled_out(config: SpecConfig, measured: dict[SpecConfig, float], margin: float = 0.0) -> bool:
    """Whether a single-minimum TPOT curve over K within ``config``'s drafting
    mode makes it slower than a measured config of that mode (by more than ``margin``)."""
    return bound_beyond(config, measured, margin) is not None


class MeasuredPolicy:
    """Probe what is not measured at the current level, then serve the fastest measured."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.table = Measurements(settings)
        self.acceptance = AcceptancePool()
        self.level: int | None = None
        """Level of the last usable window; None while the load moves."""
        self.active: SpecConfig | None = None
        """The config the last window ran."""
        self._last_level: int | None = None
        self._last_tpot: float | None = None
        """Decode TPOT of the last window that decoded anything, usable or not."""
        self._new_window = False
        self._chosen: dict[int, SpecConfig] = {}
        """The config chosen at each level (not a probe): a probe no faster goes
        back to it, and with ``measure.switch_z`` it stays until another is
        measured faster beyond the windows' noise."""
        self._abandoned: dict[tuple[int, SpecConfig], float] = {}
        """(level, config) -> when a probe of it was left far behind in a window
        the moving load discarded: not probed there again for ``stale_s``."""
        self.windows = 0
        self.discarded = 0
        self.probes = 0

    def observe(self, w: Window, now: float) -> None:
        """A finished window. One whose load moved, or that decoded nothing,
        is discarded and leaves the level unknown until the next."""
        self.active = w.config
        self._new_window = True
        self._last_tpot = w.decode_seconds / w.decode_tokens if w.decode_tokens > 0 else None
        if w.decode_tokens <= 0 or w.running <= 0 or not w.stable(self.settings.measure.stable_ratio):
            self.discarded += 1
            self.level = None
            return
        self.windows += 1
        self.acceptance.add(w)
        self.level = self._last_level = self.table.add(w, now, self._last_level)

    def tpot(self, config: SpecConfig, cell: Cell, level: int) -> float:
        """The windows' decode TPOT at pooled rather than their own acceptance,
        and at the level's prefill rate rather than the arrivals the windows
        caught (``measure.prefill_adjust``)."""
        own = cell.tokens_per_step if config.enabled else None
        pooled = self.acceptance.expected_length(config) if own is not None else None
        tpot = cell.decode_tpot_s * own / pooled if own is not None and pooled else cell.decode_tpot_s
        slope = self.table.prefill_slope(level)
        return tpot + slope * (self.table.prefill_rate(level) - cell.prefill_rate) if slope else tpot

    def slo_excess(self, cell: Cell | None) -> float:
        """Measured TTFT quantile over its limit, the worst class (0: unknown).
        Above 1 only where the limit is broken beyond chance (``slo.significance``):
        otherwise the config is taken to meet it and the ratio is capped at 1."""
        if cell is None:
            return 0.0
        slo = self.settings.slo
        worst = 0.0
        for cls, limit in slo.ttft_s.items():
            q = cell.ttft_quantile(cls, slo.quantile, slo.min_samples)
            if q is None:
                continue
            over, n = cell.ttft_over(cls, limit)
            broken = binomial_tail(n, over, 1.0 - slo.quantile) <= slo.significance
            worst = max(worst, q / limit if broken else min(1.0, q / limit))
        return worst

    def judge(self, now: float, banned: Banned) -> Verdict:
        """Hold, probe the next unmeasured config, or switch to the fastest
        measured one; acts once per window (a move waits for the next)."""
        lvl, active = self.level, self.active
        if not self._new_window or active is None:
            return Verdict.hold("measuring", "measuring: waiting for a window")
        self._new_window = False
        if lvl is None:
            return self._leave_probe(active, now) or \
                Verdict.hold("load_moving", "measuring: the load moved during the last window")
        load = self.table.load_of(lvl)
        fresh = self.table.fresh(lvl, now)
        if active not in fresh:
            return Verdict.hold("measuring", f"measuring {active.label()} at load {load:.1f}")
        candidates = [c for c in self.settings.candidates if not banned(c)]
        tpot = {c: self.tpot(c, cell, lvl) for c, cell in fresh.items() if c in candidates or c == active}
        # Stale values still rule configs out, but only fresh ones are chosen.
        stale = {c: self.tpot(c, cell, lvl) for c, cell in self.table.stale(lvl, now).items() if c in candidates}
        known = {**stale, **tpot}
        limit = min(tpot.values()) * (1.0 + self.settings.measure.refresh_within)
        unmeasured = [c for c in candidates if c not in tpot and stale.get(c, 0.0) <= limit
                      and not ruled_out(c, known, self.settings.measure.confirm_within)
                      and not self._far_off(c, lvl, stale)
                      and now - self._abandoned.get((lvl, c), -math.inf) > self.settings.measure.stale_s]
        if unmeasured:
            nxt = min(unmeasured, key=lambda c: self._probe_order(c, lvl, active))
            self.probes += 1
            left = len(unmeasured) - 1
            return Verdict("explore", "probe",
                           f"measuring {nxt.label()} at load {load:.1f} ({left} more to measure; "
                           f"{active.label()} measured {ms(tpot[active])})",
                           self.plan(nxt, lvl, None), 0.0)

        def rank(c: SpecConfig) -> tuple[float, float]:
            excess = self.slo_excess(fresh.get(c))
            return (0.0 if excess <= 1.0 else excess, tpot[c])

        best = min(tpot, key=rank)
        # One window can be lucky or unlucky: near-ties get a second one.
        near = tpot[best] * (1.0 + self.settings.measure.confirm_within)
        unsure = [c for c in tpot if c != active and tpot[c] <= near and len(fresh[c].windows) < 2
                  and self.slo_excess(fresh[c]) <= 1.0]
        if unsure:
            nxt = min(unsure, key=tpot.__getitem__)
            self.probes += 1
            return Verdict("explore", "probe",
                           f"measuring {nxt.label()} again at load {load:.1f}: {ms(tpot[nxt])} in one window, "
                           f"near the best {best.label()} ({ms(tpot[best])})", self.plan(nxt, lvl, tpot[nxt]), 0.0)
        measured = f"{len(tpot)} configs measured at load {load:.1f}"
        kept = self._keep_choice(lvl, active, best, tpot, fresh, rank, measured)
        if kept is not None:
            return kept
        a_tpot, b_tpot = tpot[active], tpot[best]
        gain = relative_gain(a_tpot, b_tpot)
        a_excess, b_excess = self.slo_excess(fresh[active]), self.slo_excess(fresh[best])
        slo_fix = a_excess > 1.0 + self.settings.hysteresis.slo_margin and b_excess <= 1.0
        if best != active and (slo_fix or gain >= self.settings.measure.margin):
            why = (f"{best.label()} meets the TTFT SLO (measured) and {active.label()} does not"
                   if slo_fix else f"{best.label()} measured {gain:.0%} faster than {active.label()} "
                   f"({ms(b_tpot)} vs {ms(a_tpot)})")
            self._chosen[lvl] = best
            return Verdict("switch", "slo" if slo_fix else "better", f"{why}; {measured}",
                           self.plan(best, lvl, b_tpot, b_excess), gain)
        self._chosen[lvl] = active
        return Verdict.hold("best", f"{active.label()} is the fastest measured ({ms(a_tpot)}); {measured}")

    def _keep_choice(self, lvl: int, active: SpecConfig, best: SpecConfig, tpot: dict[SpecConfig, float],
                     fresh: dict[SpecConfig, Cell], rank: Callable, measured: str) -> Verdict | None:
        """Where the level has a choice that meets the SLOs and ``best`` (the
        fastest measured) is not faster beyond the windows' noise (0 with
        ``switch_z`` off: ``best`` is the choice itself): hold it, or go back
        to it from a probe. None: the plain rule decides (no choice yet,
        ``best`` faster beyond the noise, or the choice misses an SLO)."""
        chosen = self._chosen.get(lvl)
        if chosen not in tpot or rank(chosen)[0] > 0.0:
            return None
        why = ""
        if best != chosen:
            noise = self._noise(lvl, fresh[chosen], fresh[best])
            if rank(best)[0] > 0.0 or math.log(tpot[chosen] / tpot[best]) > noise:
                return None
            n = len(fresh[best].windows)
            why = (f"{best.label()} measured {relative_gain(tpot[chosen], tpot[best]):.0%} faster in {n} "
                   f"window{'s' if n > 1 else ''} ({ms(tpot[best])} vs {ms(tpot[chosen])}), within the windows' "
                   f"noise ({math.expm1(noise):.0%})")
        if active == chosen:
            return Verdict.hold("best", f"{chosen.label()} stays ({ms(tpot[chosen])})"
                                + (f": {why}" if why else ", the fastest measured") + f"; {measured}")
        slo = rank(active)[0] > 0.0
        if slo:
            why = f"{chosen.label()} meets the TTFT SLO (measured) and {active.label()} does not"
        return Verdict("switch", "slo" if slo else "back",
                       f"back to {chosen.label()} ({ms(tpot[chosen])}) from {active.label()} ({ms(tpot[active])})"
                       + (f": {why}" if why else "") + f"; {measured}", self.plan(chosen, lvl, tpot[chosen]), 0.0)

    def _noise(self, level: int, a: Cell, b: Cell) -> float:
        """``measure.switch_z`` standard errors of the log difference between
        two cells' TPOT (0 before the level has a spread: the margin decides)."""
        z = self.settings.measure.switch_z
        spread = self.table.spread(level) if z > 0 else None  # every cell of the level: skip it when off
        if spread is None:
            return 0.0
        return z * spread * math.sqrt(1.0 / max(1, len(a.windows)) + 1.0 / max(1, len(b.windows)))

    def _leave_probe(self, active: SpecConfig, now: float) -> Verdict | None:
        """Back to the best config of the last usable level from a probe whose
        window, discarded because the load moved, ran past ``abandon_above``:
        such a window files nothing, but it says the probe is far behind, and
        holding until the load settles would serve in it window after window."""
        base = self._probe_baseline(active, now)
        if base is None or self._last_tpot is None or self._last_tpot <= self._ceiling(base[2]):
            return None
        lvl, best, cell = base
        best_tpot = self.tpot(best, cell, lvl)
        # Its window files nothing, so without this the probe would be taken
        # again at the next usable window, and abandoned again.
        self._abandoned[(lvl, active)] = now
        return Verdict("switch", "probe_abandoned",
                       f"{active.label()} ran {ms(self._last_tpot)} in a window the moving load left unfiled, over "
                       f"{self.settings.measure.abandon_above:.0%} behind {best.label()} ({ms(best_tpot)}) at load "
                       f"{self.table.load_of(lvl):.1f}: back to it", self.plan(best, lvl, best_tpot), 0.0)

    def _probe_order(self, c: SpecConfig, level: int, active: SpecConfig) -> tuple[float, float]:
        """Likely winners first: by the config's TPOT relative to the best at
        the nearest level where both were measured (stale values count here),
        else by distance in K from the serving config. No speculation comes
        last: where it skips the drafter's pass, the requests in flight when
        drafting resumes draft from holes in the drafter's KV, which costs
        every stream a slow window; measured last, it is left at most once."""
        if not c.enabled:
            return (2.0, 0.0)
        relative = self._relative(c, level)
        if relative is not None:
            return (0.0, relative)
        return (1.0, abs(c.k - (active.k if active.enabled else 0)) + (0.5 if c.parallel != active.parallel else 0.0))

    def _relative(self, c: SpecConfig, level: int) -> float | None:
        """``c``'s TPOT over the best config's at the nearest level where ``c``
        was measured (stale values count); None where it never was."""
        for lvl in self.table.levels_near(level):
            measured = self._at(lvl)
            if c in measured:
                return measured[c] / min(measured.values())
        return None

    def _at(self, level: int) -> dict[SpecConfig, float]:
        """TPOT of every config measured at ``level``, stale ones included."""
        return {c: self.tpot(c, x, level) for (lvl, c), x in self.table.cells.items() if lvl == level and x.windows}

    def _far_off(self, c: SpecConfig, level: int, stale: dict[SpecConfig, float]) -> bool:
        """Whether a config not measured at ``level`` is left unprobed there.

        At the nearest other level that says something of ``c`` (its own
        measurement, or, where the single-minimum rule rules it out there,
        the slowest of its mode's measured Ks between it and the mode's best:
        a lower bound), ``c`` ran more than ``measure.prune_above`` slower
        than that level's best, and it lies beyond its mode's best K there
        in the direction the load moved: a larger K where the load is now
        higher, a smaller one where lower. More load makes each drafted and
        verified token relatively dearer, so a mode's best K does not rise
        with load, and such a config is beaten by a K of its own mode that
        is probed anyway. A probe of a far-off config costs most at high
        load, where windows last longest. No speculation is always probed
        (it is on no K curve), and a stale measurement at this level decides
        by itself."""
        if not c.enabled or c in stale:
            return False
        for lvl in self.table.levels_near(level, others_only=True):
            measured = self._at(lvl)
            tpot = measured[c] if c in measured else bound_beyond(c, measured, self.settings.measure.confirm_within)
            if tpot is None:
                continue
            curve = mode_curve(c, measured)
            k_best = min(curve, key=curve.__getitem__)
            beyond = c.k > k_best if level > lvl else c.k < k_best
            return beyond and tpot > min(measured.values()) * (1.0 + self.settings.measure.prune_above)
        return False

    def _probe_baseline(self, serving: SpecConfig, now: float) -> tuple[int, SpecConfig, Cell] | None:
        """While ``serving`` is a probe (no fresh measurement of its own at the
        level): (level, the best config measured fresh there, its cell). While
        the load moves, the level of the last usable window stands in."""
        lvl = self.level if self.level is not None else self._last_level
        if lvl is None:
            return None
        fresh = self.table.fresh(lvl, now)
        if serving in fresh or not fresh:
            return None
        best = min(fresh, key=lambda c: self.tpot(c, fresh[c], lvl))
        return lvl, best, fresh[best]

    def abandon_above(self, serving: SpecConfig, now: float) -> float | None:
        """While ``serving`` is a probe, the decode TPOT above which its open
        window may end early: ``measure.abandon_above`` over the decode TPOT
        of the best fresh measurement at the level (``_probe_baseline``). A
        probe that far behind is not chosen on one more second of evidence,
        and at high load a full window costs every stream seconds in a slow
        config. None: let the window run."""
        base = self._probe_baseline(serving, now)
        return None if base is None else self._ceiling(base[2])

    def _ceiling(self, best: Cell) -> float:
        return best.decode_tpot_s * (1.0 + self.settings.measure.abandon_above)

    def active_plan(self, now: float) -> Plan | None:
        """The serving config's plan from its measurement at the current level."""
        if self.level is None or self.active is None:
            return None
        cell = self.table.fresh(self.level, now).get(self.active)
        return None if cell is None else self.plan(self.active, self.level, self.tpot(self.active, cell, self.level),
                                                   self.slo_excess(cell))

    def plan(self, config: SpecConfig, level: int, tpot_s: float | None, excess: float = 0.0) -> Plan:
        load = self.table.load_of(level)
        pred = Prediction(config, load, None, 1.0, 1.0, 1.0, tpot_s, slo_excess=excess)
        return Plan(config, pred)
