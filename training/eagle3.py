"""The EAGLE-3 drafter as vLLM 0.32 runs it, in plain PyTorch, with its training losses.

One decoder layer (vLLM's ``LlamaForCausalLMEagle3``, llama_eagle3.py) that sees,
at position j, the embedding of token j+1 and a hidden state, and predicts token
j+2. The first pass takes ``fc(concat(aux hidden states of the target))``;
autoregressive steps feed back the layer's pre-norm output. Embedding and LM
head are the target's (not stored in the drafter checkpoint; vLLM shares them).

Parallel drafting (P-EAGLE, vLLM >= 0.16): after the last verified position the
drafter appends K-1 slots, each with the slot token's embedding and
``fc(mask_hidden)`` as hidden state, at the next positions, and drafts all K
tokens in one pass. Slot k sees the real positions up to the anchor and the
slots before it (plain causal attention over the chunk).

The same forward serves training (many anchors at once, with an attention
mask that gives every anchor its own chain) and the reference decoder in
training/reference.py that tests compare against vLLM.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DrafterConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    slot_token_id: int
    # Parallel slots the drafter was trained for (K-1 at most); 0 = autoregressive only.
    parallel_slots: int = 0
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    def vllm_config(self) -> dict:
        """config.json in the layout vLLM's llama_eagle3 loader reads."""
        cfg = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids), "use_aux_hidden_state": True},
            "torch_dtype": "bfloat16",
            "quickdraft": {"parallel_slots": self.parallel_slots},
        }
        if self.parallel_slots:
            cfg["ptd_token_id"] = self.slot_token_id
        return cfg


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding; x [..., T, D], positions [T] or [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float()[..., None] * inv  # [.., T, D/2]
    cos, sin = ang.cos(), ang.sin()
    if positions.dim() == 2:  # [B, T] -> [B, 1, T, D/2] to broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class DecoderLayer(nn.Module):
    """One drafter layer. The first takes [norm(embeds), norm(hidden)] (2d wide);
    later ones are plain pre-norm Llama layers over the residual stream."""

    def __init__(self, cfg: DrafterConfig, first: bool):
        super().__init__()
        self.cfg = cfg
        self.first = first
        d, h, kv, hd, i = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
        in_dim = 2 * d if first else d
        if first:
            self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(in_dim, h * hd, bias=False)
        self.k_proj = nn.Linear(in_dim, kv * hd, bias=False)
        self.v_proj = nn.Linear(in_dim, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, embeds, hidden, residual, positions, mask, past):
        cfg = self.cfg
        B, T, _ = hidden.shape
        if self.first:
            residual = hidden
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        else:
            residual = hidden + residual
            x = self.input_layernorm(residual)
        q = self.q_proj(x).view(B, T, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        q = rope(q, positions, cfg.rope_theta)
        k = rope(k, positions, cfg.rope_theta)
        kv_new = (k, v)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if mask is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
        attn = self.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        residual = attn + residual
        h = self.post_attention_layernorm(residual)
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), residual, kv_new


# Our attribute names -> the names vLLM's loader maps (layer 0 is "midlayer").
_LAYER_PARAMS = {
    "hidden_norm.weight": "hidden_norm.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "q_proj.weight": "self_attn.q_proj.weight",
    "k_proj.weight": "self_attn.k_proj.weight",
    "v_proj.weight": "self_attn.v_proj.weight",
    "o_proj.weight": "self_attn.o_proj.weight",
    "gate_proj.weight": "mlp.gate_proj.weight",
    "up_proj.weight": "mlp.up_proj.weight",
    "down_proj.weight": "mlp.down_proj.weight",
}


def _vllm_prefix(i: int) -> str:
    return "midlayer." if i == 0 else f"layers.{i}."


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        fc_in = cfg.target_hidden_size * len(cfg.aux_layer_ids)
        self.fc = nn.Linear(fc_in, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg, first=(i == 0)) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mask_hidden = nn.Parameter(torch.zeros(1, fc_in)) if cfg.parallel_slots else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        # Residual-branch outputs start small so the first pass starts near fc(aux).
        for layer in self.layers:
            for lin in (layer.o_proj, layer.down_proj):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * len(self.layers)))
        if self.mask_hidden is not None:
            nn.init.normal_(self.mask_hidden, std=0.02)

    def slot_hidden(self) -> torch.Tensor:
        """The hidden state of a parallel slot: fc(mask_hidden), as vLLM precomputes it."""
        assert self.mask_hidden is not None, "drafter was not trained for parallel drafting"
        return self.fc(self.mask_hidden)[0]

    def layer(
        self,
        embeds: torch.Tensor,  # [B, T, d] target embeddings of the input tokens
        hidden: torch.Tensor,  # [B, T, d] fc(aux) or a previous step's pre-norm output
        positions: torch.Tensor,  # [T] or [B, T]
        mask: torch.Tensor | None,  # [T, S] bool, True = may attend; None = causal
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,  # per layer keys/values [B, kv, P, hd]
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One drafter pass over a chunk: (normed output for the LM head, pre-norm
        output fed back by autoregressive drafting, per-layer (k, v) of the chunk)."""
        h, residual = hidden, None
        kvs = []
        for i, lyr in enumerate(self.layers):
            h, residual, kv = lyr(embeds, h, residual, positions, mask, past[i] if past else None)
            kvs.append(kv)
        prenorm = h + residual
        return self.norm(prenorm), prenorm, kvs

    # --- checkpoints ---------------------------------------------------------

    def vllm_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under the names vLLM's llama_eagle3 loader maps."""
        out = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight}
        for i, lyr in enumerate(self.layers):
            for ours, theirs in _LAYER_PARAMS.items():
                if ours == "hidden_norm.weight" and not lyr.first:
                    continue
                out[_vllm_prefix(i) + theirs] = lyr.get_parameter(ours)
        if self.mask_hidden is not None:
            out["mask_hidden"] = self.mask_hidden
        return {k: v.detach() for k, v in out.items()}

    def save(self, out: Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(self.cfg.vllm_config(), indent=2) + "\n")
        (out / "quickdraft_drafter.json").write_text(json.dumps(asdict(self.cfg), indent=2) + "\n")
        save_file({k: v.to(dtype).contiguous().cpu() for k, v in self.vllm_state_dict().items()}, str(out / "model.safetensors"))

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype = torch.float32) -> "Eagle3Drafter":
        from safetensors.torch import load_file

        raw = json.loads((path / "quickdraft_drafter.json").read_text())
        raw["aux_layer_ids"] = tuple(raw["aux_layer_ids"])
        model = cls(DrafterConfig(**raw))
        theirs_to_ours = {"fc.weight": "fc.weight", "norm.weight": "norm.weight", "mask_hidden": "mask_hidden"}
        for i in range(len(model.layers)):
            for ours, theirs in _LAYER_PARAMS.items():
                theirs_to_ours[_vllm_prefix(i) + theirs] = f"layers.{i}.{ours}"
        state = {theirs_to_ours[k]: v.to(dtype) for k, v in load_file(str(path / "model.safetensors")).items()}
        model.load_state_dict(state, strict=True)
        return model.to(dtype)


