"""Choosing by measurement on a live engine (server/controller/measured.py):
probes are windows, the fastest measured config serves, the load's level
keys the measurements. Simulated engine on a fake clock."""

from __future__ import annotations

import pytest

from quickdraft.bench.controller_sim import (
    CPU_COST,
    CROSSING_ACCEPTANCE,
    CROSSING_COST,
    FakeClock,
    Harness,
    HarnessTrace,
    Phase,
    SimAcceptance,
    SimulatedEngine,
)
from quickdraft.server.config import ControllerSettings, MeasureSettings, SLOSettings
from quickdraft.server.controller import Controller
from quickdraft.server.controller.measured import Cell, MeasuredPolicy, Window, binomial_tail, ruled_out
from quickdraft.server.speculative import SpecConfig

OFF = SpecConfig.off()
P5 = SpecConfig(True, 5)


def ar(k: int) -> SpecConfig:
    return SpecConfig(False, k)


def p(k: int) -> SpecConfig:
    return SpecConfig(True, k)


def live_run(cost, acceptance, phases, *, seed=0, noise=0.04, settings=None, live=lambda s: True,
             start=P5) -> tuple[Controller, HarnessTrace]:
    clock = FakeClock()
    ctl = Controller(settings or ControllerSettings(initial=start), clock=clock)
    ctl.activate(start)
    ctl.set_warm([], live=live)
    eng = SimulatedEngine(cost, acceptance, seed=seed)
    trace = Harness(ctl, eng, clock, tick_s=0.5, rebuild_s=0, window_noise=noise, seed=seed).run(
        [Phase(load, seconds) for load, seconds in phases])
    return ctl, trace


def settled_regret(trace: HarnessTrace, phase: int, after_s: float = 10.0) -> float:
    """TPOT over the best static's, from ``after_s`` into the phase, as the benchmark scores it."""
    ticks = trace.phase_ticks(phase)
    ticks = [t for t in ticks if t.t - ticks[0].t >= after_s]
    return sum(t.true_tpot_s for t in ticks) / sum(t.best_tpot_s for t in ticks) - 1.0


def test_a_single_minimum_over_k_rules_out_what_lies_beyond_a_worse_k():
    measured = {p(3): 4.0, p(5): 3.0, p(7): 3.5}
    assert ruled_out(p(1), measured), "K=1 lies beyond K=3, which is slower than the best K=5"
    assert not ruled_out(OFF, measured), "no speculation skips the drafter: it is on no K curve"
    assert not ruled_out(p(5), {OFF: 2.0, p(1): 4.0, p(7): 3.0}), \
        "a fast no-speculation says nothing about where the parallel curve's minimum lies"
    assert not ruled_out(ar(3), measured), "another mode's curve says nothing"
    assert not ruled_out(p(1), {p(5): 3.0, p(7): 3.5}), "nothing measured between K=1 and the best"
    assert not ruled_out(p(7), {p(5): 3.0, p(3): 4.0}), "K=7 is on the other side of the best"
    near = {ar(1): 14.8, ar(3): 15.8}
    assert ruled_out(ar(5), near), "K=3 read slower than K=1"
    assert not ruled_out(ar(5), near, margin=0.10), \
        "K=3 read 7% slower than K=1, within a window's noise: it rules nothing out"
    assert ruled_out(ar(5), {ar(1): 14.8, ar(3): 17.0}, margin=0.10)


def test_no_speculation_is_measured_even_where_the_parallel_curve_falls_towards_its_best_k():
    """At 8 streams on 2 cores (a CPU phases run): no speculation 11.9 ms, and
    the parallel curve falls from K=1 to K=3 and rises to K=5. No speculation
    skips the drafter, so that curve says nothing about it: it is measured and serves."""
    true_ms = {OFF: 11.9, p(1): 14.2, p(3): 12.9, p(5): 13.8, p(7): 13.1}
    mp = MeasuredPolicy(ControllerSettings())
    banned = lambda c: c not in true_ms  # noqa: E731
    config, now, probed = p(5), 0.0, []
    for _ in range(20):
        now += 1.0
        mp.observe(Window(config, 1.0, true_ms[config], 1000, running=8.0, running_start=8, running_end=8), now=now)
        d = mp.judge(now, banned)
        if d.action == "hold":
            break
        config = d.plan.engine
        probed.append(config)
    assert OFF in probed, [c.label() for c in probed]
    assert d.code == "best" and mp.active == OFF, d.reason


