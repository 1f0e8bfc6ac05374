"""The embedded target: a small Qwen3ForCausalLM trained on packed code samples."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TargetShape:
    hidden_size: int = 256
    num_hidden_layers: int = 6
    intermediate_size: int = 1024
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0


def make_target(vocab_size: int, shape: TargetShape, eos_ids: list[int]):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=eos_ids[0],
        eos_token_id=eos_ids[0],
        pad_token_id=eos_ids[0],
        rms_norm_eps=1e-6,
        attention_dropout=0.0,
    )
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = eos_ids
    model.generation_config.pad_token_id = eos_ids[0]
    model.generation_config.bos_token_id = eos_ids[0]
    return model


def lm_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def cosine_lr(frac: float, peak: float, warmup_frac: float = 0.03, floor: float = 0.1) -> float:
    if frac < warmup_frac:
        return peak * frac / warmup_frac
    p = min(1.0, (frac - warmup_frac) / (1 - warmup_frac))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def train_target(
    model,
    data: torch.Tensor,  # [N, seq_len + 1] token ids on the device
    seconds: float,
    batch_size: int,
    lr: float,
    log,
    eval_fn=None,
    seed: int = 0,
) -> list[dict]:
    """Train until `seconds` have passed; the LR schedule follows elapsed time."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=data.is_cuda)
    model.train()
    history = []
    start = time.time()
    step = 0
    tokens = 0
    from tqdm import tqdm

    bar = tqdm(total=int(seconds), desc="target", unit="s")
    last_bar = 0
    while True:
        elapsed = time.time() - start
        if elapsed >= seconds:
            break
        frac = elapsed / seconds
        for group in opt.param_groups:
            group["lr"] = cosine_lr(frac, lr)
        idx = torch.randint(0, data.shape[0], (batch_size,), generator=g)
        batch = data[idx.to(data.device)]
        with torch.autocast(device_type=data.device.type, dtype=torch.bfloat16, enabled=data.is_cuda):
            loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += batch.numel()
        if step % 50 == 0 or step == 1:
            rec = {"step": step, "seconds": round(elapsed, 1), "tokens": tokens, "loss": round(loss.item(), 4), "lr": opt.param_groups[0]["lr"]}
            if eval_fn is not None and step % 500 == 0:
                rec["held_out_loss"] = round(eval_fn(), 4)
                model.train()
            history.append(rec)
            log(rec)
        if int(elapsed) > last_bar:
            bar.update(int(elapsed) - last_bar)
            last_bar = int(elapsed)
    bar.close()
    model.eval()
    return history


@torch.no_grad()
def eval_loss(model, data: torch.Tensor, batch_size: int = 32, max_batches: int = 20) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, min(len(data), batch_size * max_batches), batch_size):
        batch = data[i : i + batch_size]
        with torch.autocast(device_type=data.device.type, dtype=torch.bfloat16, enabled=data.is_cuda):
            total += lm_loss(model, batch).item() * len(batch)
        n += len(batch)
    return total / max(1, n)


@torch.no_grad()
def greedy_generate(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of equal-length prompts [B, P] -> [B, P + new_tokens] (KV cache)."""
    from transformers import DynamicCache

    model.eval()
    cache = DynamicCache()
    out = [prompts]
    with torch.autocast(device_type=prompts.device.type, dtype=torch.bfloat16, enabled=prompts.is_cuda):
        logits = model(input_ids=prompts, past_key_values=cache, use_cache=True).logits[:, -1]
        for _ in range(new_tokens):
            nxt = logits.float().argmax(-1, keepdim=True)
            out.append(nxt)
            logits = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.cat(out, dim=1)