# --- target features ------------------------------------------------------------


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, aux_layer_ids: tuple[int, ...],
                    logits_from: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [B, T, n*d], logits [B, T - logits_from, V]) from one target forward:
    the LM head runs from position ``logits_from`` on (a prompt's own positions
    teach a drafter nothing, and a 49k-token head over them dominates a step).

    Aux layer id i is the residual stream entering decoder layer i (id ==
    num_layers: leaving the last layer, before the final norm) — what vLLM's
    EagleModelMixin collects as hidden_states + residual.
    """
    layers = target.model.layers
    captured: dict[int, torch.Tensor] = {}
    hooks = []
    for i in aux_layer_ids:
        if i < len(layers):
            hooks.append(layers[i].register_forward_pre_hook(lambda m, args, kw, i=i: captured.__setitem__(i, kw.get("hidden_states", args[0] if args else None)), with_kwargs=True))
        else:
            hooks.append(target.model.norm.register_forward_pre_hook(lambda m, args, i=i: captured.__setitem__(i, args[0])))
    try:
        logits = target(input_ids=input_ids, logits_to_keep=input_ids.shape[1] - logits_from).logits
    finally:
        for h in hooks:
            h.remove()
    aux = torch.cat([captured[i] for i in aux_layer_ids], dim=-1)
    return aux, logits


# --- training -------------------------------------------------------------------


def chain_mask(n_real: int, anchors: torch.Tensor, steps: int, device) -> torch.Tensor:
    """Attention mask for real positions followed by `steps` slots per anchor.

    Layout: [real 0..n_real-1][anchor0 step1..steps][anchor1 step1..steps]...
    Real j sees real <= j. Slot (a, s) sees real <= a and slots (a, 1..s).
    """
    A = anchors.numel()
    n = n_real + A * steps
    m = torch.zeros(n, n, dtype=torch.bool, device=device)
    r = torch.arange(n_real, device=device)
    m[:n_real, :n_real] = r[:, None] >= r[None, :]
    rows = n_real + torch.arange(A * steps, device=device)
    a_of_row = anchors.repeat_interleave(steps)
    s_of_row = torch.arange(steps, device=device).repeat(A)
    m[rows, :n_real] = r[None, :] <= a_of_row[:, None]
    group = torch.arange(A, device=device).repeat_interleave(steps)
    same = group[:, None] == group[None, :]
    m[n_real:, n_real:] = same & (s_of_row[None, :] <= s_of_row[:, None])
    return m


class KVChain:
    """Per-layer keys/values of the chunks run so far, for the next pass to attend to."""

    def __init__(self, first: list[tuple[torch.Tensor, torch.Tensor]]):
        self.chunks = [first]

    def append(self, kvs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.chunks.append(kvs)

    def past(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            (torch.cat([c[i][0] for c in self.chunks], 2), torch.cat([c[i][1] for c in self.chunks], 2))
            for i in range(len(self.chunks[0]))
        ]


def soft_ce(logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the target's distribution, per position."""
    return -(teacher_probs * F.log_softmax(logits.float(), dim=-1)).sum(-1)