def probes_at(mp: MeasuredPolicy, true_ms: dict, running: float, start: SpecConfig, now: float) -> tuple[list, float]:
    """Serve ``start`` at ``running`` requests and follow the policy's probes
    until it holds; each window reads the config's true TPOT."""
    config, probed = start, []
    for _ in range(30):
        now += 1.0
        n = int(running)
        mp.observe(Window(config, 1.0, true_ms[config], 1000, running=running, running_start=n, running_end=n), now=now)
        d = mp.judge(now, lambda c: c not in true_ms)
        if d.action == "hold":
            return probed, now
        config = d.plan.engine
        probed.append(config)
    raise AssertionError("the policy never settled")


def test_configs_far_off_the_best_at_another_level_are_not_probed_at_a_new_one():
    """A CPU phases run: at 1 stream the autoregressive K=3..7 ran 1.7-2.4x
    parallel K=5's TPOT; at 8 streams the controller probed them too, in
    windows of 3-5 s, and served 1.5x the best static's TPOT over the phase.
    Seen from the nearest measured level, they lie beyond their mode's best
    K there (autoregressive K=1), which more load cannot raise: left out. No
    speculation and autoregressive K=1 are probed."""
    one = {p(5): 3.16, p(3): 3.62, p(7): 3.42, p(1): 4.82, ar(1): 3.98, ar(3): 5.42, ar(5): 7.31, ar(7): 7.64, OFF: 4.23}
    # The statics' TPOT, except the autoregressive windows as the controller read them
    # there: noisy enough that its curve fell from K=1 to K=5, so K=5 and 7 were probed.
    eight = {p(5): 14.41, p(3): 13.17, p(7): 14.76, p(1): 14.29, ar(1): 24.31, ar(3): 23.11, ar(5): 21.67,
             ar(7): 27.27, OFF: 15.34}
    far = {ar(3), ar(5), ar(7)}

    def run(settings: ControllerSettings) -> list:
        mp = MeasuredPolicy(settings)
        _, now = probes_at(mp, one, 1.0, P5, 0.0)
        assert mp.active == P5
        probed, _ = probes_at(mp, eight, 8.0, P5, now)
        assert mp.active == p(3), [c.label() for c in probed]
        return probed

    probed = run(ControllerSettings())
    assert {OFF, ar(1)} <= set(probed) and not far & set(probed), [c.label() for c in probed]
    everything = ControllerSettings()
    everything.measure.prune_above = 100.0
    assert far & set(run(everything)), "with a large prune_above far-off configs are probed"


def test_a_cold_controller_reaches_the_best_config_within_seconds_of_every_load_change():
    """1 -> 8 -> 1 -> 8 -> 1 streams, where the best config changes with the
    load (GPU-like costs): within 3% of the best static from 10 s after each
    change on average (each phase within 5%: a window's step time is noisy,
    and a short probe sees little acceptance), and a level measured before
    is served at once on return."""
    phases = [(1, 25), (8, 25), (1, 25), (8, 25), (1, 25)]
    for seed in range(3):
        ctl, trace = live_run(CROSSING_COST, CROSSING_ACCEPTANCE, phases, seed=seed)
        regrets = [settled_regret(trace, i) for i in range(len(phases))]
        assert max(regrets) <= 0.05 and sum(regrets) / len(regrets) <= 0.03, (seed, regrets)
        for i in (2, 3, 4):  # levels measured in an earlier phase: no sweep, one move
            moves = [d for d in trace.decisions if d.action != "hold" and trace.phase_ticks(i)[0].t <= d.timestamp
                     <= trace.phase_ticks(i)[-1].t]
            assert len([d for d in moves if d.action == "explore"]) <= 2, (seed, i, [d.reason for d in moves])
            ticks = trace.phase_ticks(i)
            assert ticks[10].true_tpot_s <= 1.05 * ticks[10].best_tpot_s, (seed, i, ticks[10].config.label())
        assert ctl.engine_rebuilds == 0


def test_each_new_level_is_measured_in_fewer_windows_than_there_are_candidates():
    ctl, trace = live_run(CPU_COST, SimAcceptance(), [(1, 30)])
    probes = trace.actions("explore")
    assert probes and all(d.reason_code == "probe" for d in probes)
    distinct = {d.engine for d in probes} | {P5}
    assert len(distinct) < len(ctl.settings.candidates), "the single-minimum rule skipped nothing"
    state = ctl.state()
    assert state.measuring and {m.config for m in state.measured} == distinct


