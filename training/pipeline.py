"""Train the embedded model end to end within a wall-clock budget.

    python -m training.pipeline --out DIR [--budget-s 540] [--smoke]

Steps, each with its own share of the budget: collect the corpus, train the
tokenizer, pack samples, train the target, generate greedy continuations of
training prompts (the drafters learn the target's own outputs), train the
P-EAGLE and the EAGLE-3 drafter on them, evaluate on held-out distributions,
and write everything the package ships plus a log and loss curves to DIR.
``--smoke`` runs the same steps at toy sizes on a CPU in a minute or two.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from quickdraft.prompt_format import DRAFT_SLOT, ENDOFTEXT, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, STOP_TOKENS
from training import corpus as corpus_mod
from training import eagle3, samples, target as target_mod
from training.tokenizer import save_tokenizer, special_ids, train_tokenizer


class Log:
    def __init__(self, path: Path):
        self.path = path
        self.t0 = time.time()
        self.records: list[dict] = []

    def __call__(self, msg) -> None:
        rec = msg if isinstance(msg, dict) else {"msg": msg}
        rec = {"t": round(time.time() - self.t0, 1), **rec}
        self.records.append(rec)
        line = json.dumps(rec)
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def pack(token_lists, seq_len: int) -> torch.Tensor:
    """Concatenate samples (each ends with <|endoftext|>) and cut [N, seq_len + 1] rows."""
    import numpy as np

    flat = np.concatenate([np.asarray(ids, dtype=np.int32) for ids in token_lists])
    n = len(flat) // (seq_len + 1)
    return torch.from_numpy(flat[: n * (seq_len + 1)].reshape(n, seq_len + 1)).long()


def exact_prompt(pre: list[int], suf: list[int] | None, length: int, ids: dict[str, int]) -> list[int] | None:
    """A prompt of exactly `length` tokens: the prefix cut on the left, the suffix
    on the right (FIM when `suf` is not None)."""
    if suf is None:
        return pre[-length:] if len(pre) >= length else None
    room = length - 3
    n_suf = min(len(suf), room // 3)
    n_pre = room - n_suf
    if len(pre) < n_pre:
        n_pre = len(pre)
        n_suf = min(len(suf), room - n_pre)
    if n_pre + n_suf != room:
        return None
    return [ids[FIM_PREFIX]] + pre[len(pre) - n_pre :] + [ids[FIM_SUFFIX]] + suf[:n_suf] + [ids[FIM_MIDDLE]]


def generation_set(tok, dist_files, n: int, length: int, ids: dict[str, int], seed: int):
    """(token prompts [n, length], text prompts for CPU benchmarks)."""
    rng = random.Random(seed)
    flat = [(d, p, t) for d, files in dist_files.items() for p, t in files]
    cands = []
    for _ in range(n * 2):
        dist, path, text = flat[rng.randrange(len(flat))]
        fim = rng.random() < 0.7
        prefix, suffix = samples.generation_prompt(text, rng, path, fim)
        if len(prefix) >= 200:
            cands.append((dist, path, prefix, suffix if fim else None))
    pres = tok.encode_batch([c[2] for c in cands], add_special_tokens=False)
    sufs = tok.encode_batch([c[3] or "" for c in cands], add_special_tokens=False)
    rows, texts = [], []
    for (dist, path, prefix, suffix), pre, suf in zip(cands, pres, sufs):
        row = exact_prompt(pre.ids, suf.ids if suffix is not None else None, length, ids)
        if row is None:
            continue
        rows.append(row)
        texts.append({"distribution": dist, "path": path, "prefix": prefix[-2000:], "suffix": suffix[:800] if suffix is not None else None})
        if len(rows) == n:
            break
    return torch.tensor(rows, dtype=torch.long), texts


def valid_mask(seqs: torch.Tensor, prompt_len: int, stop_ids: list[int]) -> torch.Tensor:
    """[B, T] True where position t's next-token prediction is inside the generated
    text, up to and including the first stop token."""
    B, T = seqs.shape
    valid = torch.zeros(B, T, dtype=torch.bool, device=seqs.device)
    valid[:, prompt_len - 1 : T - 1] = True
    gen = seqs[:, prompt_len:]
    is_stop = torch.zeros_like(gen, dtype=torch.bool)
    for s in stop_ids:
        is_stop |= gen == s
    # Positions after the first stop token predict junk the engine never produces.
    after = torch.cumsum(is_stop.int(), dim=1) - is_stop.int() > 0
    valid[:, prompt_len : T] &= ~after[:, : T - prompt_len]
    return valid


def train_drafters(target, drafters: dict, data: torch.Tensor, prompt_len: int, stop_ids, seconds: float, batch_size: int, lr: float, ar_steps: int, log):
    from tqdm import tqdm

    embed = target.model.embed_tokens
    head = target.lm_head.weight
    dev = data.device
    params = {name: list(d.parameters()) for name, d in drafters.items()}
    opts = {name: torch.optim.AdamW(p, lr=lr, betas=(0.9, 0.95), weight_decay=0.0) for name, p in params.items()}
    history = []
    T = data.shape[1]
    anchors = torch.arange(prompt_len - 1, T - 2, device=dev)
    start = time.time()
    step = 0
    g = torch.Generator(device="cpu").manual_seed(1)
    bar = tqdm(total=int(seconds), desc="drafters", unit="s")
    last = 0
    while time.time() - start < seconds:
        frac = (time.time() - start) / seconds
        idx = torch.randint(0, data.shape[0], (batch_size,), generator=g).to(dev)
        seqs = data[idx]
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            aux, logits = eagle3.target_features(target, seqs, drafters["p_eagle"].cfg.aux_layer_ids)
        teacher = torch.softmax(logits.float(), dim=-1)
        aux = aux.float()
        valid = valid_mask(seqs, prompt_len, stop_ids)
        rec = {"step": step + 1}
        for name, drafter in drafters.items():
            for group in opts[name].param_groups:
                group["lr"] = target_mod.cosine_lr(frac, lr)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                if drafter.cfg.parallel_slots:
                    loss, accs = eagle3.parallel_loss(drafter, embed, head, seqs, aux, teacher, valid, anchors)
                else:
                    loss, accs = eagle3.autoregressive_loss(drafter, embed, head, seqs, aux, teacher, valid, anchors, ar_steps)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params[name], 1.0)
            opts[name].step()
            rec[f"{name}_loss"] = round(loss.item(), 4)
            rec[f"{name}_acc"] = [round(a, 3) for a in accs]
        step += 1
        if step % 50 == 0 or step == 1:
            rec["seconds"] = round(time.time() - start, 1)
            history.append(rec)
            log(rec)
        el = int(time.time() - start)
        if el > last:
            bar.update(el - last)
            last = el
    bar.close()
    return history


def train_drafter(target, drafter, buckets: dict[int, torch.Tensor], seconds: float, lr: float, batch_tokens: int,
                  stop_ids, log, tag: str, deadline: float, seed: int, warmup_frac: float = 0.03, log_every: int = 100) -> int:
    """One drafter distilled from a frozen target's greedy continuations, bucketed by prompt length
    (the buckets take turns): cosine schedule over `seconds`, cut short at `deadline`. Returns the steps."""
    dev = next(drafter.parameters()).device
    embed, head = target.model.embed_tokens, target.lm_head.weight
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    lengths = sorted(buckets)
    seconds = max(1.0, min(seconds, deadline - time.time()))
    start, step = time.time(), 0
    drafter.train()
    while time.time() - start < seconds:
        frac = (time.time() - start) / seconds
        for group in opt.param_groups:
            group["lr"] = target_mod.cosine_lr(frac, lr, warmup_frac=warmup_frac)
        L = lengths[step % len(lengths)]
        data = buckets[L]
        T = data.shape[1]
        bs = max(4, batch_tokens // T)
        seqs = data[torch.randint(0, len(data), (bs,), generator=g).to(dev)].long()
        anchors = torch.arange(L - 1, T - 2, device=dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            aux, logits = eagle3.target_features(target, seqs, drafter.cfg.aux_layer_ids)
            teacher = torch.softmax(logits.float(), dim=-1)
            valid = valid_mask(seqs, L, stop_ids)
            if drafter.cfg.parallel_slots:
                loss, accs = eagle3.parallel_loss(drafter, embed, head, seqs, aux.float(), teacher, valid, anchors)
            else:
                loss, accs = eagle3.autoregressive_loss(drafter, embed, head, seqs, aux.float(), teacher, valid, anchors, 7)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if step % log_every == 0 or step == 1:
            log({"phase": tag, "step": step, "prompt_len": L, "loss": round(loss.item(), 4), "acc": [round(a, 3) for a in accs],
                 "lr": round(opt.param_groups[0]["lr"], 6), "seconds": round(time.time() - start, 1)})
    drafter.eval()
    log({"phase": tag, "steps": step, "seconds": round(time.time() - start, 1)})
    return step


@torch.no_grad()
def acceptance_eval(target, drafter, data: torch.Tensor, prompt_len: int, stop_ids, ar_steps: int, batch_size: int = 64) -> list[float]:
    """P(drafts 1..k all equal the target's greedy tokens), k = 1..depth, over every
    anchor in the held-out generations (teacher forced: equal to the engine's
    count, since a chain only continues while its drafts are accepted)."""
    embed = target.model.embed_tokens
    head = target.lm_head.weight
    dev = data.device
    T = data.shape[1]
    anchors = torch.arange(prompt_len - 1, T - 2, device=dev)
    depth = drafter.cfg.parallel_slots + 1 if drafter.cfg.parallel_slots else ar_steps
    hits = torch.zeros(depth, device=dev)
    count = 0.0
    for i in range(0, len(data), batch_size):
        seqs = data[i : i + batch_size]
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            aux, logits = eagle3.target_features(target, seqs, drafter.cfg.aux_layer_ids)
        greedy = logits.float().argmax(-1)  # [B, T]: greedy[:, t] is the token after t
        valid = valid_mask(seqs, prompt_len, stop_ids)
        B = seqs.shape[0]
        n_real = T - 1
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            if drafter.cfg.parallel_slots:
                M = drafter.cfg.parallel_slots
                A = anchors.numel()
                emb = torch.cat([embed(seqs[:, 1:]), embed.weight[drafter.cfg.slot_token_id].expand(B, A * M, -1)], 1)
                hid = torch.cat([drafter.fc(aux[:, :n_real].float()), drafter.slot_hidden().expand(B, A * M, -1)], 1)
                pos = torch.cat([torch.arange(n_real, device=dev), (anchors[:, None] + torch.arange(1, M + 1, device=dev)).flatten()])
                out, _, _ = drafter.layer(emb, hid, pos, eagle3.chain_mask(n_real, anchors, M, dev))
                lg = out @ head.T
                d0 = lg[:, anchors].argmax(-1)[:, :, None]
                dk = lg[:, n_real:].view(B, A, M, -1).argmax(-1)
                drafts = torch.cat([d0, dk], dim=2)  # [B, A, M+1]
            else:
                drafts = ar_drafts(drafter, embed, head, seqs, aux.float(), anchors, ar_steps)
        for k in range(depth):
            lpos = (anchors + k + 1).clamp(max=T - 1)
            ok = (drafts[:, :, k] == greedy[:, lpos]) & valid[:, lpos] & (anchors + k + 1 <= T - 1)[None]
            if k == 0:
                chain = ok
                base = valid[:, anchors + 1].float()
                count += base.sum().item()
            else:
                chain = chain & ok
            hits[k] += (chain.float() * base).sum()
    return [round(h.item() / max(1.0, count), 4) for h in hits]


def ar_drafts(drafter, embed, head, seqs, aux, anchors, steps):
    """Teacher-forced autoregressive drafts [B, A, steps] for every anchor."""
    B, T = seqs.shape
    n_real = T - 1
    dev = seqs.device
    out, prenorm, kv0 = drafter.layer(embed(seqs[:, 1:]), drafter.fc(aux[:, :n_real]), torch.arange(n_real, device=dev), None)
    drafts = [(out[:, anchors] @ head.T).argmax(-1)]
    A = anchors.numel()
    hidden = prenorm[:, anchors]
    cache = eagle3.KVChain(kv0)
    r = torch.arange(n_real, device=dev)
    eye = torch.eye(A, dtype=torch.bool, device=dev)
    for s in range(1, steps):
        n_prev = A * (s - 1)
        mask = torch.zeros(A, n_real + n_prev + A, dtype=torch.bool, device=dev)
        mask[:, :n_real] = r[None, :] <= anchors[:, None]
        for j in range(s):
            mask[:, n_real + j * A : n_real + (j + 1) * A] = eye
        tok_pos = (anchors + 1 + s).clamp(max=T - 1)
        out, hidden, kvs = drafter.layer(embed(seqs[:, tok_pos]), hidden, anchors + s, mask, cache.past())
        cache.append(kvs)
        drafts.append((out @ head.T).argmax(-1))
    return torch.stack(drafts, dim=2)


def plot_curves(path: Path, target_hist: list[dict], drafter_hist: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ax.plot([r["tokens"] / 1e6 for r in target_hist], [r["loss"] for r in target_hist], label="train")
    ev = [r for r in target_hist if "held_out_loss" in r]
    if ev:
        ax.plot([r["tokens"] / 1e6 for r in ev], [r["held_out_loss"] for r in ev], "o-", label="held-out")
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("target")
    ax.legend()
    ax = axes[1]
    for name in ("p_eagle", "eagle3"):
        pts = [(r["step"], r[f"{name}_loss"]) for r in drafter_hist if f"{name}_loss" in r]
        if pts:
            ax.plot(*zip(*pts), label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("soft cross-entropy vs target")
    ax.set_title("drafters")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--smoke", action="store_true", help="toy sizes, CPU, a minute or two")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copy-to", type=Path, help="also copy the target weights here as soon as they exist")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = Log(out / "train_log.jsonl")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    smoke = args.smoke
    # Shares of the wall-clock budget (after data preparation, which is not budgeted).
    budget = args.budget_s
    t_start = time.time()
    plan = {
        "corpus_chars": 20_000_000 if smoke else 220_000_000,
        "tokenizer_chars": 3_000_000 if smoke else 40_000_000,
        "vocab_size": 2048 if smoke else 8192,
        "seq_len": 256 if smoke else 1024,
        "target_shape": target_mod.TargetShape(hidden_size=64, num_hidden_layers=6, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32) if smoke else target_mod.TargetShape(),
        "target_batch": 8 if smoke else 96,
        "target_lr": 2e-3 if smoke else 1.5e-3,
        "prompt_len": 64 if smoke else 256,
        "gen_tokens": 32 if smoke else 96,
        "gen_batch": 32 if smoke else 1024,
        "gen_prompts": 128 if smoke else 24576,
        "eval_prompts": 64 if smoke else 1024,
        "parallel_slots": 7,
        "ar_steps": 7,
        "drafter_batch": 8 if smoke else 64,
        "drafter_lr": 3e-3 if smoke else 1e-3,
        "drafter_intermediate": 128 if smoke else 1024,
        # P-EAGLE slots see a constant input (slot token, fc(mask_hidden)); a second
        # layer lets them attend by content (one layer can only pool by position).
        "p_eagle_layers": 2,
        "p_eagle_intermediate": 128 if smoke else 768,
        "target_s": 0.35 if smoke else 200,
        "gen_s": 0.1 if smoke else 30,
        "drafters_s": 0.3 if smoke else 190,
        "aux_layer_ids": (1, 3, 5),
    }
    log({"plan": {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in plan.items()}, "device": str(dev), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None})

    # 1. corpus
    corp = corpus_mod.collect()
    corp.train = corpus_mod.cap(corp.train, plan["corpus_chars"], args.seed)
    stats = corp.stats()
    log({"corpus": stats})
    (out / "data_manifest.json").write_text(
        json.dumps(
            {
                "stats": stats,
                "train_distributions": {d: {"license": corp.licenses[d], "files": len(f), "chars": sum(len(t) for _, t in f)} for d, f in sorted(corp.train.items())},
                "held_out_distributions": {d: {"license": corp.licenses[d], "files": len(f)} for d, f in sorted(corp.held_out.items())},
                "skipped": corp.skipped,
            },
            indent=1,
        )
    )

    # 2. tokenizer on a sample of training files
    rng = random.Random(args.seed)
    flat = [t for files in corp.train.values() for _, t in files]
    rng.shuffle(flat)
    sample, n = [], 0
    for t in flat:
        if n > plan["tokenizer_chars"]:
            break
        sample.append(t)
        n += len(t)
    tok = train_tokenizer(sample, plan["vocab_size"])
    ids = special_ids(tok)
    model_dir = out / "target"
    save_tokenizer(tok, model_dir, model_max_length=plan["target_shape"].max_position_embeddings)
    log({"tokenizer": {"vocab": tok.get_vocab_size(), "trained_on_chars": n, "special_ids": ids}})

    # 3. samples -> packed sequences
    train_texts = list(samples.samples(corp.train, args.seed))
    held_texts = list(samples.samples(corp.held_out, args.seed + 1))
    enc = lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    t0 = time.time()
    train_ids = enc(train_texts)
    held_ids = enc(held_texts)
    n_chars = sum(len(t) for t in train_texts)
    n_tok = sum(len(x) for x in train_ids)
    train_data = pack(train_ids, plan["seq_len"]).to(dev)
    held_data = pack(held_ids, plan["seq_len"])[:640].to(dev)
    log({"packed": {"train_sequences": train_data.shape[0], "held_out_sequences": held_data.shape[0], "train_tokens": n_tok, "chars_per_token": round(n_chars / n_tok, 3), "encode_s": round(time.time() - t0, 1)}})
    del train_texts, train_ids

    # 4. target
    prep = time.time() - t_start
    # Smoke runs give fractions of the budget; full runs give seconds.
    share = (lambda key: plan[key] * budget) if smoke else (lambda key: plan[key])
    t_target, t_gen, t_draft = share("target_s"), share("gen_s"), share("drafters_s")
    log({"budget": {"prep_s": round(prep, 1), "target_s": round(t_target, 1), "gen_s": round(t_gen, 1), "drafters_s": round(t_draft, 1)}})
    stop_ids = [ids[s] for s in STOP_TOKENS]
    target = target_mod.make_target(tok.get_vocab_size(), plan["target_shape"], stop_ids).to(dev)
    n_params = sum(p.numel() for p in target.parameters())
    log({"target_params": n_params})
    target_hist = target_mod.train_target(
        target, train_data, t_target, plan["target_batch"], plan["target_lr"], log,
        eval_fn=lambda: target_mod.eval_loss(target, held_data), seed=args.seed,
    )
    held_loss = target_mod.eval_loss(target, held_data)
    train_loss = target_mod.eval_loss(target, train_data[:640])
    log({"target_final": {"held_out_loss": round(held_loss, 4), "train_loss": round(train_loss, 4)}})
    target.config.torch_dtype = torch.bfloat16
    target.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    target.float()
    if args.copy_to:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        shutil.copy(model_dir / "model.safetensors", args.copy_to / "target.safetensors")
    del train_data

    # 5. greedy continuations: training prompts for the drafters, held-out for evaluation
    t0 = time.time()
    prompts, _ = generation_set(tok, corp.train, plan["gen_prompts"], plan["prompt_len"], ids, args.seed + 2)
    eval_prompts, eval_texts = generation_set(tok, corp.held_out, plan["eval_prompts"], plan["prompt_len"], ids, args.seed + 3)
    log({"generation_prompts": {"train": len(prompts), "held_out": len(eval_prompts), "build_s": round(time.time() - t0, 1)}})
    (out / "heldout_prompts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in eval_texts[:256]))
    gen = []
    t0 = time.time()
    for i in range(0, len(prompts), plan["gen_batch"]):
        if time.time() - t0 > t_gen:
            break
        gen.append(target_mod.greedy_generate(target, prompts[i : i + plan["gen_batch"]].to(dev), plan["gen_tokens"]))
    gen = torch.cat(gen)
    eval_gen = torch.cat([target_mod.greedy_generate(target, eval_prompts[i : i + plan["gen_batch"]].to(dev), plan["gen_tokens"]) for i in range(0, len(eval_prompts), plan["gen_batch"])])
    log({"generated": {"sequences": gen.shape[0], "tokens": gen.shape[0] * plan["gen_tokens"], "seconds": round(time.time() - t0, 1)}})
    sample_text = tok.decode(eval_gen[0, plan["prompt_len"] :].tolist(), skip_special_tokens=False)
    log({"sample_generation": sample_text[:400]})

    # 6. drafters
    for p in target.parameters():
        p.requires_grad_(False)
    shape = plan["target_shape"]
    base = dict(
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        intermediate_size=plan["drafter_intermediate"],
        vocab_size=tok.get_vocab_size(),
        target_hidden_size=shape.hidden_size,
        aux_layer_ids=plan["aux_layer_ids"],
        slot_token_id=ids[DRAFT_SLOT],
        rope_theta=shape.rope_theta,
        max_position_embeddings=shape.max_position_embeddings,
    )
    drafters = {
        "p_eagle": eagle3.Eagle3Drafter(
            eagle3.DrafterConfig(**{**base, "intermediate_size": plan["p_eagle_intermediate"]}, parallel_slots=plan["parallel_slots"], num_hidden_layers=plan["p_eagle_layers"])
        ).to(dev),
        "eagle3": eagle3.Eagle3Drafter(eagle3.DrafterConfig(**base, parallel_slots=0)).to(dev),
    }
    drafter_hist = train_drafters(target, drafters, gen, plan["prompt_len"], stop_ids, t_draft, plan["drafter_batch"], plan["drafter_lr"], plan["ar_steps"], log)
    results = {}
    for name, d in drafters.items():
        d.eval()
        cum = acceptance_eval(target, d, eval_gen, plan["prompt_len"], stop_ids, plan["ar_steps"])
        results[name] = {
            "cumulative_acceptance": cum,
            "mean_acceptance_length": {k: round(eagle3.mean_acceptance_length(cum, k), 3) for k in (1, 3, 5, 7)},
            "params": sum(p.numel() for p in d.parameters()),
        }
        d.save(out / ("drafter-p-eagle" if d.cfg.parallel_slots else "drafter-eagle3"))
    log({"drafter_eval_heldout_gpu": results})

    summary = {
        "plan": {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in plan.items()},
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "corpus": stats,
        "target_params": n_params,
        "target_steps": target_hist[-1]["step"] if target_hist else 0,
        "target_tokens": target_hist[-1]["tokens"] if target_hist else 0,
        "held_out_loss": held_loss,
        "train_loss": train_loss,
        "drafters": results,
        "drafter_steps": drafter_hist[-1]["step"] if drafter_hist else 0,
        "generated_sequences": gen.shape[0],
        "wall_s": round(time.time() - t_start, 1),
    }
    (out / "training_summary.json").write_text(json.dumps(summary, indent=1))
    try:
        plot_curves(out / "loss_curves.png", target_hist, drafter_hist)
    except Exception as e:  # a missing matplotlib must not lose the weights
        log({"plot_failed": repr(e)})
    log({"done": summary["wall_s"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