def depth_weights(n: int, decay: float = 0.8) -> list[float]:
    return [decay**k for k in range(n)]


def parallel_loss(
    drafter: Eagle3Drafter,
    embed: nn.Embedding,
    lm_head_weight: torch.Tensor,
    ids: torch.Tensor,  # [B, T]
    aux: torch.Tensor,  # [B, T, n*d]
    teacher: torch.Tensor,  # [B, T, V] target probabilities (position t predicts t+1)
    valid: torch.Tensor,  # [B, T] bool: position t's prediction may be trained on
    anchors: torch.Tensor,  # [A] real positions to attach slot chains to
    served_weight: float = 0.0,  # 0: every anchor alike; 1: anchors weighted as a decoder visits them
    served_k: int = 5,
    chain_condition: float = 0.0,  # 1: slot k learns only where the drafter's own drafts 1..k were right
    teacher_from: int = 0,  # teacher[:, i] is position teacher_from + i (target_features' logits_from)
) -> tuple[torch.Tensor, list[float]]:
    """P-EAGLE loss: real slots draft token 1, slot k of an anchor drafts token k+1.

    ``teacher_from`` > 0: the teacher starts at that position and the LM head
    runs only on real positions from ``teacher_from - 1`` on (a prompt's own
    positions teach nothing); the loss is the same while ``valid`` is False
    before it.

    ``served_weight`` > 0 mixes in weights from :func:`decoder_visit_weights`
    (the drafter's own chains, no gradient): a served decoder drafts only where
    its previous step ended, mostly right after a rejected draft, and for the
    shipped drafter those anchors accept far less at positions 2+ than the
    average anchor (docs/vllm-notes.md, "Teacher-forced vs served").

    ``chain_condition`` > 0 down-weights slot k of an anchor whose own earlier
    drafts were wrong: a verifier never reads it there, while the teacher's
    token after the *true* prefix pulls the slot toward a continuation of a
    token the drafter did not propose."""
    B, T = ids.shape
    M = drafter.cfg.parallel_slots
    n_real = T - 1
    hidden_real = drafter.fc(aux[:, :n_real])
    emb_real = embed(ids[:, 1:])
    A = anchors.numel()
    slot_emb = embed.weight[drafter.cfg.slot_token_id].expand(B, A * M, -1)
    slot_hidden = drafter.slot_hidden().expand(B, A * M, -1)
    pos = torch.cat([torch.arange(n_real, device=ids.device), (anchors[:, None] + torch.arange(1, M + 1, device=ids.device)).flatten()])
    mask = chain_mask(n_real, anchors, M, ids.device)
    out, _, _ = drafter.layer(torch.cat([emb_real, slot_emb], 1), torch.cat([hidden_real, slot_hidden], 1), pos, mask)
    t0 = teacher_from
    f = max(t0 - 1, 0)  # the first real slot with logits: slot j learns teacher position j + 1
    real_logits = out[:, f:n_real] @ lm_head_weight.T  # [B, n_real - f, V]: real slot j at index j - f
    slot_logits = (out[:, n_real:] @ lm_head_weight.T).view(B, A, M, -1)
    # Real slot j predicts what the target predicts at position j+1.
    losses, accs = [], []
    lab = torch.arange(f + 1, T, device=ids.device)
    ce0 = soft_ce(real_logits, teacher[:, lab - t0])
    w0 = valid[:, lab].float()
    aw = torch.ones(B, A, device=ids.device)
    if served_weight > 0 or chain_condition > 0:
        with torch.no_grad():
            greedy = torch.zeros(B, T, dtype=torch.long, device=ids.device)
            greedy[:, t0:] = teacher.argmax(-1)[:, : T - t0]
            d = torch.cat([real_logits[:, anchors - f].argmax(-1)[:, :, None], slot_logits.argmax(-1)], 2)
            chains = chain_lengths(d, greedy, anchors, valid)  # [B, A], up to M+1
    if served_weight > 0:
        aw = (1 - served_weight) + served_weight * decoder_visit_weights(chains.clamp(max=served_k), served_k, valid[:, anchors + 1])
        # Draft 1 of anchor j is real slot j's prediction: weigh it like the anchor's chain.
        w0 = w0.clone()
        w0[:, anchors - f] = w0[:, anchors - f] * aw
    losses.append((ce0 * w0).sum() / w0.sum().clamp(min=1))
    accs.append(((real_logits.argmax(-1) == teacher[:, lab - t0].argmax(-1)).float() * w0).sum().item() / max(1.0, w0.sum().item()))
    for k in range(1, M + 1):
        lpos = (anchors + k + 1).clamp(max=T - 1)
        w = valid[:, lpos].float() * (anchors + k + 1 <= T - 1).float()[None] * aw
        if chain_condition > 0:
            w = w * ((1 - chain_condition) + chain_condition * (chains >= k).float())
        lg = slot_logits[:, :, k - 1]
        ce = soft_ce(lg, teacher[:, lpos - t0])
        losses.append((ce * w).sum() / w.sum().clamp(min=1))
        accs.append(((lg.argmax(-1) == teacher[:, lpos - t0].argmax(-1)).float() * w).sum().item() / max(1.0, w.sum().item()))
    weights = depth_weights(M + 1)
    loss = sum(wt * l for wt, l in zip(weights, losses)) / sum(weights)
    return loss, accs