def test_a_window_whose_load_moved_is_not_a_measurement():
    settings = ControllerSettings()
    mp = MeasuredPolicy(settings)
    mp.observe(Window(P5, 0.5, 3.5, 1000, running=5.0, running_start=1, running_end=8), now=1.0)
    assert mp.level is None and mp.discarded == 1 and not mp.table.cells
    assert mp.judge(1.0, lambda c: False).code == "load_moving"
    mp.observe(Window(P5, 0.5, 3.6, 1000, running=8.0, running_start=8, running_end=8), now=1.5)
    assert mp.level == mp.table.level(8.0) and mp.table.get(mp.level, P5).decode_tpot_s == 3.6 / 1000


def test_a_windows_tpot_counts_every_step_and_leaves_out_its_acceptance_luck():
    """A config is scored by its windows' decode TPOT, which holds the steps
    that also prefilled (at 8 streams, most of them), scaled from the
    window's own tokens per step to the pooled E[L] of its drafting mode."""
    mp = MeasuredPolicy(ControllerSettings())

    def window(cfg: SpecConfig, decode_s: float, tokens: int, drafts: int, accepted: tuple[int, ...]) -> Window:
        return Window(cfg, 1.0, decode_s, tokens, running=1.0, running_start=1, running_end=1,
                      drafts=drafts, accepted_per_position=accepted)

    # Parallel drafting accepts 80% then 50% at positions 1 and 2: E[L] = 1 + 0.8 + 0.4 = 2.2.
    mp.observe(window(p(2), 2.2, 1000, 400, (320, 160)), now=1.0)
    cell = mp.table.get(mp.level, p(2))
    assert abs(mp.tpot(p(2), cell, mp.level) - 2.2e-3) < 1e-9
    # A lucky window of another K: its code gave 4 tokens a step, so its 1.5 ms decode
    # TPOT came at 6 ms the step; the pool (which it joins) expects fewer tokens.
    mp.observe(window(p(3), 1.5, 1000, 100, (100, 100, 100)), now=2.0)
    pooled = mp.acceptance.expected_length(p(3))
    assert 2.2 < pooled < 4.0
    tpot = mp.tpot(p(3), mp.table.get(mp.level, p(3)), mp.level)
    assert abs(tpot - 1.5e-3 * 4.0 / pooled) < 1e-9 and tpot > 1.5e-3
    # No speculation has no luck to take out; a window without draft counters stays as measured.
    mp.observe(window(OFF, 4.0, 1000, 0, ()), now=3.0)
    assert mp.tpot(OFF, mp.table.get(mp.level, OFF), mp.level) == 4.0e-3
    mp.observe(window(ar(3), 3.0, 1000, 0, ()), now=4.0)
    assert mp.tpot(ar(3), mp.table.get(mp.level, ar(3)), mp.level) == 3.0e-3


def _busy_window(cfg: SpecConfig, prefilled: int, tpot_s: float, tokens: int = 800) -> Window:
    """A window at 8 streams, no drafts counted, that prefilled ``prefilled``
    prompt tokens beside the streams and decoded ``tokens`` at ``tpot_s``."""
    return Window(cfg, 1.0, tokens * tpot_s, tokens, running=8.0, running_start=8, running_end=8,
                  steps=100, prefill_tokens=prefilled)


