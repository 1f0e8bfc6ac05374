"""The cross-fitted best static of bench/phases/analysis.py: the minimum of the
measured statics is biased low (the winner's curse), so the controller's regret
against it is biased high; picking on some rounds and measuring on the held-out
round is not. Synthetic statics with known true TPOTs and noise."""

from __future__ import annotations

import random
import statistics

import pytest

from quickdraft.bench.phases.analysis import crossfit, crossfit_regret_interval, verdicts
from quickdraft.bench.phases.report import markdown
from quickdraft.bench.phases.timeline import Req
from tests.bench.test_controller_phases import PHASES, req, run_of, synthetic_doc

TOKENS = 1000  # decode tokens per (config, round) in the sums-level tests


def noisy_reqs(rng: random.Random, truth_ms: list[float], run_sd: float, req_sd: float = 0.2, ttft_s: float = 0.05) -> list[Req]:
    """A request every second of every phase: the phase's true TPOT times one factor per
    (run, phase) (the machine's noise, shared by all of a run's requests there) times each
    request's own (what it accepted)."""
    out = []
    for p, truth in zip(PHASES, truth_ms):
        factor = 1 + rng.gauss(0, run_sd)
        for s in range(int(p.start_s), int(p.end_s)):
            r = req(float(s), truth * factor * rng.uniform(1 - req_sd, 1 + req_sd), index=s)
            out.append(Req(r.index, r.start_s, r.end_s, r.outcome, r.tokens, r.decode_s, ttft_s))
    return out


def rounds_of(rng: random.Random, statics: dict[str, list[float]], ctl: list[float], rounds: int, run_sd: float,
              req_sd: float = 0.2) -> list[dict]:
    runs = []
    for rnd in range(1, rounds + 1):
        for label, truth in [*statics.items(), ("controller", ctl)]:
            mode = "controller" if label == "controller" else "parallel"
            run = run_of(label, mode, noisy_reqs(rng, truth, run_sd, req_sd))
            if rounds > 1:
                run["round"] = rnd
            runs.append(run)
    return runs


def test_the_minimum_of_nine_equal_statics_is_biased_low_and_the_cross_fit_is_not():
    """Nine statics and the controller, all 10 ms in truth, each (config, round) off by a 5 %
    noise: the regret against the minimum comes out positive on average (about 1.5 sd of a
    pooled figure), against the cross-fitted best static about zero."""
    rng = random.Random(7)
    plain, xfit = [], []
    for _ in range(400):
        sums = {f"s{i}": {q: (TOKENS * 0.010 * (1 + rng.gauss(0, 0.05)), TOKENS) for q in (1, 2)} for i in range(9)}
        ctl = sum(1000 * 0.010 * (1 + rng.gauss(0, 0.05)) for _ in (1, 2)) / 2
        pooled_min = min(1000 * sum(d for d, _ in per.values()) / sum(n for _, n in per.values()) for per in sums.values())
        best, picks = crossfit(sums)
        assert set(picks) == {1, 2}
        plain.append(ctl / pooled_min - 1)
        xfit.append(ctl / best - 1)
    assert statistics.mean(plain) > 0.04  # expected about +5.5 %
    assert abs(statistics.mean(xfit)) < 0.01  # its standard error over 400 draws is about 0.3 %


def test_the_cross_fit_picks_a_static_truly_better_by_ten_percent():
    rng = random.Random(3)
    for _ in range(50):
        sums = {f"s{i}": {q: (TOKENS * 0.010 * (0.9 if i == 4 else 1.0) * (1 + rng.gauss(0, 0.02)), TOKENS) for q in (1, 2, 3)}
                for i in range(9)}
        best, picks = crossfit(sums)
        assert picks == {1: "s4", 2: "s4", 3: "s4"}
        # The same pick in every round: that static's own pooled TPOT.
        assert best == pytest.approx(1000 * sum(d for d, _ in sums["s4"].values()) / (3 * TOKENS))


