"""The `quickdraft tune` sweep as a plain function over a measure() callback."""

from __future__ import annotations

import importlib.util
import math

from quickdraft.bench.controller_sim import CROSSING_ACCEPTANCE, CROSSING_COST, FakeClock, SimulatedEngine
from quickdraft.server.controller import ProfileKey, ProfileStore, load_into, run_sweep
from quickdraft.server.controller.controller import Controller
from quickdraft.server.speculative import SpecConfig, default_candidates

KEY = ProfileKey("test-cpu", "target", "drafter", "0.32.0")


def test_sweep_measures_config_major_writes_profile_and_picks_start(tmp_path):
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=0)
    calls = []

    def measure(config, concurrency):
        calls.append((config, concurrency))
        return eng.requests(config, concurrency, 12)

    store = ProfileStore(tmp_path / "profiles")
    res = run_sweep(measure, store=store, key=KEY, plot_path=tmp_path / "tune.png", progress=False,
                    controller=Controller(clock=FakeClock()))
    configs = list(default_candidates())
    assert calls == [(c, n) for c in configs for n in (1, 4, 8, 16)]  # one engine per config
    assert len(res.rows) == len(calls) and not res.failed
    assert res.start.at(1) == SpecConfig(True, 7) and res.start.k_for(8) <= 3
    assert set(res.best) == {1, 4, 8, 16}
    assert res.profile_path == store.path_for(KEY) and res.profile_path.exists()
    fresh = Controller(clock=FakeClock())
    assert load_into(fresh, store, KEY) and fresh.start_config() == res.start
    # rows summarise what was measured
    row = next(r for r in res.rows if r.config == SpecConfig(True, 7) and r.concurrency == 1)
    assert row.requests == 12 and row.acceptance_length > 2.5
    assert row.tpot_s * 1e3 < 4.0 and row.ttft_p95_s >= row.ttft_p50_s
    # token-weighted TPOT (the controller's and the phases benchmark's measure) pools the requests
    obs = [o for o in res.observations if o.config == row.config and o.batch_size <= 1.5]
    assert len(res.observations) == len(calls) * 12 and len(obs) == 12
    decode = [(o.tpot_s * (o.output_tokens - 1), o.output_tokens - 1) for o in obs if o.output_tokens > 1]
    assert math.isclose(row.tpot_token_weighted_s, sum(s for s, _ in decode) / sum(n for _, n in decode))
    assert "| parallel K=7 | 1 | 12 |" in res.table()
    # the plot: written when matplotlib is there, a stated reason when not
    if importlib.util.find_spec("matplotlib") is not None:
        assert res.plot_path.exists() and res.plot_path.stat().st_size > 1000 and not res.plot_skipped
    else:
        assert res.plot_path is None and "matplotlib" in res.plot_skipped


def test_a_failing_config_does_not_end_the_sweep():
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=1)

    def measure(config, concurrency):
        if config == SpecConfig(False, 7):
            raise RuntimeError("engine failed to start")
        return eng.requests(config, concurrency, 8)

    res = run_sweep(measure, concurrencies=(1, 8), progress=False, controller=Controller(clock=FakeClock()))
    bad = [r for r in res.rows if r.error]
    assert len(bad) == 2 and all(math.isnan(r.tpot_s) for r in bad)
    assert len(res.failed) == 2 and "engine failed to start" in res.failed[0]
    assert res.start.at(1) == SpecConfig(True, 7)


def test_progress_bar_reports_each_run(capsys):
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=2)
    run_sweep(lambda c, n: eng.requests(c, n, 4), configs=[SpecConfig.off(), SpecConfig(True, 3)],
              concurrencies=(1, 4), progress=True, controller=Controller(clock=FakeClock()))
    err = capsys.readouterr().err
    assert "4/4" in err and "TPOT" in err