def test_each_config_is_scored_at_the_levels_prefill_rate_not_its_windows_arrivals():
    """Decode TPOT grows with the prompt tokens a window prefilled beside
    the streams (1 ms per prompt token per decode token here, in every
    config). ar3 (10 ms + prefill) caught many arrivals, ar5 (11 ms +
    prefill) few: raw, ar5 reads faster; at the level's prefill rate, ar3
    is. Before enough windows say what a prompt token costs, nothing is adjusted."""
    mp = MeasuredPolicy(ControllerSettings())
    t = 0.0

    def observe(cfg: SpecConfig, base_s: float, rates: list[float]) -> None:
        nonlocal t
        for q in rates:
            t += 1.0
            mp.observe(_busy_window(cfg, int(q * 800), base_s + 0.001 * q), now=t)

    observe(ar(3), 0.010, [8.0, 10.0])
    observe(ar(5), 0.011, [1.0, 3.0])
    lvl = mp.level
    cells = {c: mp.table.get(lvl, c) for c in (ar(3), ar(5))}
    assert mp.table.prefill_slope(lvl) == 0.0, "two windows each: too few to say what a prompt token costs"
    assert mp.tpot(ar(3), cells[ar(3)], lvl) > mp.tpot(ar(5), cells[ar(5)], lvl)
    observe(ar(3), 0.010, [9.0, 11.0])
    observe(ar(5), 0.011, [2.0, 0.0])
    assert mp.table.prefill_slope(lvl) == pytest.approx(0.001)
    rate = mp.table.prefill_rate(lvl)
    assert rate == pytest.approx(44.0 / 8)
    assert cells[ar(3)].decode_tpot_s > cells[ar(5)].decode_tpot_s + 0.005
    assert mp.tpot(ar(3), cells[ar(3)], lvl) == pytest.approx(0.010 + 0.001 * rate)
    assert mp.tpot(ar(5), cells[ar(5)], lvl) == pytest.approx(0.011 + 0.001 * rate)
    # Off: each config as its windows measured it.
    raw = MeasuredPolicy(ControllerSettings(measure=MeasureSettings(prefill_adjust=False)))
    raw.table, raw.acceptance = mp.table, mp.acceptance
    raw.table.settings = raw.settings
    assert raw.tpot(ar(3), cells[ar(3)], lvl) == cells[ar(3)].decode_tpot_s


def test_an_acceptance_shift_keeps_the_measurements_and_rescores_them_at_the_new_acceptance():
    """The drafters suddenly guess half as well: the best config moves to a
    smaller K. The measured TPOTs stay (each window's own acceptance is taken
    out) and the pooled acceptance follows the windows after the shift, so the
    controller gets there without measuring every config again."""
    worse = SimAcceptance().scaled(0.5)
    best_after = SimulatedEngine(CPU_COST, worse).best_static(ControllerSettings().candidates, 1)
    for seed in range(3):
        clock = FakeClock()
        ctl = Controller(ControllerSettings(initial=P5), clock=clock)
        ctl.activate(P5)
        ctl.set_warm([], live=lambda s: True)
        eng = SimulatedEngine(CPU_COST, SimAcceptance(), seed=seed)
        trace = Harness(ctl, eng, clock, tick_s=0.5, rebuild_s=0, window_noise=0.04, seed=seed).run(
            [Phase(1, 30), Phase(1, 60, acceptance=worse)])
        shift_at = min(e.at for e in ctl.state().events if e.kind == "acceptance_shift")
        probes_after = [d for d in trace.actions("explore") if d.timestamp > shift_at]
        assert trace.ticks[-1].config == best_after, (seed, trace.ticks[-1].config.label())
        assert settled_regret(trace, 1, after_s=20.0) <= 0.01, seed
        assert len(probes_after) <= len(ctl.settings.candidates) // 2, \
            f"seed {seed}: {len(probes_after)} probes after the shift, as if measuring afresh"


def test_the_same_streams_are_one_level_whatever_each_config_keeps_running():
    """Under a closed loop of 8 streams a fast config leaves more of each
    request's life queued for its prefill: it runs 5.7 on average where a
    slow one runs 8. Keyed by running requests the two land on different
    levels and are never compared; keyed by requests offered they share one."""
    mp = MeasuredPolicy(ControllerSettings())
    slow, fast = Window(ar(3), 1.0, 8.0, 1000, running=8.0, running_start=8, running_end=8, offered=8.0,
                        offered_start=8, offered_end=8), \
        Window(p(7), 1.0, 5.0, 1000, running=5.7, running_start=4, running_end=7, offered=7.9, offered_start=8, offered_end=8)
    assert mp.table.level(slow.running) != mp.table.level(fast.running)
    mp.observe(slow, now=1.0)
    mp.observe(fast, now=2.0)
    assert mp.discarded == 0, "the running count moved, the offered load did not"
    assert {c for (_lvl, c) in mp.table.cells} == {ar(3), p(7)} and len({lvl for lvl, _c in mp.table.cells}) == 1
    # Where the engine counts no waiting requests, the running ones are the load.
    assert Window(P5, 1.0, 1.0, 10, running=3.0, running_start=3, running_end=3).load == 3.0