def test_the_cross_fit_picks_on_the_other_rounds_and_measures_on_the_held_out_one():
    # a is lucky in round 1, b in round 2: each is picked for the other's round, where it is slow.
    sums = {"a": {1: (9.0, 1000), 2: (10.6, 1000)}, "b": {1: (10.6, 1000), 2: (9.0, 1000)}}
    best, picks = crossfit(sums)
    assert picks == {1: "b", 2: "a"} and best == pytest.approx(10.6)
    # A static that may not be picked where it is left out: b only for round 1 (picked on round 2).
    best, picks = crossfit(sums, allowed=lambda label, r: label == "a" or r == 1)
    assert picks == {1: "b", 2: "a"}
    best, picks = crossfit(sums, allowed=lambda label, r: label == "a")
    assert picks == {1: "a", 2: "a"} and best == pytest.approx(9.8)


def test_verdicts_report_both_figures_and_the_targets_use_the_cross_fitted_one():
    """Two statics about 10 ms in truth, each lucky in one round; the controller at 10.3 ms: 5 %
    over the minimum of the measured statics (a: 9.8 ms pooled), 4 % under the cross-fitted best
    (b picked on round 2, 10.8 ms in round 1; a picked on round 1, 10.6 ms in round 2)."""
    def fixed(ms: float) -> list[Req]:
        return [req(float(s), ms, index=s) for s in range(180)]
    runs = []
    for rnd, (a, b) in ((1, (9.0, 10.8)), (2, (10.6, 9.0))):
        for run in (run_of("a", "parallel", fixed(a)), run_of("b", "autoregressive", fixed(b)), run_of("controller", "controller", fixed(10.3))):
            run["round"] = rnd
            runs.append(run)
    v = verdicts(runs, PHASES, 30.0, 0.05, ttft_slo_s=0.3)
    p1 = v["phases"][0]
    assert p1["best_static_tpot_ms"] == pytest.approx(9.8) and p1["regret"] == pytest.approx(10.3 / 9.8 - 1, abs=1e-3)
    assert p1["within_tolerance"] is False
    assert p1["best_static"] == "a" and p1["regret_ci95"][0] > 0.02  # the minimum's interval would rule out 0 here
    assert p1["best_static_crossfit_tpot_ms"] == pytest.approx(10.7) and p1["best_static_crossfit_picks"] == {"1": "b", "2": "a"}
    assert p1["regret_crossfit"] == pytest.approx(10.3 / 10.7 - 1, abs=1e-3) and p1["within_tolerance_crossfit"] is True
    lo, hi = p1["regret_crossfit_ci95"]
    assert lo == pytest.approx(hi) == pytest.approx(10.3 / 10.7 - 1, abs=1e-3)  # every request decodes at one rate per run
    # Both statics met the SLO everywhere: the SLO-feasible cross-fit is the same.
    assert p1["best_feasible_static_crossfit_tpot_ms"] == pytest.approx(10.7) and p1["within_tolerance_vs_feasible_crossfit"] is True
    assert p1["reached_s"] == 0.0  # against the cross-fitted figure over each window, as the target
    t = v["targets"]
    assert v["regret_basis"] == t["regret_basis"] == "crossfit" and "rounds 1, 2" in v["regret_basis_note"]
    assert t["within_tolerance_every_phase"] is True and t["within_tolerance_not_ruled_out_every_phase"] is True
    assert t["within_tolerance_vs_feasible_every_phase"] is True and t["met"] is True
    md = markdown({**synthetic_doc(), "runs": runs, "verdicts": v})
    assert "| every phase: controller TPOT within 5% of the best static config (settled; the cross-fitted best static) | met |" in md
    assert "| every phase: within 5% of the best static config that met the TTFT SLO (300 ms p95; the cross-fitted best static) | met |" in md
    assert "| 1 | 1 stream | a | 9.80 | 10.30 | +5.1% | [+3%, +7%] | r1 b, r2 a | 10.70 | -3.7% | [-4%, -4%] | a | +5.1% | yes | 0 s |" in md
    assert "| 1 | a | 9.80 | +5.1% | r1 b, r2 a | 10.70 | -3.7% |" in md
    assert "Best static: cross-fitted over rounds 1, 2" in md


