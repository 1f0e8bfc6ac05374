"""quickdraft bench windows: the offline check of how windows rank configs."""

from __future__ import annotations

import json

import pytest

from quickdraft.bench.windows import analyse, load_reference, load_windows, report, run
from quickdraft.server.controller.measured import Window
from quickdraft.server.speculative import SpecConfig

FAST, SLOW = SpecConfig(False, 3), SpecConfig(False, 5)


def window(cfg: SpecConfig, base_s: float, rate: float, tokens: int = 1000) -> Window:
    """8 streams; decode TPOT = base + 1 ms per prompt token prefilled per decode token."""
    return Window(cfg, 1.0, tokens * (base_s + 0.001 * rate), tokens, running=8.0, running_start=8, running_end=8,
                  offered=8.0, offered_start=8, offered_end=8, steps=100, prefill_tokens=int(rate * tokens))


def both(n: int = 5) -> list[Window]:
    """Each config caught as many windows with many arrivals (rate 10) as with none."""
    return [window(cfg, base, rate) for cfg, base in ((FAST, 0.010), (SLOW, 0.011)) for rate in [0.0, 10.0] * n]


def test_the_prefill_slope_takes_the_arrivals_out_of_the_windows_and_the_picks():
    result = analyse(both(), draws=[1, 3], rounds=400)
    (level,) = result["levels"]
    assert level["best"] == FAST.label() and level["slope_ms"] == pytest.approx(1.0)
    for c in level["configs"]:
        assert c["spread_raw"] > 0.3 and c["spread_adjusted"] == pytest.approx(0.0, abs=1e-9)
    one, three = level["picks"]
    # One window each: no config has a slope of its own to pool, so both scorings pick alike.
    assert one["raw_best_share"] == one["adjusted_best_share"] < 0.9
    # Three each: the slope is known, and the pick no longer depends on which windows caught arrivals.
    assert three["adjusted_best_share"] > 0.9 > three["raw_best_share"]
    assert three["adjusted_mean_regret"] < three["raw_mean_regret"]
    assert "| 3 |" in report(result)


def test_the_reference_can_be_the_statics_settled_tpot_of_a_phases_run(tmp_path):
    """Against a phases run's statics (what the controller is judged by), not
    the windows' own means; configs the run did not measure are left out."""
    doc = {"benchmark": "controller_phases", "runs": [
        {"label": "ar3", "mode": "autoregressive", "k": 3, "phases": [
            {"concurrency": 1, "settled": {"tpot_ms_token_weighted": 4.0}},
            {"concurrency": 8, "settled": {"tpot_ms_token_weighted": 12.0}},
            {"concurrency": 1, "settled": {"tpot_ms_token_weighted": 5.0}}]},
        {"label": "ar5", "mode": "autoregressive", "k": 5, "phases": [
            {"concurrency": 8, "settled": {"tpot_ms_token_weighted": 11.0}}]},
        {"label": "controller", "mode": "controller", "k": None, "phases": [
            {"concurrency": 8, "settled": {"tpot_ms_token_weighted": 1.0}}]}]}
    path = tmp_path / "phases.json"
    path.write_text(json.dumps(doc))
    statics = load_reference(path)
    assert statics == {FAST: {1: pytest.approx(0.0045), 8: pytest.approx(0.012)}, SLOW: {8: pytest.approx(0.011)}}
    (level,) = analyse(both() + [window(SpecConfig(True, 7), 0.005, 1.0)] * 3, draws=[3], rounds=50, statics=statics)["levels"]
    assert level["best"] == SLOW.label() and level["reference"] == "settled TPOT at 8 streams"
    assert [c["config"] for c in level["configs"]] == [SLOW.label(), FAST.label()]
    with pytest.raises(ValueError, match="not a phases.json"):
        path.write_text("{}")
        load_reference(path)


def test_it_reads_observation_files_and_names_a_bad_line(tmp_path, capsys):
    path = tmp_path / "obs.jsonl"
    lines = [json.dumps({"t": 1.0, "window": w.to_dict(), **({"pinned": True} if i % 2 else {})}) for i, w in enumerate(both())]
    lines.append(json.dumps({"t": 2.0, "observation": {}}))  # requests are skipped
    path.write_text("\n".join(lines) + "\n")
    assert len(load_windows([path])) == 20 and len(load_windows([path], pinned_only=True)) == 10
    assert load_windows([path])[0] == both()[0]

    class Args:
        files, pinned_only, min_load, windows, rounds, seed, json = [path], False, 0.0, "2", 50, 0, tmp_path / "out.json"
        reference = None

    assert run(Args()) == 0
    assert json.loads((tmp_path / "out.json").read_text())["usable"] == 20
    path.write_text("{not json\n")
    assert run(Args()) == 2
    assert "obs.jsonl:1: not JSON" in capsys.readouterr().err
