"""Percentiles and histograms, the editor workload, and the figures of a run (pure logic)."""

from __future__ import annotations

import math
import random

import pytest

from quickdraft.bench.figures import summarize_run
from quickdraft.bench.loadgen import Result, RunOutcome, RunSpec
from quickdraft.bench.stats import LogHistogram, percentile, ratio, summarize
from quickdraft.bench.workload import MULTI, SINGLE, Workload, WorkloadSpec, cut, heldout_tasks, load_tasks, source_dir_tasks

# --- stats --------------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 95) == pytest.approx(4.8)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_summarize_uses_all_samples():
    xs = list(range(1, 101))
    s = summarize([float(x) for x in xs])
    assert s == {"n": 100, "mean": 50.5, "p50": 50.5, "p95": 95.05, "p99": 99.01, "max": 100.0}
    assert summarize([]) == {"n": 0}


def test_merged_histograms_give_the_percentiles_of_all_samples_not_their_average():
    rng = random.Random(3)
    fast = [rng.lognormvariate(math.log(0.05), 0.2) for _ in range(900)]
    slow = [rng.lognormvariate(math.log(0.8), 0.2) for _ in range(100)]
    merged = LogHistogram().extend(fast).merge(LogHistogram().extend(slow))
    exact = percentile(fast + slow, 99)
    assert merged.total == 1000
    assert merged.percentile(99) == pytest.approx(exact, rel=0.03)
    # What averaging per-run percentiles would have said: far off.
    averaged = (percentile(fast, 99) + percentile(slow, 99)) / 2
    assert abs(averaged - exact) / exact > 0.2
    roundtrip = LogHistogram.from_dict(merged.to_dict())
    assert roundtrip.percentile(50) == merged.percentile(50)
    with pytest.raises(ValueError):
        LogHistogram(growth=1.05).merge(merged)
    with pytest.raises(ValueError):
        LogHistogram().add(-1.0)


def test_ratio_is_nan_without_a_denominator():
    assert ratio(3.0, 2.0) == 1.5
    assert math.isnan(ratio(3.0, 0.0)) and math.isnan(ratio(None, 1.0)) and math.isnan(ratio(1.0, None))


# --- workload -------------------------------------------------------------------------------

SOURCE = '''import os


def load(path):
    """Read a file."""
    with open(path) as f:
        data = f.read()
    return data.strip()


class Cache:
    def __init__(self):
        self.items = {}

    def get(self, key, default=None):
        return self.items.get(key, default)
'''


def test_single_line_cut_completes_the_rest_of_one_line():
    spec = WorkloadSpec(prefix_chars=10_000, suffix_chars=10_000)
    rng = random.Random(0)
    for _ in range(50):
        t = cut(SOURCE, rng, SINGLE, spec, "m.py")
        assert t is not None and t.kind == SINGLE
        assert t.prefix + t.expected + t.suffix == SOURCE
        assert "\n" not in t.expected and t.expected
        assert t.suffix.startswith("\n")
        # the cursor sits after the line's indentation, inside its code
        line_start = t.prefix.rsplit("\n", 1)[-1]
        assert line_start.strip()
        assert t.stop == ("\n",) and t.max_tokens == spec.single_line_max_tokens


def test_multi_line_cut_takes_whole_lines_from_the_code_start():
    spec = WorkloadSpec(prefix_chars=10_000, suffix_chars=10_000)
    rng = random.Random(1)
    for _ in range(50):
        t = cut(SOURCE, rng, MULTI, spec, "m.py")
        assert t is not None and t.kind == MULTI
        assert t.prefix + t.expected + t.suffix == SOURCE
        assert t.expected.count("\n") >= 1
        assert t.prefix.rsplit("\n", 1)[-1].strip() == ""  # only indentation before the cursor on its line
        assert t.stop == () and t.max_tokens == spec.multi_line_max_tokens


def test_cut_truncates_prefix_and_suffix_to_the_budget():
    spec = WorkloadSpec(prefix_chars=40, suffix_chars=15)
    t = cut(SOURCE, random.Random(5), MULTI, spec)
    assert len(t.prefix) <= 40 and len(t.suffix) <= 15
    assert cut("", random.Random(0), SINGLE, spec) is None


def test_source_dir_tasks(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    (tmp_path / "b.go").write_text("package main\n\nfunc main() {\n\tprintln(\"hi\")\n\treturn\n}\n")
    (tmp_path / "notes.txt").write_text("not code\n" * 20)
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "x.js").write_text("var skipped = 1;\nvar also = 2;\n")
    spec = WorkloadSpec(source=str(tmp_path), tasks=40, seed=2, single_line_share=0.5)
    tasks = source_dir_tasks(spec, tmp_path)
    assert len(tasks) == 40
    assert {t.path for t in tasks} <= {"pkg/a.py", "b.go"}
    assert {t.kind for t in tasks} == {SINGLE, MULTI}
    assert tasks == source_dir_tasks(spec, tmp_path)  # deterministic
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("# notes\n")
    with pytest.raises(ValueError, match="no source files"):
        source_dir_tasks(spec, tmp_path / "docs")
    with pytest.raises(ValueError, match="not a directory"):
        load_tasks(WorkloadSpec(source=str(tmp_path / "missing")))


