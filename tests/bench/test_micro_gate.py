"""The micro gate's verdicts from pytest-benchmark JSON, and its committed baseline."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from quickdraft.bench import micro


def _bench_json(figures: dict[str, tuple[float, float]]) -> dict:
    """name -> (fastest round s, reference s), as tests/bench/test_micro.py records them."""
    return {"benchmarks": [{"name": n, "stats": {"min": t, "median": t * 1.1}, "extra_info": {"reference_s": ref, "units": 1}} for n, (t, ref) in figures.items()]}


def test_figures_are_normalised_by_the_reference_of_the_same_test():
    f = micro.figures(_bench_json({"test_a": (0.006, 0.002), "test_b": (0.001, 0.004)}))
    assert f == {"test_a": pytest.approx(3.0), "test_b": pytest.approx(0.25)}
    with pytest.raises(ValueError, match="reference_s"):
        micro.figures({"benchmarks": [{"name": "x", "stats": {"min": 1.0}, "extra_info": {}}]})


def test_compare_applies_the_margin_per_benchmark():
    baseline = {"margin": 2.0, "benchmarks": {"test_a": {"ratio": 1.5}, "test_b": {"ratio": 1.0, "margin": 1.5}}}
    v = {x.name: x for x in micro.compare({"test_a": 2.9, "test_b": 1.6, "test_new": 4.0}, baseline)}
    assert v["test_a"].passed is True and v["test_a"].limit == pytest.approx(3.0)
    assert v["test_b"].passed is False
    assert v["test_b"].line() == "FAIL test_b: 1.600 x reference is past its limit 1.500 (baseline 1.000 x margin 1.50)"
    assert v["test_new"].passed is None and "no baseline" in v["test_new"].line()
    assert micro.missing({"test_a": 1.0}, baseline) == ["test_b"]


def test_command_fails_naming_the_slowed_benchmark(tmp_path, capsys):
    baseline = tmp_path / "micro.json"
    baseline.write_text(json.dumps({"margin": 2.0, "measured": {"date": "2026-12-02"}, "benchmarks": {"test_prepare_request": {"ratio": 3.0}, "test_stream_relay_per_token": {"ratio": 2.5}}}))
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(_bench_json({"test_prepare_request": (0.0090, 0.003), "test_stream_relay_per_token": (0.0080, 0.003)})))
    assert micro.main(["--baseline", str(baseline), "--from-json", str(ok)]) == 0
    assert "micro: passed" in capsys.readouterr().out
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_bench_json({"test_prepare_request": (0.0090, 0.003), "test_stream_relay_per_token": (0.0180, 0.003)})))
    assert micro.main(["--baseline", str(baseline), "--from-json", str(slow)]) == 1
    err = capsys.readouterr().err
    assert "FAIL test_stream_relay_per_token: 6.000 x reference is past its limit 5.000" in err
    # A benchmark that silently stopped running is a failure too.
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(_bench_json({"test_prepare_request": (0.0090, 0.003)})))
    assert micro.main(["--baseline", str(baseline), "--from-json", str(partial)]) == 1
    assert "test_stream_relay_per_token: in the baseline but not measured" in capsys.readouterr().out


def test_committed_baseline_covers_every_micro_benchmark_and_says_where_it_came_from():
    doc = json.loads(micro.BASELINE.read_text())
    tree = ast.parse(Path(micro.TESTS).read_text())
    benchmarks = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_") and "benchmark" in [a.arg for a in f.args.args]}
    assert benchmarks == set(doc["benchmarks"])
    assert {"test_prepare_request", "test_lsp_context_build", "test_stream_relay_per_token", "test_controller_decide"} <= benchmarks
    m = doc["measured"]
    assert {"date", "machine", "command", "versions", "sessions"} <= set(m)
    assert "quickdraft.bench.micro" in m["command"] and "--update-baseline" in m["command"]
    assert doc["margin"] >= 1.5
    assert all(b["ratio"] > 0 for b in doc["benchmarks"].values())