def test_a_closed_loop_of_8_streams_stays_at_one_level():
    """Offered loads of the windows of one 8-stream phase on the H100 (6.0 to
    7.4: between a stream's requests none is out); the level they start at
    holds them all, and a real change of load still moves it."""
    table = MeasuredPolicy(ControllerSettings()).table
    loads = [6.60, 6.71, 6.37, 7.27, 6.02, 7.42, 6.68, 6.37, 6.79, 5.93]
    level = table.level(loads[0])
    assert {table.level(x, level) for x in loads} == {level}
    assert table.level(4.0, level) != level and table.level(1.0, level) != level
    assert table.level(11.3, level) != level


def test_a_config_that_misses_the_ttft_slo_is_left_for_one_that_meets_it():
    settings = ControllerSettings(slo=SLOSettings(ttft_s={"inline": 0.3}, min_samples=4))
    mp = MeasuredPolicy(settings)
    everything_else = [c for c in settings.candidates if c not in (P5, ar(3))]
    banned = everything_else.__contains__
    slow_first_tokens = (("inline", 0.5),) * 6
    mp.observe(Window(P5, 1.0, 0.9, 1000, 1.0, 1, 1, slow_first_tokens), now=1.0)  # fast, but TTFT 500 ms
    d = mp.judge(1.0, banned)
    assert d.action == "explore" and d.plan.engine == ar(3)
    for t in (2.0, 2.5):
        mp.observe(Window(ar(3), 1.0, 1.2, 1000, 1.0, 1, 1, (("inline", 0.1),) * 6), now=t)
        d = mp.judge(t, banned)
    assert d.action == "hold" and d.code == "best", d.reason  # ar3 serves: slower, but within the SLO
    mp.active = P5
    mp._new_window = True
    d = mp.judge(3.0, banned)
    assert d.action == "switch" and d.code == "slo" and d.plan.engine == ar(3), d.reason


def test_one_slow_first_token_in_a_dozen_does_not_break_the_slo():
    """With a dozen TTFTs the sample 95th percentile is the largest one: a single
    slow prefill put it over the limit and handed the level to a slower config
    whose TTFT was simply not known yet (a CPU run at 8 streams). A config breaks
    its SLO only when more requests exceed the limit than chance allows."""
    settings = ControllerSettings(slo=SLOSettings(ttft_s={"inline": 0.3}, min_samples=12))
    mp = MeasuredPolicy(settings)
    banned = [c for c in settings.candidates if c not in (P5, ar(1))].__contains__
    one_outlier = (("inline", 0.1),) * 11 + (("inline", 0.45),)
    assert Cell().ttft_quantile("inline", 0.95, 12) is None
    mp.observe(Window(P5, 1.0, 0.9, 1000, 1.0, 1, 1, one_outlier), now=1.0)
    cell = mp.table.get(mp.level, P5)
    assert cell.ttft_quantile("inline", 0.95, 12) == 0.45 and mp.slo_excess(cell) == 1.0
    for t in (2.0, 2.5):  # a slower config, its TTFT unknown (too few samples)
        mp.judge(t, banned)
        mp.observe(Window(ar(1), 1.0, 1.2, 1000, 1.0, 1, 1, (("inline", 0.1),) * 2), now=t)
    mp.active, mp._new_window = P5, True
    d = mp.judge(3.0, banned)
    assert d.action == "hold" and d.code == "best", d.reason
    # Four of a dozen over the limit is no chance (P < 0.05 at a 5% share): the SLO is broken.
    mp.observe(Window(P5, 1.0, 0.9, 1000, 1.0, 1, 1, (("inline", 0.45),) * 4), now=3.5)
    assert mp.slo_excess(mp.table.get(mp.level, P5)) > 1.0
    # With significance 1 the sample quantile alone decides, as before.
    strict = MeasuredPolicy(ControllerSettings(slo=SLOSettings(ttft_s={"inline": 0.3}, min_samples=12, significance=1.0)))
    strict.observe(Window(P5, 1.0, 0.9, 1000, 1.0, 1, 1, one_outlier), now=1.0)
    assert strict.slo_excess(strict.table.get(strict.level, P5)) == 1.5