def autoregressive_loss(
    drafter: Eagle3Drafter,
    embed: nn.Embedding,
    lm_head_weight: torch.Tensor,
    ids: torch.Tensor,
    aux: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    anchors: torch.Tensor,
    steps: int,
    teacher_from: int = 0,  # as parallel_loss's
) -> tuple[torch.Tensor, list[float]]:
    """EAGLE-3 training-time test: unroll `steps` draft passes, each feeding the
    previous pass's pre-norm output and the (accepted) true token."""
    B, T = ids.shape
    n_real = T - 1
    dev = ids.device
    out, prenorm, kv0 = drafter.layer(embed(ids[:, 1:]), drafter.fc(aux[:, :n_real]), torch.arange(n_real, device=dev), None)
    t0 = teacher_from
    f = max(t0 - 1, 0)
    logits = out[:, f:] @ lm_head_weight.T
    lab = torch.arange(f + 1, T, device=dev)
    w0 = valid[:, lab].float()
    losses = [(soft_ce(logits, teacher[:, lab - t0]) * w0).sum() / w0.sum().clamp(min=1)]
    accs = [((logits.argmax(-1) == teacher[:, lab - t0].argmax(-1)).float() * w0).sum().item() / max(1.0, w0.sum().item())]
    A = anchors.numel()
    hidden = prenorm[:, anchors]  # [B, A, d]
    cache = KVChain(kv0)
    r = torch.arange(n_real, device=dev)
    for s in range(1, steps):
        tok_pos = (anchors + 1 + s).clamp(max=T - 1)
        pos = anchors + s
        # Keys: real positions, then the slots of steps 1..s (A each, anchor-major per step).
        n_prev = A * (s - 1)
        mask = torch.zeros(A, n_real + n_prev + A, dtype=torch.bool, device=dev)
        mask[:, :n_real] = r[None, :] <= anchors[:, None]
        eye = torch.eye(A, dtype=torch.bool, device=dev)
        for j in range(s - 1):
            mask[:, n_real + j * A : n_real + (j + 1) * A] = eye
        mask[:, n_real + n_prev :] = eye
        out, prenorm_s, kvs = drafter.layer(embed(ids[:, tok_pos]), hidden, pos, mask, cache.past())
        cache.append(kvs)
        hidden = prenorm_s
        lg = out @ lm_head_weight.T
        lpos = (anchors + s + 1).clamp(max=T - 1)
        w = valid[:, lpos].float() * (anchors + s + 1 <= T - 1).float()[None]
        losses.append((soft_ce(lg, teacher[:, lpos - t0]) * w).sum() / w.sum().clamp(min=1))
        accs.append(((lg.argmax(-1) == teacher[:, lpos - t0].argmax(-1)).float() * w).sum().item() / max(1.0, w.sum().item()))
    weights = depth_weights(steps)
    loss = sum(wt * l for wt, l in zip(weights, losses)) / sum(weights)
    return loss, accs


