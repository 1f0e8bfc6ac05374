"""Drafters for the SmolLM2-135M FIM target (issue 27), from fresh weights, on a GPU.

The drafters train together on the same batches (one target forward a step):

- ``p-eagle``: parallel drafting (7 slots: K up to 8), every anchor alike;
- ``p-eagle-served``: the same with the served-matched loss (``parallel_loss``
  ``served_weight=1, chain_condition=1``): a served decoder drafts mostly right
  after a rejected draft and reads slot k only where drafts 1..k-1 were
  accepted (docs/vllm-notes.md, "Teacher-forced vs served");
- ``p-eagle-1l``: ``p-eagle`` with one layer, half the size;
- ``eagle3``: autoregressive drafting, seven unrolled passes.

Prompts are the ones the bridge sends: context samples built by the bridge's
own context engine (training/context_samples.py, FIM with repository
context) and the old mix (FIM, repository and plain samples), cut where the
completion starts and left-trimmed to fixed lengths; the held-out
distributions are excluded (training/corpus.py). The target's greedy
continuations of them are the training data; the teacher is its full
next-token distribution.

Measured on bench/data/heldout_prompts.jsonl as the server tokenizes them:
*served* (the per-step accepted counts vLLM reports, replayed from
teacher-forced chains by ``eagle3.decoder_steps``; equal to vLLM step for step,
tests/integration/test_served_acceptance.py) and teacher forced over every
anchor, for K = 1, 3, 5, 7.

    python -m training.smollm2_drafter --target DIR --out DIR --results DIR --seconds 300
    python -m training.smollm2_drafter --smoke --out /tmp/sd     # CPU, a tiny random target
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from quickdraft.prompt_format import DRAFT_SLOT, FIM_MIDDLE, stop_token_ids
from training import eagle3
from training.smollm2_fim import add_text_args

# name: (parallel slots, layers, served_weight, chain_condition)
ROLES: dict[str, tuple[int, int, float, float]] = {
    "p-eagle": (7, 2, 0.0, 0.0),
    "p-eagle-served": (7, 2, 1.0, 1.0),
    "p-eagle-1l": (7, 1, 0.0, 0.0),  # half the size: what shipping within the 40 MB may need
    "eagle3": (0, 1, 0.0, 0.0),
}
AR_STEPS = 7
MEASURE_K = (1, 3, 5, 7)


def completion_prompt(text: str, rng: random.Random) -> str | None:
    """The prompt part of a training text: up to and including ``<|fim_middle|>`` for a FIM
    sample, else the text up to a line start in its second half (a plain or repository
    prompt); None when the text is too short to cut."""
    i = text.find(FIM_MIDDLE)
    if i >= 0:
        return text[: i + len(FIM_MIDDLE)]
    starts = [j + 1 for j in range(len(text) // 2, len(text) - 1) if text[j] == "\n"]
    return text[: rng.choice(starts)] if starts else None


def bucket_prompts(prompts: list[list[int]], lengths: list[int], cap: int) -> dict[int, torch.Tensor]:
    """Each prompt's last L tokens in the bucket of the largest L it reaches, ``cap`` a bucket."""
    out: dict[int, list[list[int]]] = {L: [] for L in lengths}
    for p in prompts:
        fits = [L for L in lengths if L <= len(p)]
        if fits and len(out[fits[-1]]) < cap:
            out[fits[-1]].append(p[-fits[-1]:])
    return {L: torch.tensor(v, dtype=torch.long) for L, v in out.items() if v}


