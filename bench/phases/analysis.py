"""The verdicts: per phase, the controller's TPOT against the best static
config's (and the best that met the TTFT SLO), and the targets."""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

from quickdraft.bench.phases.rebuilds import combine_accounting, rebuild_accounting
from quickdraft.bench.phases.timeline import SEED_CONFIG, STATIC_MODES, Phase, Req, reqs_of, window_tpot_ms
from quickdraft.bench.stats import percentile


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


def reached_within(ctl: tuple[dict, list[Req] | None], statics, phase: Phase, tolerance: float,
                   best_at: Callable[[float], float | None] | None = None) -> float | None:
    """The first offset t (on ``grid``) at which the controller's TPOT over the
    rest of the phase is within ``tolerance`` of the best static's over the same window
    (``best_at(t)``: that figure; default the minimum of the statics')."""
    for t in grid(phase):
        c = tpot_in(ctl[0], phase, t, ctl[1])
        b = best_at(t) if best_at is not None else best_static(statics, phase, t)[1]
        if c is not None and b is not None and c <= (1 + tolerance) * b:
            return t
    return None


def regret_interval(ctl: list[Req] | None, best: list[Req] | None, phase: Phase, t_from: float,
                    resamples: int = 1000, seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of controller / best static − 1 over the requests
    that started ``t_from`` s or more into ``phase``, each side's requests
    resampled on their own. At one stream a settled window holds a few dozen
    requests whose TPOT varies with what each accepted, so the interval says
    what regret a phase of this length can resolve at all."""
    def sample(reqs: list[Req] | None) -> list[tuple[float, int]]:
        return [(r.decode_s, r.decode_tokens) for r in reqs or ()
                if r.decode_tokens and phase.start_s + t_from <= r.start_s < phase.end_s]
    c, b = sample(ctl), sample(best)
    if len(c) < 5 or len(b) < 5:
        return None
    rng = random.Random(seed)

    def tpot(xs: list[tuple[float, int]]) -> float:
        draw = rng.choices(xs, k=len(xs))
        return sum(d for d, _ in draw) / sum(n for _, n in draw)
    regrets = sorted(tpot(c) / tpot(b) - 1 for _ in range(resamples))
    return round(regrets[int(0.025 * resamples)], 4), round(regrets[int(0.975 * resamples) - 1], 4)


# --- cross-fitting: the best static picked on some rounds, measured on the others --------------
# The plain best static is the minimum of the statics' noisy figures, picked and measured on the
# same requests: it takes the luckiest draw, so it comes out low and the regret high (the more
# so, the noisier the figures: short phases, many statics). With two or more rounds the pick and
# the measurement can use different rounds, which makes the measurement independent of the pick.

RoundReqs = dict[str, dict[int, list[Req]]]  # static label -> round -> that round's requests
Sums = dict[str, dict[int, tuple[float, int]]]  # static label -> round -> (decode s, decode tokens)


def rounds_of_statics(groups: Sequence[tuple[dict, list[Req] | None, "Rounds"]]) -> tuple[RoundReqs | None, str]:
    """Every static's requests per round, to cross-fit on; None and why not, unless every static
    has per-request timings in the same two or more rounds (a static missing from a round
    could not be picked there, which would bias the pick)."""
    out: RoundReqs = {}
    for first, _, rounds in groups:
        per: dict[int, list[Req]] = {}
        for run, reqs in rounds:
            if reqs is None:
                return None, f"{first['label']} has figures only, no per-request timings"
            per.setdefault(int(run.get("round") or 1), []).extend(reqs)
        out[first["label"]] = per
    keys = {tuple(sorted(per)) for per in out.values()}
    if not out:
        return None, "no static configs"
    if len(keys) > 1:
        return None, "the statics were not all measured in the same rounds"
    if len(next(iter(keys))) < 2:
        return None, "one round"
    return out, ""


def window_sums(reqs: Sequence[Req], phase: Phase, t_from: float) -> tuple[float, int]:
    """Decode seconds and decode tokens of the requests that started ``t_from`` s or more into ``phase``."""
    xs = [r for r in reqs if r.decode_tokens and phase.start_s + t_from <= r.start_s < phase.end_s]
    return sum(r.decode_s for r in xs), sum(r.decode_tokens for r in xs)


def crossfit(sums: Sums, allowed: Callable[[str, int], bool] | None = None) -> tuple[float | None, dict[int, str]]:
    """The cross-fitted best static's TPOT (ms) and its pick per held-out round: for each round r,
    the static with the lowest TPOT pooled over the other rounds (among those ``allowed(label, r)``),
    measured on round r alone; token-weighted over the rounds like every figure here, so a pick
    that is the same in every round gives that static's pooled TPOT."""
    rounds = sorted({q for per in sums.values() for q in per})
    d = n = 0.0
    picks: dict[int, str] = {}
    for r in rounds:
        best, best_v = None, math.inf
        for label, per in sums.items():
            if allowed is not None and not allowed(label, r):
                continue
            sd, sn = sum(x[0] for q, x in per.items() if q != r), sum(x[1] for q, x in per.items() if q != r)
            if sn and sd / sn < best_v:
                best, best_v = label, sd / sn
        if best is None or not sums[best].get(r, (0.0, 0))[1]:
            continue  # nothing to pick, or the pick has nothing in the held-out round
        picks[r] = best
        d, n = d + sums[best][r][0], n + sums[best][r][1]
    return (1000.0 * d / n if n else None), picks


def feasible_on_other_rounds(rounds: RoundReqs, phase: Phase, t_from: float, ttft_slo_s: float) -> Callable[[str, int], bool]:
    """``allowed`` for ``crossfit``: the static met the TTFT SLO (p95, as in ``verdicts``) on the
    rounds it is picked on; the SLO check is part of the pick, so it too leaves out the held-out round."""
    def ok(label: str, r: int) -> bool:
        p95 = ttft_p95_in({}, phase, t_from, [x for q, rs in rounds[label].items() if q != r for x in rs])
        return p95 is not None and p95 <= ttft_slo_s
    return ok


def crossfit_sums(rounds: RoundReqs, phase: Phase, t_from: float) -> Sums:
    return {label: {q: window_sums(rs, phase, t_from) for q, rs in per.items()} for label, per in rounds.items()}


def crossfit_regret_interval(ctl: list[Req] | None, rounds: RoundReqs, phase: Phase, t_from: float,
                             resamples: int = 1000, seed: int = 0) -> tuple[float, float] | None:
    """95% bootstrap interval of controller / cross-fitted best static − 1. Each replicate
    resamples the controller's requests, and each static's requests within each of its rounds,
    then picks and measures anew on that resample: the interval carries the pick's noise too.
    None when the controller or some static's round has fewer than 5 requests in the window."""
    def sample(reqs: Sequence[Req] | None) -> list[tuple[float, int]]:
        return [(r.decode_s, r.decode_tokens) for r in reqs or ()
                if r.decode_tokens and phase.start_s + t_from <= r.start_s < phase.end_s]
    c = sample(ctl)
    units = {label: {q: sample(rs) for q, rs in per.items()} for label, per in rounds.items()}
    if len(c) < 5 or any(len(xs) < 5 for per in units.values() for xs in per.values()):
        return None
    rng = random.Random(seed)

    def draw(xs: list[tuple[float, int]]) -> tuple[float, int]:
        got = rng.choices(xs, k=len(xs))
        return sum(d for d, _ in got), sum(n for _, n in got)
    regrets = []
    for _ in range(resamples):
        cd, cn = draw(c)
        best, _ = crossfit({label: {q: draw(xs) for q, xs in per.items()} for label, per in units.items()})
        if best is None:
            return None
        regrets.append(1000.0 * cd / cn / best - 1)
    regrets.sort()
    return round(regrets[int(0.025 * resamples)], 4), round(regrets[int(0.975 * resamples) - 1], 4)


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
    # Cross-fitted when every static ran in the same 2+ rounds; else the plain minimum, upward-biased regret.
    xf_rounds, no_xf = rounds_of_statics([g for g in groups if g[0].get("mode") in STATIC_MODES])
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
            "controller_tpot_ms": None, "controller_tpot_ms_whole": None, "regret": None, "regret_ci95": None, "regret_whole": None,
            "within_tolerance": None, "reached_s": None,
            "best_static_crossfit_tpot_ms": None, "best_static_crossfit_picks": None, "regret_crossfit": None,
            "regret_crossfit_ci95": None, "within_tolerance_crossfit": None,
            "seed_tpot_ms": None, "seed_tpot_ms_whole": None, "controller_vs_seed": None, "controller_vs_seed_whole": None,
        }
        sums = None if xf_rounds is None else crossfit_sums(xf_rounds, p, settle_s)
        v_x = None
        if sums is not None:
            v_x, picks = crossfit(sums)
            row["best_static_crossfit_tpot_ms"] = _round(v_x)
            row["best_static_crossfit_picks"] = {str(q): lab for q, lab in picks.items()}  # held-out round -> pick
        if ttft_slo_s is not None:
            p95 = {r["label"]: ttft_p95_in(r, p, settle_s, q) for r, q in statics}
            feasible = [(r, q) for r, q in statics if p95[r["label"]] is not None and p95[r["label"]] <= ttft_slo_s]
            b_f, v_f = best_static(feasible, p, settle_s)
            row["static_ttft_p95_ms"] = {k: _round(None if v is None else 1000 * v, 1) for k, v in p95.items()}
            row["best_feasible_static"], row["best_feasible_static_tpot_ms"] = b_f and b_f["label"], _round(v_f)
            row["regret_vs_feasible"] = row["within_tolerance_vs_feasible"] = row["controller_ttft_p95_ms"] = None
            row["best_feasible_static_crossfit_tpot_ms"] = row["best_feasible_static_crossfit_picks"] = None
            row["regret_vs_feasible_crossfit"] = row["within_tolerance_vs_feasible_crossfit"] = None
            if sums is not None:
                v_fx, picks_f = crossfit(sums, feasible_on_other_rounds(xf_rounds, p, settle_s, ttft_slo_s))
                row["best_feasible_static_crossfit_tpot_ms"] = _round(v_fx)
                row["best_feasible_static_crossfit_picks"] = {str(q): lab for q, lab in picks_f.items()}
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
            b_reqs = next((q for r, q in statics if b_s is not None and r["label"] == b_s["label"]), None)
            row["regret_ci95"] = regret_interval(ctl[1], b_reqs, p, settle_s)
            if sums is not None:
                r_x = _rel(c_s, v_x)
                row["regret_crossfit"] = None if r_x is None else round(r_x - 1, 4)
                row["within_tolerance_crossfit"] = None if r_x is None else r_x - 1 <= tolerance
                row["regret_crossfit_ci95"] = crossfit_regret_interval(ctl[1], xf_rounds, p, settle_s)
            if ttft_slo_s is not None:
                c_p95 = ttft_p95_in(ctl[0], p, settle_s, ctl[1])
                row["controller_ttft_p95_ms"] = _round(None if c_p95 is None else 1000 * c_p95, 1)
                r_f = _rel(c_s, row["best_feasible_static_tpot_ms"])
                row["regret_vs_feasible"] = None if r_f is None else round(r_f - 1, 4)
                row["within_tolerance_vs_feasible"] = None if r_f is None else r_f - 1 <= tolerance
                if sums is not None:
                    r_fx = _rel(c_s, row["best_feasible_static_crossfit_tpot_ms"])
                    row["regret_vs_feasible_crossfit"] = None if r_fx is None else round(r_fx - 1, 4)
                    row["within_tolerance_vs_feasible_crossfit"] = None if r_fx is None else r_fx - 1 <= tolerance
            # On the same basis as the target: the cross-fitted best static over each window when there is one.
            best_at = None if xf_rounds is None else (lambda t, p=p: crossfit(crossfit_sums(xf_rounds, p, t))[0])
            row["reached_s"] = reached_within(ctl, statics, p, tolerance, best_at) if statics else None
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
    basis = "min_of_measured" if xf_rounds is None else "crossfit"
    out: dict = {"tolerance": tolerance, "settle_s": settle_s, "seed_config": seed, "ttft_slo_s": ttft_slo_s,
                 "statics": [r["label"] for r, _ in statics], "phases": rows,
                 "regret_basis": basis, "regret_basis_note": _basis_note(xf_rounds, no_xf, len(statics))}
    if ctl is not None:
        acc = combine_accounting([rebuild_accounting(r, phases) for r, _ in ctl_group[2]])
        out["controller"] = acc
        measured = [r for r in rows]
        sfx = "_crossfit" if basis == "crossfit" else ""  # the targets read the cross-fitted figures when there are any
        ci_key = "regret_crossfit_ci95" if basis == "crossfit" else "regret_ci95"
        all_within = (all(r["within_tolerance" + sfx] for r in measured)
                      if measured and all(r["within_tolerance" + sfx] is not None for r in measured) else None)
        reached = [r["reached_s"] for r in measured]
        out["targets"] = {
            "within_tolerance_every_phase": all_within,
            "reached_within_settle_every_phase": None if all_within is None else all(t is not None and t <= settle_s for t in reached),
            # Regret's interval reaches down into the tolerance in every phase: the run cannot tell
            # the controller from one within tolerance (True), or shows it worse in some phase (False).
            "within_tolerance_not_ruled_out_every_phase": None if any(r[ci_key] is None for r in measured)
            else all(r[ci_key][0] <= tolerance for r in measured),
            "failed_during_rebuilds_zero": acc["failed_during_rebuilds"] == 0,
            "met": bool(all_within) and acc["failed_during_rebuilds"] == 0,
            "regret_basis": basis,
        }
        if ttft_slo_s is not None:
            vs_f = [r["within_tolerance_vs_feasible" + sfx] for r in rows]
            # None when a phase had no static config within the SLO (nothing to compare with).
            out["targets"]["within_tolerance_vs_feasible_every_phase"] = None if None in vs_f else all(vs_f)
    return out


def _basis_note(xf_rounds: RoundReqs | None, no_xf: str, n_statics: int) -> str:
    if xf_rounds is not None:
        rounds = sorted(next(iter(xf_rounds.values())))
        return (f"cross-fitted over rounds {', '.join(map(str, rounds))}: for each round, the static with the lowest TPOT on the "
                "other rounds, measured on that round (the targets use it); the minimum of the measured statics is shown beside it")
    # No split-half within a phase instead: both halves share the run's own noise (configs run
    # one after another), which is most of it, so the bias would stay and look removed.
    return (f"the minimum of {n_statics} noisy figures, picked and measured on the same requests, so it is biased low and the "
            f"regret is an upper-biased estimate (no cross-fitting: {no_xf}; --rounds 2 or more gives a cross-fitted figure)")


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)
