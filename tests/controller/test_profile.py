"""Profiles: one JSON per (hardware, model, drafter, vLLM version); restarts
begin from the last good config; bad files are logged and ignored."""

from __future__ import annotations

import json
import logging

import pytest

from quickdraft.bench.controller_sim import CROSSING_ACCEPTANCE, CROSSING_COST, FakeClock, SimulatedEngine, calibrated
from quickdraft.server.controller import (
    Controller,
    EngineSnapshot,
    ProfileKey,
    ProfileStore,
    load_into,
    save_from,
)
from quickdraft.server.speculative import SpecConfig

KEY = ProfileKey("AMD EPYC (2 cores)", "quickdraft/embedded-target", "drafter-p-eagle", "0.32.0")


@pytest.fixture(scope="module")
def tuned():
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=0)
    ctl, _ = calibrated(eng)
    return ctl


def test_round_trip_restores_config_and_estimates(tmp_path, tuned):
    store = ProfileStore(tmp_path)
    path = save_from(tuned, store, KEY)
    assert path.parent == tmp_path and path.name.endswith(".json")
    assert tuned.state().profile_path == str(path)
    fresh = Controller(clock=FakeClock())
    assert fresh.start_config() == SpecConfig.off()
    assert load_into(fresh, store, KEY)
    start = fresh.start_config()
    assert not start.is_uniform and start == tuned.active_engine
    assert start.at(1) == SpecConfig(True, 7)
    for load in (1, 8):
        a, b = fresh.recommend(load), tuned.recommend(load)
        assert a.engine == b.engine
        assert a.prediction.tpot_s == pytest.approx(b.prediction.tpot_s, rel=1e-3)
    assert fresh.estimator.acceptance.expected_length("parallel", 5) == pytest.approx(
        tuned.estimator.acceptance.expected_length("parallel", 5), rel=1e-3)


def test_missing_profile_is_not_an_error(tmp_path, caplog):
    ctl = Controller(clock=FakeClock())
    with caplog.at_level(logging.INFO):
        assert not load_into(ctl, ProfileStore(tmp_path / "nowhere"), KEY)
    assert "no tuned profile" in caplog.text
    assert ctl.start_config() == SpecConfig.off()


@pytest.mark.parametrize("content", [
    "{not json",
    "[]",
    json.dumps({"schema": 999}),
    json.dumps({"schema": 1, "config": "warp speed", "key": None}),
])
def test_corrupt_or_foreign_files_are_logged_and_ignored(tmp_path, caplog, content, tuned):
    store = ProfileStore(tmp_path)
    path = store.path_for(KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    ctl = Controller(clock=FakeClock())
    with caplog.at_level(logging.WARNING):
        assert not load_into(ctl, store, KEY)
    assert "ignoring" in caplog.text
    assert ctl.start_config() == SpecConfig.off()


def test_bad_contents_with_the_right_key_are_ignored(tmp_path, caplog, tuned):
    store = ProfileStore(tmp_path)
    save_from(tuned, store, KEY)
    data = json.loads(store.path_for(KEY).read_text())
    data["step_model"]["cells"][0]["recent"] = [-1.0]  # a negative step time
    store.path_for(KEY).write_text(json.dumps(data))
    ctl = Controller(clock=FakeClock())
    with caplog.at_level(logging.WARNING):
        assert not load_into(ctl, store, KEY)
    assert ctl.start_config() == SpecConfig.off()
    assert not ctl.estimator.ready  # nothing half-loaded


def test_profiles_are_per_key(tmp_path, tuned):
    store = ProfileStore(tmp_path)
    other = ProfileKey("NVIDIA H200 x1", KEY.model, KEY.drafter, KEY.vllm_version)
    assert store.path_for(other) != store.path_for(KEY)
    save_from(tuned, store, KEY)
    assert not load_into(Controller(clock=FakeClock()), store, other)
    # a file renamed onto another key's path is recognised as foreign
    store.path_for(KEY).rename(store.path_for(other))
    assert not load_into(Controller(clock=FakeClock()), store, other)


def test_key_validation_and_default_directory():
    with pytest.raises(ValueError, match="ProfileKey.model"):
        ProfileKey("cpu", " ", "d", "0.32.0")
    assert str(ProfileStore().directory).endswith(".cache/quickdraft/profiles")
    # readable names, safe characters only
    name = ProfileKey("AMD EPYC 9R14 (2 cores)", "/models/Qwen3/", "a/b/p-eagle", "0.32.0").file_name()
    assert name.startswith("AMD-EPYC-9R14-2-cores__Qwen3__p-eagle__0.32.0__")
    assert all(ch.isalnum() or ch in "-_." for ch in name)


def test_last_good_config_is_what_gets_saved(tmp_path):
    """A probe or a KV fallback is not 'good'; an exploiting switch is."""
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=0)
    ctl, clock = calibrated(eng)
    good = ctl.start_config()
    clock.advance(100)
    ctl.observe_engine(EngineSnapshot(running=1, kv_cache_usage=0.96))
    d = ctl.decide()
    assert d.action == "fallback"
    ctl.applied(d)
    store = ProfileStore(tmp_path)
    save_from(ctl, store, KEY)
    fresh = Controller(clock=FakeClock())
    load_into(fresh, store, KEY)
    assert fresh.start_config() == good