# --- what a served decoder sees ----------------------------------------------------
#
# A greedy draft-and-verify decoder (vLLM, training/reference.py) drafts at anchor a
# (bonus token x_{a+1}) and, having accepted c drafts, drafts next at anchor a + c + 1.
# Its drafts at an anchor are exactly the teacher-forced ones there, so its
# per-step accepted counts are the teacher-forced chains at the anchors it visits;
# those are mostly anchors right after a rejected draft.


def chain_lengths(drafts: torch.Tensor, greedy: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Drafts accepted per anchor, [B, A] from drafts [B, A, K] (draft i of anchor a
    guesses token a+1+i), greedy [B, T] (greedy[:, t] = the target's token after t)
    and valid [B, T]. Chains stop where the known tokens or valid positions end."""
    B, A, K = drafts.shape
    T = greedy.shape[1]
    ok = torch.zeros(B, A, K, dtype=torch.bool, device=drafts.device)
    for i in range(K):
        lpos = anchors + 1 + i
        inside = lpos <= T - 1
        lp = lpos.clamp(max=T - 1)
        ok[:, :, i] = (drafts[:, :, i] == greedy[:, lp]) & valid[:, lp] & inside[None]
    return ok.int().cumprod(-1).sum(-1)


def decoder_visit_weights(chains: torch.Tensor, k: int, live: torch.Tensor | None = None) -> torch.Tensor:
    """How often a greedy K-draft decoder drafts at each anchor, [B, A], scaled to
    mean 1 over live anchors. Decoders start at each of the first k+1 anchors (a
    served request starts wherever its prompt ends, so no phase is special) and
    jump chain + 1 anchors per step."""
    B, A = chains.shape
    dev = chains.device
    chains = chains.clamp(max=k)
    visits = torch.zeros(B, A, device=dev)
    pos = torch.arange(min(k + 1, A), device=dev)[None].repeat(B, 1)  # [B, S]
    rows = torch.arange(B, device=dev)[:, None].expand_as(pos)
    while True:
        inside = pos < A
        if not inside.any():
            break
        p = pos.clamp(max=A - 1)
        visits.index_put_((rows[inside], p[inside]), torch.ones(int(inside.sum()), device=dev), accumulate=True)
        pos = torch.where(inside, pos + chains.gather(1, p) + 1, pos)
    if live is None:
        live = torch.ones(B, A, dtype=torch.bool, device=dev)
    visits = visits * live
    return visits * live.sum().clamp(min=1) / visits.sum().clamp(min=1e-9)


def decoder_steps(chains: list[int], k: int) -> list[int]:
    """Per-step accepted counts of a greedy K-draft decoder that starts at anchor 0
    (the prompt's end): what vLLM's per-request counters report."""
    out, a = [], 0
    while a < len(chains):
        c = min(chains[a], k)
        out.append(c)
        a += c + 1
    return out


def mean_acceptance_length(per_depth_match: list[float], k: int) -> float:
    """1 + sum over positions of P(all drafts up to it accepted), from the
    cumulative match rates measured with teacher forcing."""
    return 1.0 + sum(per_depth_match[:k])
