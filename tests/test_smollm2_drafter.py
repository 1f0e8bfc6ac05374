"""training/smollm2_drafter.py: prompts cut where a completion starts, bucketed by
length, drafters shaped for the target, and a smoke run that trains and measures."""

import json
import random
from types import SimpleNamespace

import pytest
import torch

from quickdraft.prompt_format import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX
from training import smollm2_drafter as sd


def test_a_fim_sample_is_cut_after_its_middle_token():
    text = f"{FIM_PREFIX}def f():\n{FIM_SUFFIX}\n    return 1\n{FIM_MIDDLE}    x = 1\n<|endoftext|>"
    assert sd.completion_prompt(text, random.Random(0)) == text[: text.index(FIM_MIDDLE) + len(FIM_MIDDLE)]


def test_a_plain_sample_is_cut_at_a_line_start_in_its_second_half():
    text = "".join(f"line {i}\n" for i in range(40))
    for seed in range(5):
        cut = sd.completion_prompt(text, random.Random(seed))
        assert cut.endswith("\n") and len(text) // 2 < len(cut) < len(text)
    assert sd.completion_prompt("no line break", random.Random(0)) is None


def test_prompts_go_to_the_largest_length_they_reach_keeping_their_end():
    prompts = [list(range(n)) for n in (5, 40, 70, 130, 20)]
    b = sd.bucket_prompts(prompts, [16, 64, 128], cap=10)
    assert sorted(b) == [16, 64, 128]
    assert b[16].tolist() == [list(range(24, 40)), list(range(4, 20))]
    assert b[64].tolist() == [list(range(6, 70))]
    assert b[128].tolist() == [list(range(2, 130))]
    assert sd.bucket_prompts(prompts, [16], cap=1)[16].shape == (1, 16)


def test_the_drafter_is_as_wide_as_a_smollm2_target():
    cfg = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64,
                          intermediate_size=1536, rms_norm_eps=1e-5, rope_parameters={"rope_theta": 100000.0},
                          max_position_embeddings=8192)
    d = sd.drafter_config(cfg, vocab_size=49159, slot_id=49158, slots=7, layers=2)
    assert d.aux_layer_ids == (2, 15, 27) and d.target_hidden_size == 576 and d.head_dim == 64
    assert d.rope_theta == 100000.0 and d.parallel_slots == 7
    v = d.vllm_config()
    assert v["ptd_token_id"] == 49158 and v["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert "ptd_token_id" not in sd.drafter_config(cfg, 49159, 49158, slots=0, layers=1).vllm_config()


@pytest.mark.slow
def test_smoke_run_trains_every_drafter_and_measures_them(tmp_path):
    pytest.importorskip("tree_sitter_python")
    from tests.test_smollm2_fim import _fake_site_packages
    from training import eagle3

    site = _fake_site_packages(tmp_path / "lib" / "site-packages")
    out = tmp_path / "run"
    assert sd.main(["--smoke", "--site-packages", str(site), "--out", str(out), "--workers", "1"]) == 0
    s = json.loads((out / "smollm2_drafter_summary.json").read_text())
    assert s["steps"] == 30
    for name, (slots, layers, _, _) in sd.ROLES.items():
        d = eagle3.Eagle3Drafter.load(out / f"drafter-{name}")
        assert d.cfg.parallel_slots == slots and len(d.layers) == layers
        measured = s["served_heldout_prompts"][name]
        assert set(measured) >= {"1", "3", "5"}
        for k, m in measured.items():
            assert 1.0 <= m["served_al"] <= int(k) + 1 and m["steps"] > 0
            assert len(m["served_per_position"]) == int(k)
    assert set(s["teacher_forced_held_out"]) == set(sd.ROLES)

    # The served figure is what a real draft-and-verify decoder gets with the saved weights.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quickdraft.prompt_format import stop_token_ids
    from training.reference import speculative_greedy
    from training.served_acceptance import mean_al, prompt_ids

    target = AutoModelForCausalLM.from_pretrained(str(out / "tiny-target"), dtype=torch.float32).eval()
    stops = stop_token_ids(AutoTokenizer.from_pretrained(str(out / "tiny-target")).get_vocab())
    prompts = prompt_ids(out / "tiny-target", 4)
    for name, parallel in (("p-eagle", True), ("eagle3", False)):
        d = eagle3.Eagle3Drafter.load(out / f"drafter-{name}").eval()
        with torch.no_grad():
            m = sd.measure(target, {name: d}, prompts, 12, stops)[name]
            ref = [speculative_greedy(target, d, ids, 12, 5, parallel, set(stops)) for ids in prompts]
        assert m[5]["served_al"] == mean_al([r.accepted_per_step for r in ref]), name
        assert m[5]["steps"] == sum(len(r.accepted_per_step) for r in ref), name



@pytest.mark.slow
def test_prompt_anchors_train_on_the_prompt_too(tmp_path):
    """--prompt-anchors: every prompt position's next token and random prompt anchors
    join the generated ones, so a step supervises far more positions."""
    pytest.importorskip("tree_sitter_python")
    from tests.test_smollm2_fim import _fake_site_packages

    site = _fake_site_packages(tmp_path / "lib" / "site-packages")
    out = tmp_path / "run"
    assert sd.main(["--smoke", "--site-packages", str(site), "--out", str(out), "--workers", "1", "--max-steps", "2",
                    "--roles", "p-eagle-1l,p-eagle-served,eagle3", "--prompt-anchors", "8"]) == 0
    roles = ("p-eagle-1l", "p-eagle-served", "eagle3")
    s = json.loads((out / "smollm2_drafter_summary.json").read_text())
    assert s["steps"] == 2 and set(s["teacher_forced_held_out"]) == set(roles)
    first = json.loads((out / "smollm2_drafter_log.jsonl").read_text().splitlines()[1])
    assert first["step"] == 1 and all(0 < first[r]["loss"] < 100 for r in roles), first
    with pytest.raises(SystemExit):
        sd.main(["--smoke", "--out", str(out), "--roles", "p-eagle,medusa"])