def test_a_kv_cut_to_off_is_not_remembered_as_good():
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=0)
    ctl, clock = calibrated(eng)
    good = ctl.start_config()
    ctl.activate(SpecConfig(True, 1))
    clock.advance(100)
    ctl.observe_engine(EngineSnapshot(running=1, kv_cache_usage=0.99))
    d = ctl.decide()
    assert d.action == "fallback" and d.target == SpecConfig.off()
    ctl.applied(d)
    assert ctl.start_config() == SpecConfig(True, 1) != good


def test_a_profile_belongs_to_the_weights_not_only_to_their_path(tmp_path):
    """Retrained weights saved over the old ones (an upgrade of the embedded model) must not
    start from the old weights' profile: the fingerprint of a local folder is in the key."""
    from quickdraft.server.controller import weights_fingerprint, with_fingerprint

    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 1024)
    before = weights_fingerprint(str(model))
    assert before is not None and before == weights_fingerprint(str(model))  # stable
    assert with_fingerprint(str(model)) == f"{model} @{before}"
    (model / "model.safetensors").write_bytes(bytes(range(255, -1, -1)) * 1024)  # same size, new values
    after = weights_fingerprint(str(model))
    assert after != before
    key = lambda fp: ProfileKey(KEY.hardware, f"{model} @{fp}", KEY.drafter, KEY.vllm_version)  # noqa: E731
    assert key(before).file_name() != key(after).file_name()
    # A hub name is not a folder here: kept as it is.
    assert weights_fingerprint("Qwen/Qwen3-Coder-30B-A3B-Instruct") is None
    assert with_fingerprint("Qwen/Qwen3-Coder-30B-A3B-Instruct") == "Qwen/Qwen3-Coder-30B-A3B-Instruct"


def test_a_profile_saved_with_a_schedule_dict_still_loads():
    """Profiles written before the one config type kept a per-step label and a
    ``schedule`` dict of (min_batch, max_batch, K) ranges."""
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "data" / "intel_tune_profile.json").read_text())
    assert data["config"] == "autoregressive K=5" and "engine" not in data
    ctl = Controller(clock=FakeClock())
    ctl.restore(data)
    start = SpecConfig.scheduled(False, [(1, 6, 3), (7, 9, 5), (10, 16, 1)])
    assert ctl.start_config() == start and ctl.active_engine == start
    assert ctl.rebuild.seconds == pytest.approx(19.477, abs=1e-3) and ctl.rebuild.measured
    saved = ctl.profile_dict()
    assert saved["engine"] == start.to_dict() and saved["config"] == "autoregressive 1-6:K3 7-9:K5 10+:K1"
    fresh = Controller(clock=FakeClock())
    fresh.restore(saved)
    assert fresh.start_config() == start