def test_binomial_tail():
    assert binomial_tail(12, 0, 0.05) == 1.0
    assert abs(binomial_tail(12, 1, 0.05) - (1 - 0.95 ** 12)) < 1e-12
    assert binomial_tail(12, 4, 0.05) < 0.05 < binomial_tail(12, 2, 0.05)


def test_measurements_go_stale_and_contenders_are_measured_again():
    settings = ControllerSettings()
    ctl, trace = live_run(CROSSING_COST, CROSSING_ACCEPTANCE, [(1, settings.measure.stale_s + 30)], settings=settings)
    late = [d for d in trace.actions("explore") if d.timestamp - trace.ticks[0].t > settings.measure.stale_s]
    assert late, "nothing was refreshed after stale_s"
    served = trace.ticks[-1].config
    far = settings.measure.refresh_within
    first = {d.engine: d for d in trace.actions("explore") if d.timestamp - trace.ticks[0].t < 10}
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE)
    for d in late:  # only configs within refresh_within of the best are worth a window again
        assert eng.true_tpot(d.engine, 1) <= eng.true_tpot(served, 1) * (1 + far + 0.1), d.engine.label()
    assert len(late) < len(first)


def test_the_profile_keeps_measurements_to_order_the_first_probes_after_a_restart():
    ctl, _ = live_run(CROSSING_COST, CROSSING_ACCEPTANCE, [(1, 20), (8, 20)])
    data = ctl.profile_dict()
    assert {(m["level"], SpecConfig.from_dict(m["config"])) for m in data["measured"]} == set(ctl.measured.table.cells)
    clock = FakeClock(ctl.clock() + 3600)
    fresh = Controller(ControllerSettings(initial=P5), clock=clock)
    fresh.restore(data)
    fresh.set_warm([], live=lambda s: True)
    assert fresh.measured.table.cells and not fresh.measured.table.fresh(0, clock())
    trace = Harness(fresh, SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=1), clock, tick_s=0.5,
                    rebuild_s=0).run([Phase(8, 20)])
    cold = live_run(CROSSING_COST, CROSSING_ACCEPTANCE, [(8, 20)], seed=1)[1]
    assert len(trace.actions("explore")) < len(cold.actions("explore")), "restored values skipped nothing"
    assert settled_regret(trace, 0) <= 0.03


def test_settings_only_another_engine_can_run_stay_the_models_call():
    """The CPU preset's live engine drafts in one mode: among its Ks the
    controller measures; the other drafter and a plain engine need a
    rebuild, which the models and the exploration budget decide, as before
    live switching, once the live settings are measured."""
    live = lambda s: s.enabled and s.parallel  # noqa: E731
    ctl, trace = live_run(CPU_COST, SimAcceptance(), [(1, 60)], live=live)
    moves = [d for d in trace.decisions if d.action != "hold"]
    measured = [d for d in moves if d.reason_code == "probe"]
    assert measured and all(live(d.engine) for d in measured), [d.reason for d in measured]
    others = [d for d in moves if not live(d.engine)]
    assert all(d.reason_code in ("explore", "better", "probe_done") for d in others), [d.reason for d in others]
    if others:
        first_other = trace.decisions.index(others[0])
        assert any(d.reason_code == "best" for d in trace.decisions[:first_other]), \
            "a rebuild was proposed before the live settings were measured"
    assert ctl.measuring


def test_the_engine_integrates_running_and_offered_requests_over_its_steps(monkeypatch):
    """The stat logger adds each step's counts over the time since the last
    step (the lower of the two steps' counts, so an engine going idle adds
    nothing): a window's mean load is the increase over its length."""
    from types import SimpleNamespace

    from quickdraft.server import engine as engine_mod

    now = [100.0]
    monkeypatch.setattr(engine_mod.time, "monotonic", lambda: now[0])
    snapshot = engine_mod.EngineSnapshot()
    logger = engine_mod._stat_logger_factory(snapshot)(vllm_config=None)

    def step(running: int, waiting: int, dt: float, prefilled: int = 0) -> None:
        now[0] += dt
        logger.record(SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting, num_skipped_waiting_reqs=0,
                                      kv_cache_usage=0.1, spec_decoding_stats=None, prefix_cache_stats=None),
                      SimpleNamespace(prompt_token_stats=SimpleNamespace(computed=prefilled)))

    step(0, 1, 0.0, prefilled=300)  # a prefill on an idle engine delays no one
    step(5, 3, 0.0)
    step(5, 3, 1.0)  # 5 running and 8 offered for a second
    step(6, 2, 1.0, prefilled=400)  # one more admitted (its prefill step): still 8 offered
    step(6, 2, 0.5)
    step(0, 0, 1.0)  # the last step with requests running
    step(0, 0, 2.0)  # idle
    assert snapshot.running_seconds == 5 + 5 + 3 + 0
    assert snapshot.in_system_seconds == 8 + 8 + 4 + 0
    assert snapshot.prefill_tokens == 400  # prefilled beside 5 running requests


