"""The training side's served-acceptance measure (training/eagle3.py): per-step
accepted counts a greedy decoder gets, derived from teacher-forced chains,
equal those of training/reference.py's decoder (which
tests/integration/test_served_acceptance.py holds equal to vLLM's)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from training import eagle3  # noqa: E402

EMBEDDED = Path(__file__).resolve().parents[1] / "quickdraft" / "models" / "embedded"


def test_decoder_steps_jump_chain_plus_one():
    assert eagle3.decoder_steps([2, 9, 9, 0, 5, 1, 0], 3) == [2, 0, 3]
    assert eagle3.decoder_steps([], 5) == []


def test_visit_weights_count_decoders_from_every_phase():
    # k=1, starts at anchors 0 and 1: 0 -> 2 -> end; 1 -> 2 -> end.
    w = eagle3.decoder_visit_weights(torch.tensor([[1, 0, 1, 0]]), 1)
    assert w.tolist() == [[1.0, 1.0, 2.0, 0.0]]
    # Every chain full: each anchor is visited by exactly one of the k+1 decoders.
    assert eagle3.decoder_visit_weights(torch.full((2, 12), 3), 3).tolist() == [[1.0] * 12] * 2


def test_visit_weights_ignore_dead_anchors():
    live = torch.tensor([[True, True, False, False]])
    w = eagle3.decoder_visit_weights(torch.zeros(1, 4, dtype=torch.long), 1, live)
    assert w[0, 2:].tolist() == [0.0, 0.0] and abs(w.sum().item() - 2.0) < 1e-6


def test_parallel_loss_served_weight_zero_is_the_old_loss_and_one_changes_it():
    cfg = eagle3.DrafterConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48,
                               vocab_size=50, target_hidden_size=32, aux_layer_ids=(0, 1), slot_token_id=3, parallel_slots=3,
                               num_hidden_layers=2)
    torch.manual_seed(0)
    d = eagle3.Eagle3Drafter(cfg)
    embed = torch.nn.Embedding(50, 32)
    head = torch.randn(50, 32)
    B, T = 2, 20
    ids = torch.randint(0, 50, (B, T))
    aux = torch.randn(B, T, 64)
    teacher = torch.softmax(torch.randn(B, T, 50) * 3, -1)
    valid = torch.ones(B, T, dtype=torch.bool)
    anchors = torch.arange(7, T - 2)
    base, _ = eagle3.parallel_loss(d, embed, head, ids, aux, teacher, valid, anchors)
    zero, _ = eagle3.parallel_loss(d, embed, head, ids, aux, teacher, valid, anchors, served_weight=0.0)
    one, _ = eagle3.parallel_loss(d, embed, head, ids, aux, teacher, valid, anchors, served_weight=1.0, served_k=3)
    assert torch.equal(base, zero)
    assert not torch.allclose(base, one)
    one.backward()
    assert d.mask_hidden.grad is not None


@pytest.mark.slow
@pytest.mark.parametrize("parallel,k", [(True, 5), (False, 3)])
def test_teacher_forced_chains_at_visited_anchors_are_the_reference_decoders_steps(parallel, k):
    from transformers import AutoModelForCausalLM

    from training.reference import speculative_greedy
    from training.served_acceptance import anchor_chains, prompt_ids, stop_ids

    target = AutoModelForCausalLM.from_pretrained(str(EMBEDDED / "target"), dtype=torch.float32).eval()
    drafter = eagle3.Eagle3Drafter.load(EMBEDDED / ("drafter-p-eagle" if parallel else "drafter-eagle3")).eval()
    stops = set(stop_ids(EMBEDDED / "target"))
    compared = 0
    for ids in prompt_ids(EMBEDDED / "target", 3, prefix_only=True):
        ref = speculative_greedy(target, drafter, ids, 32, k, parallel, stops)
        steps = eagle3.decoder_steps(anchor_chains(target, drafter, ids, ref.tokens, k), k)
        # The last step may run past the known tokens (chains stop there).
        assert steps[:-1] == ref.accepted_per_step[: len(steps) - 1]
        compared += sum(steps[:-1])
    assert compared > 0, "nothing accepted: the comparison would be vacuous"


def test_chain_condition_drops_slots_after_a_wrong_draft():
    cfg = eagle3.DrafterConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48,
                               vocab_size=50, target_hidden_size=32, aux_layer_ids=(0, 1), slot_token_id=3, parallel_slots=3,
                               num_hidden_layers=2)
    torch.manual_seed(1)
    d = eagle3.Eagle3Drafter(cfg)
    embed, head = torch.nn.Embedding(50, 32), torch.randn(50, 32)
    ids, aux = torch.randint(0, 50, (1, 16)), torch.randn(1, 16, 64)
    teacher = torch.softmax(torch.randn(1, 16, 50) * 3, -1)
    valid = torch.ones(1, 16, dtype=torch.bool)
    # A random drafter is almost never right, so fully conditioned slots get no weight
    # and their losses (all but draft 1's) vanish; the mean over depths shrinks.
    base, _ = eagle3.parallel_loss(d, embed, head, ids, aux, teacher, valid, torch.arange(5, 14))
    cond, _ = eagle3.parallel_loss(d, embed, head, ids, aux, teacher, valid, torch.arange(5, 14), chain_condition=1.0)
    assert cond.item() < 0.5 * base.item()


@pytest.mark.parametrize("kind", ["parallel", "parallel-served", "autoregressive"])
def test_a_loss_from_the_first_weighed_position_equals_the_whole_one(kind):
    """teacher_from / logits_from: the LM heads run only where a draft can weigh
    (after the prompt), and the loss, accuracies and gradients stay the same."""
    slots = 0 if kind == "autoregressive" else 3
    cfg = eagle3.DrafterConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48,
                               vocab_size=50, target_hidden_size=32, aux_layer_ids=(0, 1), slot_token_id=3, parallel_slots=slots,
                               num_hidden_layers=1 if slots == 0 else 2)
    torch.manual_seed(2)
    d = eagle3.Eagle3Drafter(cfg)
    embed, head = torch.nn.Embedding(50, 32), torch.randn(50, 32)
    B, T, L = 2, 24, 12  # prompt of L tokens, then a continuation
    ids, aux = torch.randint(0, 50, (B, T)), torch.randn(B, T, 64)
    teacher = torch.softmax(torch.randn(B, T, 50) * 3, -1)
    from training.pipeline import valid_mask

    valid = valid_mask(ids, L, stop_ids=[7])
    anchors = torch.arange(L - 1, T - 2)
    f = L - 1  # the first position whose prediction weighs (valid's first True)

    def run(teacher_from: int):
        d.zero_grad()
        kw = {"served_weight": 1.0, "chain_condition": 1.0, "served_k": 3} if kind == "parallel-served" else {}
        if slots:
            loss, accs = eagle3.parallel_loss(d, embed, head, ids, aux, teacher[:, teacher_from:], valid, anchors,
                                              teacher_from=teacher_from, **kw)
        else:
            loss, accs = eagle3.autoregressive_loss(d, embed, head, ids, aux, teacher[:, teacher_from:], valid,
                                                    anchors, 4, teacher_from=teacher_from)
        loss.backward()
        return loss.detach(), accs, d.fc.weight.grad.clone()

    whole, cut = run(0), run(f)
    assert torch.allclose(whole[0], cut[0], atol=1e-6), (whole[0], cut[0])
    assert whole[1] == pytest.approx(cut[1])
    assert torch.allclose(whole[2], cut[2], atol=1e-6)


def test_target_features_logits_from_keeps_the_last_positions():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    t = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                                     num_key_value_heads=1, head_dim=16)).eval()
    ids = torch.randint(0, 40, (2, 10))
    aux, full = eagle3.target_features(t, ids, (0, 1, 3))
    aux_cut, cut = eagle3.target_features(t, ids, (0, 1, 3), logits_from=6)
    assert cut.shape == (2, 4, 40) and torch.allclose(cut, full[:, 6:], atol=1e-5)
    assert torch.equal(aux, aux_cut) and aux.shape == (2, 10, 96)
