"""A reference greedy speculative decoder: what vLLM 0.32 computes, recomputed
from scratch every step with the PyTorch drafter in training/eagle3.py.

Used by tests to show that the drafter we train is the drafter vLLM runs: for
the same weights and prompt, the per-step accepted-draft counts here must
match vLLM's per-request counters (``per_request_spec_decode_metrics``).

Step structure (greedy): the verified sequence x_0..x_L ends with the bonus
token x_L, which has no target hidden state yet. The drafter's real slots are
j = 0..L-1 (token x_{j+1}, target aux hidden h_j); the last one is the anchor.
Parallel drafting appends K-1 slot positions L..L+K-2 and reads all K drafts
from one pass; autoregressive drafting runs K passes, each feeding back the
previous pass's pre-norm output. The target then scores x_L, d_1..d_K and
accepts drafts while they equal its own greedy tokens, plus one bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from training.eagle3 import Eagle3Drafter, KVChain, target_features


@dataclass
class SpecTrace:
    tokens: list[int]  # generated tokens
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def num_drafts(self) -> int:
        return len(self.accepted_per_step)


@torch.no_grad()
def drafts_for(target, drafter: Eagle3Drafter, seq: list[int], k: int, parallel: bool) -> list[int]:
    """K draft tokens following `seq` (whose last token is the unscored bonus)."""
    ids = torch.tensor([seq], dtype=torch.long)
    L = len(seq) - 1
    aux, _ = target_features(target, ids[:, :L], drafter.cfg.aux_layer_ids)
    embed = target.model.embed_tokens
    head = target.lm_head.weight
    emb = embed(ids[:, 1 : L + 1])
    hid = drafter.fc(aux.to(drafter.fc.weight.dtype))
    pos = torch.arange(L)
    if parallel:
        m = k - 1
        if m:
            emb = torch.cat([emb, embed.weight[drafter.cfg.slot_token_id].expand(1, m, -1)], 1)
            hid = torch.cat([hid, drafter.slot_hidden().expand(1, m, -1)], 1)
            pos = torch.cat([pos, torch.arange(L, L + m)])
        out, _, _ = drafter.layer(emb, hid, pos, None)
        return (out[0, L - 1 :] @ head.T).argmax(-1).tolist()
    out, prenorm, kv = drafter.layer(emb, hid, pos, None)
    drafts = [int((out[0, L - 1] @ head.T).argmax())]
    hidden = prenorm[:, L - 1 : L]
    cache = KVChain(kv)
    for s in range(1, k):
        tok = torch.tensor([[drafts[-1]]])
        out, hidden, kv = drafter.layer(embed(tok), hidden, torch.tensor([L - 1 + s]), torch.ones(1, L + s, dtype=torch.bool), cache.past())
        cache.append(kv)
        drafts.append(int((out[0, -1] @ head.T).argmax()))
    return drafts


@torch.no_grad()
def speculative_greedy(target, drafter: Eagle3Drafter | None, prompt: list[int], max_tokens: int, k: int, parallel: bool, stop_ids: set[int]) -> SpecTrace:
    """Greedy generation with draft-and-verify; `drafter=None` is plain greedy."""
    seq = list(prompt)
    logits = target(input_ids=torch.tensor([seq])).logits[0, -1]
    seq.append(int(logits.argmax()))
    trace = SpecTrace(tokens=[seq[-1]])
    while len(trace.tokens) < max_tokens and trace.tokens[-1] not in stop_ids:
        if drafter is None:
            logits = target(input_ids=torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
            trace.tokens.append(seq[-1])
            continue
        drafts = drafts_for(target, drafter, seq, k, parallel)
        scored = target(input_ids=torch.tensor([seq + drafts])).logits[0, len(seq) - 1 :].argmax(-1).tolist()
        accepted = 0
        while accepted < k and drafts[accepted] == scored[accepted]:
            accepted += 1
        trace.accepted_per_step.append(accepted)
        new = drafts[:accepted] + [scored[accepted]]
        for t in new:
            seq.append(t)
            trace.tokens.append(t)
            if t in stop_ids or len(trace.tokens) >= max_tokens:
                break
    return trace