def test_heldout_packages_give_distinct_tasks_from_the_distributions_training_held_out():
    from training.corpus import HELD_OUT

    from quickdraft.bench.workload import HELDOUT_DISTRIBUTIONS, HELDOUT_PACKAGES_SOURCE, heldout_package_files

    assert set(HELDOUT_DISTRIBUTIONS) == set(HELD_OUT)
    files = heldout_package_files()
    assert files and {name.split("/")[0] for name in files.values()} >= {"click", "httpx", "rich"}
    tasks = load_tasks(WorkloadSpec(source=HELDOUT_PACKAGES_SOURCE, tasks=600, seed=3))
    assert len(tasks) == 600 and len({(t.prefix, t.suffix) for t in tasks}) == 600
    assert all(t.path in files.values() for t in tasks)


def test_heldout_tasks():
    tasks = heldout_tasks(WorkloadSpec(tasks=40, prefix_chars=800, suffix_chars=200))
    assert len(tasks) == 40
    assert all(len(t.prefix) <= 800 and (t.suffix is None or len(t.suffix) <= 200) for t in tasks)
    assert any(t.suffix is None for t in tasks) and any(t.suffix is not None for t in tasks)
    assert {t.kind for t in tasks} == {SINGLE, MULTI}


def test_plan_is_deterministic_cancels_only_inline_and_matches_the_shares():
    spec = WorkloadSpec(tasks=50, seed=7, cancel_share=0.3, cancel_after_ms=(20, 150), chat_share=0.1)
    w = Workload.from_spec(spec)
    plan = w.plan(4000)
    assert plan == Workload.from_spec(spec).plan(4000)
    assert plan[10:20] == w.plan(10, offset=10)
    chat = [p for p in plan if p.latency_class == "chat"]
    inline = [p for p in plan if p.latency_class == "inline"]
    assert all(p.cancel_after_s is None for p in chat)
    assert 0.08 < len(chat) / len(plan) < 0.12
    cancelled = [p for p in inline if p.cancel_after_s is not None]
    assert 0.27 < len(cancelled) / len(inline) < 0.33
    assert all(0.020 <= p.cancel_after_s <= 0.150 for p in cancelled)
    assert plan[0].task is w.tasks[0] and plan[50].task is w.tasks[0]
    assert Workload.from_spec(WorkloadSpec(tasks=50, seed=8)).plan(50) != plan[:50]


@pytest.mark.parametrize("bad", [dict(cancel_share=1.5), dict(chat_share=-0.1), dict(cancel_after_ms=(100, 20)), dict(tasks=0)])
def test_workload_spec_validation(bad):
    with pytest.raises(ValueError):
        WorkloadSpec(**bad).validate()


# --- figures of a run --------------------------------------------------------------------------


def _r(i, outcome="ok", cls="inline", ttft=0.1, tokens=11, decode=0.5, drafts=0, accepted=0, kind=SINGLE, error=""):
    return Result(index=i, kind=kind, latency_class=cls, planned_cancel=outcome == "cancelled", outcome=outcome, error=error,
                  ttft_s=ttft if outcome == "ok" else None, e2e_s=(ttft or 0) + decode if outcome == "ok" else None,
                  tokens=tokens if outcome == "ok" else 0, decode_s=decode if outcome == "ok" and ttft is not None else None,
                  drafts=drafts, accepted=accepted)


def test_figures_count_cancels_and_failures_where_they_belong():
    results = [
        _r(0, ttft=0.10, drafts=10, accepted=15),
        _r(1, ttft=0.20, drafts=10, accepted=5),
        _r(2, ttft=0.50),  # misses the inline SLO
        _r(3, outcome="cancelled"),
        _r(4, outcome="failed", error="UNAVAILABLE: engine restarting"),
        _r(5, cls="chat", ttft=0.9, tokens=21, decode=2.0),
        _r(6, ttft=None, tokens=0, decode=0.05),  # empty completion, answered at 0.05 s
    ]
    fig = summarize_run(RunOutcome(RunSpec(concurrency=2), results, wall_s=2.0), {"inline": 0.3})
    assert (fig["requests"], fig["completed"], fig["cancelled"], fig["failed"]) == (7, 5, 1, 1)
    assert fig["failures"] == {"UNAVAILABLE: engine restarting": 1}
    assert fig["ttft_ms"]["n"] == 4  # completed requests with a first token
    # inline: 0, 1 and the empty one within 300 ms; 2 missed; the failure counts as missed; the cancel does not count
    assert fig["slo"]["inline"] == {"slo_ms": 300.0, "requests": 5, "met": 3, "attainment": 0.6}
    assert fig["slo"]["chat"]["attainment"] == 1.0
    # acceptance: all accepted over all drafts, not a mean of per-request means
    assert fig["mean_acceptance_length"] == pytest.approx(1 + 20 / 20)
    # token-weighted TPOT: 3 x 0.5 s + 2.0 s over 3 x 10 + 20 tokens
    assert fig["tpot_ms_token_weighted"] == pytest.approx(1000 * 3.5 / 50)
    assert fig["tpot_ms"]["p50"] == pytest.approx(50.0)
    assert fig["output_tokens"] == 3 * 11 + 21 and fig["output_tokens_per_s"] == pytest.approx(54 / 2.0)
    assert set(fig["histograms"]) == {"ttft_s", "tpot_s", "e2e_s"}
