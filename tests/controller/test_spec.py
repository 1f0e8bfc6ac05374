"""SpecConfig, per step and per engine: labels, validation, vLLM 0.32's
per-batch-size schedule semantics, and old profiles' schedule dicts."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from quickdraft.server.speculative import SpecConfig, default_candidates


def test_labels_round_trip_and_off_is_unique():
    for c in default_candidates():
        assert SpecConfig.parse(c.label()) == c
    assert SpecConfig(True, 0) == SpecConfig.off()  # parallel is meaningless without drafts
    assert SpecConfig(True, 5).label() == "parallel K=5"
    assert SpecConfig(False, 3).label() == "autoregressive K=3"
    assert SpecConfig.off().label() == "off"
    assert SpecConfig.parse("ar k3") == SpecConfig(False, 3)


def test_default_candidates():
    labels = [c.label() for c in default_candidates()]
    assert labels == ["off"] + [f"autoregressive K={k}" for k in (1, 3, 5, 7)] + [
        f"parallel K={k}" for k in (1, 3, 5, 7)]


@pytest.mark.parametrize("bad", [-1, 17])
def test_k_out_of_range_says_how_to_fix(bad):
    with pytest.raises(ValueError, match="use 0"):
        SpecConfig(True, bad)


def test_parse_error_gives_an_example():
    with pytest.raises(ValueError, match="parallel K=5"):
        SpecConfig.parse("fast please")


@pytest.mark.parametrize("ranges, msg", [
    ((), "at least one"),
    (((2, 4, 3),), "start at batch 1"),
    (((1, 4, 3), (4, 8, 1)), "non-overlapping"),
    (((1, 0, 3),), "min_batch <= max_batch"),
])
def test_schedule_validation(ranges, msg):
    with pytest.raises(ValueError, match=msg):
        SpecConfig.scheduled(True, ranges)


def test_a_schedule_of_one_k_is_that_k_and_of_k0_is_off():
    assert SpecConfig.scheduled(True, ((1, 8, 5),)) == SpecConfig(True, 5)
    assert SpecConfig.scheduled(True, ((1, 4, 5), (5, 8, 5))).is_uniform
    assert SpecConfig.scheduled(True, ((1, 8, 0),)) == SpecConfig.off()


def test_schedule_lookup_carries_forward_like_vllm():
    s = SpecConfig.scheduled(True, ((1, 2, 7), (3, 6, 5), (10, 16, 3)))
    assert [s.k_for(b) for b in (1, 2, 3, 6, 7, 9, 10, 16, 17, 500)] == [7, 7, 5, 5, 5, 5, 3, 3, 3, 3]
    assert s.max_k == 7 and not s.is_uniform
    assert s.at(4) == SpecConfig(True, 5)
    assert s.label() == "parallel 1-2:K7 3-6:K5 10+:K3"
    assert SpecConfig.parse(s.label()).at(500) == SpecConfig(True, 3)


def test_from_per_batch_compresses_and_capped_merges():
    s = SpecConfig.from_per_batch(False, [7, 7, 5, 5, 5, 3])
    assert s.per_batch_size == ((1, 2, 7), (3, 5, 5), (6, 6, 3))
    assert s.capped(5).per_batch_size == ((1, 5, 5), (6, 6, 3))
    assert s.capped(3) == SpecConfig(False, 3)
    assert s.capped(0) == SpecConfig.off()


def test_old_profiles_schedule_dicts_still_load():
    old = {"parallel": False, "ranges": [[1, 6, 3], [7, 9, 5], [10, 64, 1]]}
    s = SpecConfig.from_dict(old)
    assert s.k_for(1) == 3 and s.k_for(8) == 5 and s.k_for(64) == 1
    assert SpecConfig.from_dict(s.to_dict()) == s


def _vllm_lookup():
    """vLLM 0.32's own lookup builder, loaded from its file (importing the
    vllm package takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "v1" / "spec_decode" / "dynamic" / "utils.py"
    if not path.exists():
        pytest.skip("this vLLM has no dynamic speculative decoding")
    mod_spec = importlib.util.spec_from_file_location("_vllm_dynamic_sd_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.build_dynamic_sd_schedule_lookup


def test_k_for_matches_vllm_dense_lookup_on_random_schedules():
    lookup = _vllm_lookup()
    rng = random.Random(7)
    for _ in range(200):
        ranges, start = [], 1
        for _ in range(rng.randint(1, 4)):
            end = start + rng.randint(0, 6)
            ranges.append((start, end, rng.randint(0, 7)))
            start = end + 1 + rng.choice((0, 0, 2))  # gaps too
        if max(r[2] for r in ranges) == 0:
            continue
        s = SpecConfig.scheduled(True, ranges)
        max_seqs = 40
        dense = lookup(list(s.ranges(max_seqs)), vllm_max_batch_size=max_seqs, vllm_num_speculative_tokens=s.max_k)
        assert [s.k_for(b) for b in range(1, max_seqs + 1)] == dense[1:], ranges
        assert s.dense(max_seqs) == [0] + dense[1:]


def test_to_vllm():
    assert SpecConfig.off().to_vllm("d") is None
    plain = SpecConfig(True, 5).to_vllm("d")
    # a uniform K leaves the schedule out (dynamic speculation changes vLLM's CUDA-graph plan)
    assert plain == {"method": "eagle3", "model": "d", "num_speculative_tokens": 5, "parallel_drafting": True}
    assert SpecConfig.scheduled(True, ((1, 64, 5),)).to_vllm("d") == plain
    s = SpecConfig.scheduled(False, ((1, 2, 7), (3, 64, 3)))
    d = s.to_vllm("d")
    assert d["num_speculative_tokens"] == 7 and d["parallel_drafting"] is False
    assert d["num_speculative_tokens_per_batch_size"] == [[1, 2, 7], [3, 64, 3]]
    with pytest.raises(ValueError, match="needs a drafter"):
        s.to_vllm(None)