def test_one_round_keeps_the_minimum_and_says_it_is_biased():
    rng = random.Random(5)
    v = verdicts(rounds_of(rng, {f"s{i}": [10.0] * 3 for i in range(3)}, [10.0] * 3, 1, 0.05), PHASES, 30.0, 0.05)
    assert v["regret_basis"] == v["targets"]["regret_basis"] == "min_of_measured"
    assert "one round" in v["regret_basis_note"] and "upper-biased" in v["regret_basis_note"]
    assert all(r["best_static_crossfit_tpot_ms"] is None and r["regret_crossfit"] is None for r in v["phases"])
    assert v["targets"]["within_tolerance_every_phase"] == all(r["within_tolerance"] for r in v["phases"])
    md = markdown({**synthetic_doc(), "runs": [], "verdicts": v})
    assert "(settled; the minimum of the measured statics, upward-biased regret) |" in md and "upper-biased estimate" in md
    # Statics with figures only (from a sweep) cannot be cross-fitted, rounds or not.
    runs = rounds_of(rng, {"s0": [10.0] * 3, "s1": [10.0] * 3}, [10.0] * 3, 2, 0.05)
    for r in runs:
        if r["label"] == "s1":
            r.pop("requests")
    v = verdicts(runs, PHASES, 30.0, 0.05)
    assert v["regret_basis"] == "min_of_measured" and "s1 has figures only" in v["regret_basis_note"]


def test_verdicts_cross_fit_removes_the_winners_curse_from_equal_statics():
    """End to end over requests: nine statics and the controller equal in truth, 5 % noise per
    (run, phase): the regret against the minimum is positive on average, the cross-fitted one
    about zero; and the cross-fitted interval is the one that does not rule out the truth."""
    rng = random.Random(11)
    plain, xfit, ruled_out_plain, ruled_out_xfit = [], [], 0, 0
    for _ in range(8):
        v = verdicts(rounds_of(rng, {f"s{i}": [10.0] * 3 for i in range(9)}, [10.0] * 3, 2, 0.05), PHASES, 30.0, 0.0)
        for r in v["phases"]:
            plain.append(r["regret"])
            xfit.append(r["regret_crossfit"])
            ruled_out_plain += r["regret_ci95"][0] > 0
            ruled_out_xfit += r["regret_crossfit_ci95"][0] > 0
    assert statistics.mean(plain) > 0.03  # expected about +5 %
    assert abs(statistics.mean(xfit)) < 0.02
    assert ruled_out_xfit < ruled_out_plain


def test_verdicts_cross_fit_picks_the_truly_best_static_and_respects_the_slo():
    """s4 is 10 % faster in truth in every phase; in phase 2 s4 also breaks the TTFT SLO in
    round 2 only, so it is feasible for round 2 (picked on round 1) but not for round 1."""
    rng = random.Random(2)
    statics = {f"s{i}": [9.0] * 3 if i == 4 else [10.0] * 3 for i in range(9)}
    runs = rounds_of(rng, statics, [9.0] * 3, 2, 0.01, req_sd=0.05)
    for run in runs:
        if run["label"] == "s4" and run["round"] == 2:
            slow = {i for i, row in enumerate(run["requests"]["rows"]) if 60 <= row[1] < 120}
            for i in slow:
                run["requests"]["rows"][i][6] = 0.5
    v = verdicts(runs, PHASES, 30.0, 0.05, ttft_slo_s=0.3)
    assert all(r["best_static_crossfit_picks"] == {"1": "s4", "2": "s4"} for r in v["phases"])
    p2 = v["phases"][1]
    assert p2["best_feasible_static"] != "s4"  # pooled, its p95 is over the SLO
    assert p2["best_feasible_static_crossfit_picks"]["2"] == "s4" and p2["best_feasible_static_crossfit_picks"]["1"] != "s4"
    assert abs(p2["regret_crossfit"]) < 0.05


def test_crossfit_interval_needs_enough_requests_and_sees_a_slower_controller():
    rng = random.Random(4)
    p = PHASES[0]
    statics = {f"s{i}": {q: [r for r in noisy_reqs(rng, [10.0] * 3, 0.0)] for q in (1, 2)} for i in range(3)}
    lo, hi = crossfit_regret_interval(noisy_reqs(rng, [10.0] * 3, 0.0), statics, p, 30.0)
    assert lo < 0 and lo < hi < lo + 0.2  # equal in truth: not ruled out (the target reads the lower end)
    lo, hi = crossfit_regret_interval(noisy_reqs(rng, [13.0] * 3, 0.0), statics, p, 30.0)
    assert lo > 0.2
    statics["s0"][2] = statics["s0"][2][:33]  # 3 requests in the settled window of phase 1: too few
    assert crossfit_regret_interval(noisy_reqs(rng, [10.0] * 3, 0.0), statics, p, 30.0) is None
