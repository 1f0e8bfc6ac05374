"""bench/replicas.py (`quickdraft bench replicas`) without Ray: where the typist pauses, the block order,
and the figures and ratios of session routing against round-robin."""

from __future__ import annotations

import math

import pytest

from quickdraft.bench import replicas as rb


def test_the_typist_pauses_at_word_and_line_ends_and_at_the_end():
    span = "x = 1\n    return x"
    points = rb.pause_points(span)
    assert points[-1] == len(span)
    assert points == sorted(set(points))
    # after "x", "=", "1" and the line break with the next indentation
    assert span[: points[0]] == "x"
    assert any(span[:p].endswith("\n    ") for p in points)


def test_modes_alternate_and_reverse_every_other_round():
    assert rb.schedule(["session", "round_robin"], 3) == [
        (1, "session"), (1, "round_robin"), (2, "round_robin"), (2, "session"), (3, "session"), (3, "round_robin")]


def _block(mode: str, round_no: int, replicas: list[tuple[int, int]]) -> dict:
    return {"mode": mode, "round": round_no, "replicas": [{"queried": q, "hit": h} for q, h in replicas]}


def _rows(mode: str, round_no: int, ttfts: list[float], failed: int = 0) -> list[dict]:
    rows = [{"mode": mode, "round": round_no, "ok": True, "ttft_ms": t, "server_ttft_ms": t / 2} for t in ttfts]
    return rows + [{"mode": mode, "round": round_no, "ok": False, "ttft_ms": None} for _ in range(failed)]


def test_figures_sum_the_replicas_counters_and_count_failures():
    f = rb.figures([_block("session", 1, [(1000, 800), (1000, 600)])], _rows("session", 1, [10.0, 20.0, 30.0, 40.0], failed=1))
    assert f["requests"] == 5 and f["failed"] == 1
    assert f["prefix_cache_hit_rate"] == pytest.approx(0.7)
    assert f["computed_tokens_per_request"] == pytest.approx(600 / 4)
    assert f["busiest_replica_share"] == pytest.approx(0.5)
    assert 10.0 <= f["ttft_p50_ms"] <= 40.0 and f["server_ttft_p50_ms"] == pytest.approx(f["ttft_p50_ms"] / 2)


def test_ratios_are_round_robin_over_session_pooled_and_per_round():
    blocks = [_block("session", 1, [(1000, 900), (1000, 900)]), _block("round_robin", 1, [(1000, 450), (1000, 450)]),
              _block("round_robin", 2, [(500, 250), (500, 250)]), _block("session", 2, [(500, 400), (500, 400)])]
    rows = (_rows("session", 1, [10.0] * 4) + _rows("round_robin", 1, [20.0] * 4)
            + _rows("round_robin", 2, [30.0] * 4) + _rows("session", 2, [10.0] * 4))
    res = rb.analyze(blocks, rows, ["session", "round_robin"])
    hit = res["ratios"]["prefix_cache_hit_rate"]
    assert hit["rounds"] == [pytest.approx(0.5), pytest.approx(0.5 / 0.8)]
    assert hit["pooled"] == pytest.approx((1400 / 3000) / (2600 / 3000))
    assert res["ratios"]["ttft_p50_ms"]["rounds"] == [pytest.approx(2.0), pytest.approx(3.0)]
    md = rb.markdown({"modes": ["session", "round_robin"], "result": res, "replicas": 2, "users": 4, "rounds": 2,
                      "blocks": [{**b, "seconds": 60.0, "replicas": [{**r, "homed_users": 2} for r in b["replicas"]]} for b in blocks]})
    assert "| ratio round_robin / session | pooled | per round |" in md and "| prefix-cache hit rate | 0.54 | [0.50, 0.62] |" in md


def test_a_mode_with_no_lookups_has_no_hit_rate():
    f = rb.figures([_block("session", 1, [(0, 0)])], _rows("session", 1, [5.0]))
    assert math.isnan(f["prefix_cache_hit_rate"])
