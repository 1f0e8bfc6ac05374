"""Continue training one drafter against an already trained target.

    python -m training.drafter_only --target DIR --drafter DIR --out DIR [--seconds 150]

Generates greedy continuations of training prompts at several prompt lengths
(a drafter trained on one prompt length generalises poorly to others: the
parallel slots' first layer can only pool by position), continues training the
drafter from its current weights, and evaluates it on held-out prompts of the
same lengths. Used for the second pass of the embedded P-EAGLE drafter.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

from quickdraft.prompt_format import STOP_TOKENS
from training import corpus as corpus_mod
from training import eagle3
from training import target as target_mod
from training.pipeline import Log, acceptance_eval, generation_set, train_drafter
from training.tokenizer import special_ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--gen-seconds", type=float, default=40)
    ap.add_argument("--prompt-lengths", default="96,224,480,800")
    ap.add_argument("--prompts-per-length", type=int, default=6144)
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--batch-tokens", type=int, default=24000, help="drafter batch size in tokens")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    t_start = time.time()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    log = Log(args.out / "drafter_log.jsonl")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    ids = special_ids(tok)
    stop_ids = [ids[s] for s in STOP_TOKENS]
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    drafter = eagle3.Eagle3Drafter.load(args.drafter).to(dev)
    corp = corpus_mod.collect()
    lengths = [int(x) for x in args.prompt_lengths.split(",")]
    log({"lengths": lengths, "device": str(dev), "drafter": str(args.drafter), "parallel_slots": drafter.cfg.parallel_slots})

    # Greedy continuations, one bucket per prompt length (equal lengths batch without padding).
    train, held = {}, {}
    per_bucket_s = args.gen_seconds / len(lengths)
    for i, L in enumerate(lengths):
        prompts, _ = generation_set(tok, corp.train, args.prompts_per_length, L, ids, args.seed + i)
        evals, _ = generation_set(tok, corp.held_out, 256, L, ids, args.seed + 100 + i)
        gb = max(64, 1024 * 256 // L)
        chunks, t0 = [], time.time()
        for j in range(0, len(prompts), gb):
            if time.time() - t0 > per_bucket_s:
                break
            chunks.append(target_mod.greedy_generate(target, prompts[j : j + gb].to(dev), args.gen_tokens))
        train[L] = torch.cat(chunks)
        held[L] = torch.cat([target_mod.greedy_generate(target, evals[j : j + gb].to(dev), args.gen_tokens) for j in range(0, len(evals), gb)])
        log({"bucket": L, "train_sequences": len(train[L]), "held_out_sequences": len(held[L]), "seconds": round(time.time() - t0, 1)})

    def evaluate() -> dict:
        drafter.eval()
        res = {L: acceptance_eval(target, drafter, held[L], L, stop_ids, 7) for L in lengths}
        drafter.train()
        return {L: {"cumulative": c, "mal5": round(eagle3.mean_acceptance_length(c, 5), 3)} for L, c in res.items()}

    log({"before": evaluate()})
    step = train_drafter(target, drafter, train, args.seconds, args.lr, args.batch_tokens, stop_ids, log, "train",
                         deadline=float("inf"), seed=args.seed, warmup_frac=0.05, log_every=50)
    after = evaluate()
    log({"after": after, "steps": step})
    drafter.eval()
    drafter.save(args.out / args.drafter.name)
    (args.out / "drafter_summary.json").write_text(json.dumps({"steps": step, "lengths": lengths, "after": after, "wall_s": round(time.time() - t_start, 1)}, indent=1))
    log({"done": round(time.time() - t_start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
