"""SpecConfig and KSchedule: labels, validation, and vLLM 0.32's schedule semantics."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from quickdraft.server.controller import KSchedule, SpecConfig, default_candidates, engine_speculative_config


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
    (((1, 8, 0),), "speculation off"),
])
def test_schedule_validation(ranges, msg):
    with pytest.raises(ValueError, match=msg):
        KSchedule(True, ranges)


def test_schedule_lookup_carries_forward_like_vllm():
    s = KSchedule(True, ((1, 2, 7), (3, 6, 5), (10, 16, 3)))
    assert [s.k_for(b) for b in (1, 2, 3, 6, 7, 9, 10, 16, 17, 500)] == [7, 7, 5, 5, 5, 5, 3, 3, 3, 3]
    assert s.max_k == 7 and not s.is_uniform
    assert s.config_at(4) == SpecConfig(True, 5)
    assert s.to_vllm() == [(1, 2, 7), (3, 6, 5), (10, 16, 3)]
    assert s.label() == "parallel 1-2:K7 3-6:K5 10+:K3"


def test_from_per_batch_compresses_and_capped_merges():
    s = KSchedule.from_per_batch(False, [7, 7, 5, 5, 5, 3])
    assert s.ranges == ((1, 2, 7), (3, 5, 5), (6, 6, 3))
    capped = s.capped(5)
    assert capped.ranges == ((1, 5, 5), (6, 6, 3))
    assert s.capped(0) is None


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
        s = KSchedule(True, tuple(ranges))
        max_seqs = 40
        dense = lookup(s.to_vllm(), vllm_max_batch_size=max_seqs, vllm_num_speculative_tokens=s.max_k)
        assert [s.k_for(b) for b in range(1, max_seqs + 1)] == dense[1:], ranges


def test_engine_speculative_config():
    assert engine_speculative_config(SpecConfig.off(), None, drafter="d") is None
    plain = engine_speculative_config(SpecConfig(True, 5), None, drafter="d")
    assert plain == {"method": "eagle3", "model": "d", "num_speculative_tokens": 5, "parallel_drafting": True}
    # a uniform schedule stays a plain config (dynamic speculation forces piecewise CUDA graphs)
    assert engine_speculative_config(SpecConfig(True, 5), KSchedule.uniform(SpecConfig(True, 5), 64),
                                     drafter="d") == plain
    s = KSchedule(False, ((1, 2, 7), (3, 64, 3)))
    d = engine_speculative_config(s.config_at(1), s, drafter="d")
    assert d["num_speculative_tokens"] == 7 and d["parallel_drafting"] is False
    assert d["num_speculative_tokens_per_batch_size"] == [(1, 2, 7), (3, 64, 3)]
    with pytest.raises(ValueError, match="one drafting mode"):
        engine_speculative_config(SpecConfig(True, 3), s, drafter="d")