def test_abandon_above_applies_to_probes_at_a_measured_level_only():
    settings = ControllerSettings(initial=P5)
    mp = MeasuredPolicy(settings)
    now = 100.0
    assert mp.abandon_above(p(3), now) is None, "nothing measured: no level, nothing to compare with"
    mp.observe(Window(P5, 1.0, 8.0, 4000, 8.0, 8, 8), now)
    mp.observe(Window(p(7), 1.0, 8.0, 3200, 8.0, 8, 8), now)
    best = 8.0 / 4000
    ceiling = mp.abandon_above(ar(3), now)
    assert ceiling is not None and abs(ceiling - best * (1 + settings.measure.abandon_above)) < 1e-12
    assert mp.abandon_above(P5, now) is None, "a config measured at the level is not a probe"
    assert mp.abandon_above(ar(3), now + settings.measure.stale_s + 1) is None, "stale measurements compare with nothing"


def test_a_probe_far_behind_ends_even_when_the_moving_load_discards_its_window():
    """At 8 streams a closed loop's requests in the engine dip between one
    finishing and the next arriving, and such a window is not filed; a probe
    that ran far behind in it goes back to the level's best instead of holding."""
    settings = ControllerSettings(initial=P5)
    mp = MeasuredPolicy(settings)
    now = 100.0
    mp.observe(Window(P5, 1.0, 8.0, 4000, 8.0, 8, 8), now)   # 2 ms at load 8
    mp.observe(Window(ar(1), 1.0, 8.0, 2000, 6.0, 8, 4), now + 1)  # 4 ms, the load moved: discarded
    assert mp.level is None and mp.discarded == 1
    v = mp.judge(now + 1, lambda c: False)
    assert v.action == "switch" and v.code == "probe_abandoned" and v.plan.config == P5, v.reason
    assert mp.abandon_above(ar(1), now + 1) is not None, "the last usable level stands in while the load moves"
    # Close behind (10%): the window says nothing decisive, so the controller waits for a usable one.
    mp.observe(Window(ar(3), 1.0, 8.0, 3650, 6.0, 8, 4), now + 2)
    assert mp.judge(now + 2, lambda c: False).code == "load_moving"


def test_a_probe_abandoned_in_a_discarded_window_is_not_taken_again_at_that_level():
    """Its window filed nothing, so ar1 is still unmeasured at load 8: without
    a note of the abandon, the next usable window of p5 would probe it again,
    and again (three times in one 30-s phase of a CPU run)."""
    settings = ControllerSettings(initial=P5)
    mp = MeasuredPolicy(settings)
    banned = lambda c: c not in (P5, ar(1))  # noqa: E731
    now = 100.0
    mp.observe(Window(P5, 1.0, 8.0, 4000, 8.0, 8, 8), now)
    v = mp.judge(now, banned)
    assert v.action == "explore" and v.plan.config == ar(1)
    mp.observe(Window(ar(1), 1.0, 8.0, 2000, 6.0, 8, 4), now + 1)   # 4 ms, the load moved
    assert mp.judge(now + 1, banned).code == "probe_abandoned"
    mp.observe(Window(P5, 1.0, 8.0, 4000, 8.0, 8, 8), now + 2)
    v = mp.judge(now + 2, banned)
    assert v.action == "hold" and v.code == "best", v.reason
    later = now + 3 + settings.measure.stale_s
    mp.observe(Window(P5, 1.0, 8.0, 4000, 8.0, 8, 8), later)
    assert mp.judge(later, banned).plan.config == ar(1), "after stale_s it is worth a window again"



def _serve(mp: MeasuredPolicy, config: SpecConfig, tpot_ms: float, now: float, banned) -> "Verdict":
    """One 1-stream window of ``config`` at ``tpot_ms``, then the policy's verdict."""
    mp.observe(Window(config, 1.0, tpot_ms / 1000 * 400, 400, 1.0, 1, 1), now)
    return mp.judge(now, banned)