def drafter_config(target_config: Any, vocab_size: int, slot_id: int, slots: int, layers: int) -> eagle3.DrafterConfig:
    """A drafter as wide as the target (it shares the target's embedding and head)."""
    n = target_config.num_hidden_layers
    heads = target_config.num_attention_heads
    rope = getattr(target_config, "rope_parameters", None) or {}
    return eagle3.DrafterConfig(
        hidden_size=target_config.hidden_size, num_attention_heads=heads, num_key_value_heads=target_config.num_key_value_heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
        intermediate_size=target_config.intermediate_size, vocab_size=vocab_size, target_hidden_size=target_config.hidden_size,
        # vLLM's default for an EAGLE-3 target, written out: early, middle and late layers.
        aux_layer_ids=(2, n // 2, n - 3) if n >= 6 else (0, n // 2, n - 1), slot_token_id=slot_id, parallel_slots=slots,
        num_hidden_layers=layers, rms_norm_eps=target_config.rms_norm_eps,
        rope_theta=float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
        max_position_embeddings=target_config.max_position_embeddings)


def measure(target, drafters: dict[str, eagle3.Eagle3Drafter], prompts: list[list[int]], new_tokens: int, stops: list[int]) -> dict:
    """Served (decoder replay) and teacher-forced acceptance per drafter and K, on the
    target's greedy continuations of ``prompts`` (generated once, shared by the drafters)."""
    from training.served_acceptance import anchor_chains, mean_al, per_position
    from training.target import greedy_generate

    conts = []
    for ids in prompts:
        gen = greedy_generate(target, torch.tensor([ids], device=target.device), new_tokens)[0, len(ids):].tolist()
        conts.append(gen[: next((i + 1 for i, t in enumerate(gen) if t in stops), len(gen))])
    out: dict[str, Any] = {"prompts": len(prompts), "tokens": sum(map(len, conts))}
    kmax = max(MEASURE_K)
    for name, d in drafters.items():
        d.eval()
        chains = [anchor_chains(target, d, p, c, kmax) for p, c in zip(prompts, conts)]
        res = {}
        for k in MEASURE_K:
            if d.cfg.parallel_slots and k > d.cfg.parallel_slots + 1:
                continue
            served = [eagle3.decoder_steps(c, k) for c in chains]
            every = [[min(x, k) for x in c] for c in chains]
            res[k] = {"served_al": mean_al(served), "served_per_position": per_position(served, k),
                      "teacher_forced_al": mean_al(every), "steps": sum(map(len, served))}
        out[name] = res
    return out


def tiny_target(out: Path, texts: list[str]) -> Path:
    """The smoke run's stand-in: smollm2_fim's tiny random base with the FIM tokens added."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quickdraft.server import model_cache
    from training.smollm2_fim import ADDED_TOKENS, tiny_base

    base = tiny_base(texts, out / "tiny-base")
    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base))
    model_cache.add_tokens(tok, ADDED_TOKENS)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.save_pretrained(str(out / "tiny-target"))
    tok.save_pretrained(str(out / "tiny-target"))
    return out / "tiny-target"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, help="the merged FIM target's folder (quickdraft model build)")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT/drafter-<role>/ for each role")
    ap.add_argument("--results", type=Path, help="small results here as they appear ($OUT on the device)")
    ap.add_argument("--roles", default=",".join(ROLES), help="a comma list of these (default: all)")
    ap.add_argument("--seconds", type=float, default=300, help="training wall-clock budget")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (the lr schedule then follows steps)")
    ap.add_argument("--lengths", default="256,512,1024,1536", help="prompt lengths (tokens) the buckets are trimmed to")
    ap.add_argument("--prompts-per-length", type=int, default=8192)
    ap.add_argument("--gen-tokens", type=int, default=64, help="continuation length (the benchmarks' max_tokens)")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--gen-seconds", type=float, default=90, help="time for generating continuations")
    ap.add_argument("--batch-tokens", type=int, default=24000)
    ap.add_argument("--prompt-anchors", type=int, default=0,
                    help="also train on the prompt: every prompt position's next token (the target's distribution "
                         "over real code) and this many random prompt anchors a step for the slot chains; "
                         "0: only the generated continuation, as served")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-prompts", type=int, default=64, help="bench/data/heldout_prompts.jsonl, as the server tokenizes them")
    add_text_args(ap, ctx_seconds=40, old_chars=20_000_000)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU; without --target a tiny random target")
    args = ap.parse_args(argv)
    if unknown := set(args.roles.split(",")) - set(ROLES):
        ap.error(f"--roles: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ROLES)}")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.pipeline import Log, valid_mask
    from training.smollm2_fim import encode, texts
    from training.served_acceptance import prompt_ids
    from training.target import cosine_lr

    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.results or args.out
    results.mkdir(parents=True, exist_ok=True)
    log = Log(results / "smollm2_drafter_log.jsonl")
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save() -> None:
        summary["wall_s"] = round(time.time() - t_start, 1)
        (results / "smollm2_drafter_summary.json").write_text(json.dumps(summary, indent=1))

    lengths = [int(x) for x in args.lengths.split(",")]
    if args.smoke:
        lengths, args.gen_tokens, args.batch_tokens = [32, 64], 12, 1024
        args.prompts_per_length, args.eval_prompts = 24, 4
        args.seconds, args.max_steps = 600, args.max_steps or 30
        args.ctx_seconds, args.old_chars, args.budget_tokens = min(args.ctx_seconds, 20), min(args.old_chars, 300_000), 96
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # 1. texts (worker processes fork before CUDA is touched)
    train_old, train_ctx, held_old, held_ctx = texts(args, summary)
    target_dir = args.target or tiny_target(args.out, train_old[:400])
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    vocab = tok.get_vocab()
    stops = stop_token_ids(vocab)
    if DRAFT_SLOT not in vocab:
        ap.error(f"{target_dir}: the tokenizer has no {DRAFT_SLOT} (a FIM target built with the delta has)")

    # 2. prompts, bucketed by length, and the target's continuations
    rng = random.Random(args.seed)

    def prompts_of(txts: list[str], cap: int) -> dict[int, torch.Tensor]:
        cut = [p for p in (completion_prompt(t, rng) for t in txts) if p]
        rng.shuffle(cut)
        return bucket_prompts(encode(tok, cut), lengths, cap)

    from training.drafter_scratch import fast_generate

    def continue_all(buckets: dict[int, torch.Tensor], seconds: float) -> dict[int, torch.Tensor]:
        chunks: dict[int, list[torch.Tensor]] = {L: [] for L in buckets}
        t0, r = time.time(), 0
        while time.time() - t0 < seconds:
            busy = False
            for L, ps in buckets.items():
                bs = max(8, args.gen_batch * 1024 // max(L, 1024))
                if r * bs < len(ps):
                    busy = True
                    chunks[L].append(fast_generate(target, ps[r * bs : (r + 1) * bs].to(dev), args.gen_tokens).to(torch.int32))
            r += 1
            if not busy:
                break
        return {L: torch.cat(c).to(dev) for L, c in chunks.items() if c}

    t0 = time.time()
    train_prompts = prompts_of(train_ctx + train_old, args.prompts_per_length)
    held_prompts = prompts_of(held_ctx + held_old, 8 if args.smoke else 128)
    train = continue_all(train_prompts, args.gen_seconds)
    held = continue_all(held_prompts, 600)
    summary["data"] = {"train": {L: len(v) for L, v in train.items()}, "held_out": {L: len(v) for L, v in held.items()},
                       "texts": {"context": len(train_ctx), "old_mix": len(train_old)}, "seconds": round(time.time() - t0, 1)}
    log({"data": summary["data"]})
    save()

    # 3. the drafters, trained together
    roles = args.roles.split(",")
    slot_id = vocab[DRAFT_SLOT]
    drafters = {}
    for i, name in enumerate(roles):
        slots, layers, _, _ = ROLES[name]
        torch.manual_seed(args.seed + i)
        drafters[name] = eagle3.Eagle3Drafter(drafter_config(target.config, len(tok), slot_id, slots, layers)).to(dev).train()
    summary["params"] = {n: sum(p.numel() for p in d.parameters()) for n, d in drafters.items()}
    opts = {n: torch.optim.AdamW(d.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0) for n, d in drafters.items()}
    embed, head = target.model.embed_tokens, target.lm_head.weight
    g = torch.Generator().manual_seed(args.seed + 11)
    ls = sorted(train)
    t0, step = time.time(), 0
    while time.time() - t0 < args.seconds and (args.max_steps is None or step < args.max_steps):
        frac = step / args.max_steps if args.max_steps else (time.time() - t0) / args.seconds
        L = ls[step % len(ls)]
        data = train[L]
        T = data.shape[1]
        seqs = data[torch.randint(0, len(data), (max(4, args.batch_tokens // T),), generator=g).to(dev)].long()
        anchors = gen_anchors = torch.arange(L - 1, T - 2, device=dev)
        # Without prompt anchors the teacher starts at the first generated position (L - 1): the prompt's own
        # positions weigh nothing, and a 49k-token head over 1,500 of them would be most of a step.
        tf = L - 1
        valid = valid_mask(seqs, L, stops)
        if args.prompt_anchors:
            tf = 0
            valid[:, : L - 1] = True
            picked = torch.randperm(L - 1, generator=g)[: args.prompt_anchors].sort().values.to(dev)
            anchors = torch.cat([picked, anchors])
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            aux, logits = eagle3.target_features(target, seqs, next(iter(drafters.values())).cfg.aux_layer_ids, logits_from=tf)
            teacher = torch.softmax(logits.float(), dim=-1)
        del logits
        rec: dict[str, Any] = {"step": step + 1, "prompt_len": L}
        for name, d in drafters.items():
            _, _, sw, cc = ROLES[name]
            for group in opts[name].param_groups:
                group["lr"] = cosine_lr(frac, args.lr)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                if d.cfg.parallel_slots:
                    # The served-matched weights follow a decoder along consecutive anchors: the continuation's only.
                    own = gen_anchors if sw or cc else anchors
                    loss, accs = eagle3.parallel_loss(d, embed, head, seqs, aux.float(), teacher, valid, own,
                                                      served_weight=sw, served_k=5, chain_condition=cc, teacher_from=tf)
                else:
                    loss, accs = eagle3.autoregressive_loss(d, embed, head, seqs, aux.float(), teacher, valid, anchors, AR_STEPS,
                                                            teacher_from=tf)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
            opts[name].step()
            rec[name] = {"loss": round(loss.item(), 4), "acc": [round(a, 3) for a in accs[:5]]}
        step += 1
        if step % 100 == 0 or step == 1:
            rec["seconds"] = round(time.time() - t0, 1)
            log(rec)
    summary["steps"] = step
    summary["train_s"] = round(time.time() - t0, 1)
    log({"steps": step, "seconds": summary["train_s"]})
    for name, d in drafters.items():
        d.eval()
        d.save(args.out / f"drafter-{name}")
    save()

    # 4. measures: teacher forced on the held-out buckets, served on the benchmark's prompts
    from training.pipeline import acceptance_eval

    with torch.no_grad():
        summary["teacher_forced_held_out"] = {
            name: {L: round(eagle3.mean_acceptance_length(acceptance_eval(target, d, v, L, stops, AR_STEPS, batch_size=16), 5), 3)
                   for L, v in held.items()}
            for name, d in drafters.items()}
        log({"teacher_forced_held_out_k5": summary["teacher_forced_held_out"]})
        evals = prompt_ids(target_dir, args.eval_prompts)
        summary["served_heldout_prompts"] = measure(target, drafters, evals, args.gen_tokens, stops)
    log({"served_heldout_prompts": summary["served_heldout_prompts"]})
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