def _noise_aware() -> ControllerSettings:
    settings = ControllerSettings(initial=P5)
    settings.measure.switch_z = 1.5
    return settings


def _chosen_p5(settings: ControllerSettings):
    """A policy that measured p5 and p3 twice each at one stream and chose p5
    (3.05 against 3.175 ms), whose windows then spread by about 10% (a level's noise)."""
    mp = MeasuredPolicy(settings)
    banned = lambda c: c not in (P5, p(3))  # noqa: E731
    reads = {P5: [3.0, 3.1, 3.1], p(3): [3.15, 3.2]}
    now, config = 0.0, P5
    while True:
        now += 1.0
        v = _serve(mp, config, reads[config].pop(0), now, banned)
        if v.action != "hold":
            config = v.plan.config
        elif v.code == "best":
            break
    assert config == P5 and mp._chosen == {0: P5}, v.reason
    for ms_ in (3.3, 2.8, 3.2):
        now += 1.0
        assert _serve(mp, P5, ms_, now, banned).code == "best"
    return mp, banned, now


def test_the_choice_at_a_level_stays_until_another_config_is_faster_beyond_the_windows_noise():
    """The serving config is measured window after window, the others keep the
    windows their probes took: the serving one's figure wanders with the load
    while a contender's lucky read stays. A 4% edge inside a spread of about
    10% a window is no reason to switch; a 30% edge is."""
    mp, banned, now = _chosen_p5(_noise_aware())
    assert 0.05 < mp.table.spread(0) < 0.15
    _serve(mp, P5, 3.5, now + 1, banned)
    v = _serve(mp, P5, 3.7, now + 2, banned)   # p5's last four windows: 3.3 ms; p3's two: 3.175 ms
    assert v.action == "hold" and "stays" in v.reason and "within the windows' noise" in v.reason, v.reason
    mp0, banned0, now0 = _chosen_p5(ControllerSettings(initial=P5))
    _serve(mp0, P5, 3.5, now0 + 1, banned0)
    v0 = _serve(mp0, P5, 3.7, now0 + 2, banned0)
    assert v0.action == "switch" and v0.plan.config == p(3), "with switch_z = 0 the margin alone decides"
    for i in range(4):   # p5 really slows down, to 35% behind p3's measurement
        v = _serve(mp, P5, 4.3, now + 3 + i, banned)
        if v.action != "hold":
            break
    assert v.action == "switch" and v.code == "better" and v.plan.config == p(3), v.reason


def test_a_probe_faster_only_within_the_noise_goes_back_to_the_choice():
    """Measured again once its measurement went stale (afresh: its stale
    windows go), a contender reads a little faster in its one window: back
    to the choice. One far faster takes over at once."""
    settings = _noise_aware()
    settings.measure.stale_s = 20.0
    mp, banned, now = _chosen_p5(settings)
    for i in range(14):   # p5 keeps serving (fresh, spread ~6%); p3's windows grow stale
        v = _serve(mp, P5, (3.0, 3.2)[i % 2], now + 1 + 2 * i, banned)
    assert v.action == "explore" and v.plan.config == p(3), "a stale contender within refresh_within is measured again"
    now += 30.0
    assert len(mp.table.get(0, p(3)).windows) == 2
    v = _serve(mp, p(3), 3.0, now, banned)
    assert len(mp.table.get(0, p(3)).windows) == 1, "the stale windows went: measured afresh"
    assert v.action == "switch" and v.code == "back" and v.plan.config == P5, v.reason
    v = _serve(mp, P5, 3.1, now + 1, banned)
    assert v.action == "explore" and v.plan.config == p(3), "a near-tie in one window gets a second one"
    v = _serve(mp, p(3), 3.1, now + 2, banned)
    assert v.action == "switch" and v.code == "back", v.reason
    assert _serve(mp, P5, 3.1, now + 3, banned).action == "hold"
    mp2, banned2, now2 = _chosen_p5(settings)
    for i in range(14):
        _serve(mp2, P5, (3.0, 3.2)[i % 2], now2 + 1 + 2 * i, banned2)
    v = _serve(mp2, p(3), 2.2, now2 + 30.0, banned2)
    assert v.action == "hold" and v.code == "best" and mp2._chosen[0] == p(3), v.reason
