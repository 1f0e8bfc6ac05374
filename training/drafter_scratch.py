"""Train a drafter for an already trained target from scratch, on many of the
target's own continuations, then measure it the way earlier drafters were measured.

    python -m training.drafter_scratch --role eagle3  --target DIR --old DIR --out DIR --share DIR --results DIR
    python -m training.drafter_scratch --role p-eagle --target DIR --old DIR --out DIR --share DIR --results DIR

`device_drafters.sh` starts both roles at once on one GPU (an 8M-parameter target
and a 1-2M-parameter drafter leave the GPU mostly idle; two processes keep it busier).

eagle3:  the pipeline's recipe (fresh weights, lr 1e-3, ~64 sequences of 256 + 96
         tokens a step, seven unrolled passes) on `--eagle3-prompts` continuations of
         256-token training prompts (written to `--share` for the other role), then
         the model card's measure (1,024 held-out prompts of 256 tokens, seed 3, K=1,3,5,7)
         for the drafter in `--old` and the new one.
p-eagle: pass 1 as the pipeline (fresh weights, lr 1e-3, the 256-token continuations
         from `--share`), pass 2 as drafter_only.py (lr 6e-4, 24,000-token batches,
         rotating over the six prompt lengths, plus the 256 set), with many more
         continuations per length than before; measured on drafter_only.py's held-out
         sets (256 prompts per length, seed 7 + 100 + i, K=5) before (the `--old`
         drafter), after pass 1 and after pass 2.

Training continuations come from a generator with the same greedy loop as
target.greedy_generate, but computing only the last prompt position's logits, so
batches can be large; held-out sets use target.greedy_generate with the chunks
the earlier measurements used, so the figures stay comparable.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from pathlib import Path

import torch

from quickdraft.prompt_format import STOP_TOKENS
from training import corpus as corpus_mod
from training import eagle3
from training import target as target_mod
from training.pipeline import Log, acceptance_eval, generation_set, train_drafter
from training.tokenizer import special_ids

P_EAGLE_LENGTHS = (64, 160, 288, 480, 704, 896)


@torch.no_grad()
def fast_generate(model, prompts: torch.Tensor, new_tokens: int, temperature: float = 0.0, gen: torch.Generator | None = None) -> torch.Tensor:
    """target.greedy_generate with only the last prompt position's logits computed
    (temperature > 0: sampled instead of greedy)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = [prompts]
    with torch.autocast(device_type=prompts.device.type, dtype=torch.bfloat16, enabled=prompts.is_cuda):
        logits = model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        for _ in range(new_tokens):
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=gen)
            else:
                nxt = logits.float().argmax(-1, keepdim=True)
            out.append(nxt)
            logits = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.cat(out, dim=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=("eagle3", "p-eagle"), required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--old", type=Path, required=True, help="folder holding the drafters to compare with (drafter-eagle3/, drafter-p-eagle/)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--share", type=Path, required=True, help="folder where eagle3 leaves the 256-token continuations")
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--deadline-s", type=float, default=540, help="everything ends this long after start")
    ap.add_argument("--reserve-s", type=float, default=30, help="kept for measuring and saving")
    ap.add_argument("--eagle3-prompts", type=int, default=65536)
    ap.add_argument("--gen-s", type=float, default=60, help="eagle3: 256-token continuations; p-eagle: the six lengths")
    ap.add_argument("--gen-batch", type=int, default=2048)
    ap.add_argument("--p-prompts-per-length", type=int, default=16384)
    ap.add_argument("--pass1-s", type=float, default=170)
    ap.add_argument("--pass2-with-256", type=int, default=1)
    ap.add_argument("--wait-share-s", type=float, default=150)
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--smoke", action="store_true", help="toy sizes (CPU)")
    ap.add_argument("--site-packages", type=Path, help="collect the corpus from this folder only (no stdlib; for --smoke)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--data-seed", type=int, default=0, help="added to the training prompts' seeds (new prompts for a second round)")
    ap.add_argument("--init-from-old", action="store_true", help="continue the --old drafter instead of fresh weights (p-eagle: pass 2 only)")
    ap.add_argument("--lr", type=float, default=1e-3, help="eagle3's peak lr")
    ap.add_argument("--lr2", type=float, default=6e-4, help="p-eagle pass 2's peak lr")
    ap.add_argument("--sample-temp", type=float, default=0.0, help="eagle3: sample its continuations at this temperature (0: greedy)")
    ap.add_argument("--use-share", action="store_true", help="eagle3: also train on the greedy set another eagle3 process leaves in --share")
    ap.add_argument("--tag", default="", help="suffix of this process's result files")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    t_start = time.time()
    deadline = t_start + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    args.share.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    name = "drafter-eagle3" if args.role == "eagle3" else "drafter-p-eagle"
    stem = name + args.tag
    log = Log(args.results / f"{stem}_scratch_log.jsonl")
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save():
        summary["wall_s"] = round(time.time() - t_start, 1)
        (args.results / f"{stem}_scratch_summary.json").write_text(json.dumps(summary, indent=1))

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    ids = special_ids(tok)
    stop_ids = [ids[s] for s in STOP_TOKENS]
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    corp = corpus_mod.collect([args.site_packages], include_stdlib=False) if args.site_packages else corpus_mod.collect()
    old = eagle3.Eagle3Drafter.load(args.old / name).to(dev).eval()
    torch.manual_seed(args.seed)
    drafter = eagle3.Eagle3Drafter(old.cfg).to(dev)  # same shape, fresh weights
    if args.init_from_old:
        drafter.load_state_dict(old.state_dict())
    gen_tokens = 16 if args.smoke else args.gen_tokens
    log({"role": args.role, "device": str(dev), "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
         "torch": torch.__version__, "params": sum(p.numel() for p in drafter.parameters()), "setup_s": round(time.time() - t_start, 1)})

    def gen_budget(prompts: torch.Tensor, seconds: float) -> torch.Tensor:
        chunks, t0 = [], time.time()
        for j in range(0, len(prompts), args.gen_batch):
            if chunks and time.time() - t0 > seconds:
                break
            chunks.append(fast_generate(target, prompts[j : j + args.gen_batch].to(dev), gen_tokens, args.sample_temp, sgen).to(torch.int32))
        return torch.cat(chunks)

    sgen = torch.Generator(device=dev).manual_seed(args.seed + args.data_seed)

    share_file = args.share / "gen256.pt"
    if args.role == "eagle3":
        # The model card's held-out set, exactly as drafter_continue.card_measure builds it.
        n_eval, plen = (8, 64) if args.smoke else (1024, 256)
        evals, _ = generation_set(tok, corp.held_out, n_eval, plen, ids, 0 + 3)
        held = torch.cat([target_mod.greedy_generate(target, evals[i : i + 1024].to(dev), 96 if not args.smoke else 16) for i in range(0, len(evals), 1024)])
        t0 = time.time()
        prompts, _ = generation_set(tok, corp.train, 64 if args.smoke else args.eagle3_prompts, plen, ids, args.seed + 2 + args.data_seed)
        log({"prompts": len(prompts), "build_s": round(time.time() - t0, 1)})
        t0 = time.time()
        gen = gen_budget(prompts, args.gen_s)
        log({"generated": len(gen), "prompt_len": plen, "temperature": args.sample_temp, "seconds": round(time.time() - t0, 1)})
        if args.use_share:
            t0 = time.time()
            while not share_file.exists() and time.time() - t0 < args.wait_share_s:
                time.sleep(1)
            if share_file.exists():
                time.sleep(1)
                gen = torch.cat([gen, torch.load(share_file).to(gen.device)])
            log({"with_share": len(gen), "waited_s": round(time.time() - t0, 1)})
        elif args.sample_temp == 0:
            torch.save(gen.cpu(), str(share_file) + ".tmp")
            Path(str(share_file) + ".tmp").rename(share_file)
        summary["train_sequences"] = len(gen)
        gen = gen.to(dev)
        # drafter_only.py's held-out set at 256 tokens (seed 7 + 100): picks between runs without the card's set
        ev2, _ = generation_set(tok, corp.held_out, 64 if args.smoke else 256, plen, ids, 7 + 100)
        held2 = target_mod.greedy_generate(target, ev2.to(dev), gen_tokens)
        steps = train_drafter(target, drafter, {plen: gen}, deadline - args.reserve_s - time.time(), args.lr, 64 * gen.shape[1],
                           stop_ids, log, "eagle3", deadline - args.reserve_s, args.seed)
        summary["steps"] = steps
        card = {"prompts": len(held)}
        for label, dr in (("old", old), ("new", drafter)):
            cum = acceptance_eval(target, dr, held, plen, stop_ids, 7)
            card[label] = {"cumulative": cum, "mean_acceptance_length": {k: round(eagle3.mean_acceptance_length(cum, k), 3) for k in (1, 3, 5, 7)}}
        summary["card_measure"] = card
        summary["held256_seed107"] = {label: round(eagle3.mean_acceptance_length(acceptance_eval(target, dr, held2, plen, stop_ids, 7), 5), 3)
                                      for label, dr in (("old", old), ("new", drafter))}
        log({"held256_seed107": summary["held256_seed107"]})
        log({"card_measure": card})
    else:
        lengths = (64, 160) if args.smoke else P_EAGLE_LENGTHS
        held, train = {}, {}
        t0 = time.time()
        prompt_sets = {}
        for i, L in enumerate(lengths):
            # drafter_only.py's held-out sets (its seed 7) and chunks
            evals, _ = generation_set(tok, corp.held_out, 256, L, ids, 7 + 100 + i)
            gb = max(64, 1024 * 256 // L)
            held[L] = torch.cat([target_mod.greedy_generate(target, evals[j : j + gb].to(dev), gen_tokens) for j in range(0, len(evals), gb)])
            prompt_sets[L], _ = generation_set(tok, corp.train, 32 if args.smoke else args.p_prompts_per_length, L, ids, args.seed + 1000 + i + args.data_seed)
        log({"held_out": {L: len(v) for L, v in held.items()}, "train_prompts": {L: len(v) for L, v in prompt_sets.items()}, "seconds": round(time.time() - t0, 1)})
        # Round robin over the lengths, one chunk each, until the budget is spent.
        t0 = time.time()
        chunks = {L: [] for L in lengths}
        r = 0
        while time.time() - t0 < args.gen_s:
            done_all = True
            for L in lengths:
                j = r * args.gen_batch
                if j < len(prompt_sets[L]):
                    done_all = False
                    chunks[L].append(fast_generate(target, prompt_sets[L][j : j + args.gen_batch].to(dev), gen_tokens).to(torch.int32))
            r += 1
            if done_all:
                break
        train = {L: torch.cat(c).to(dev) for L, c in chunks.items() if c}
        log({"generated": {L: len(v) for L, v in train.items()}, "seconds": round(time.time() - t0, 1)})
        summary["train_sequences"] = {L: len(v) for L, v in train.items()}

        def evaluate(dr) -> dict:
            res = {L: acceptance_eval(target, dr, held[L], L, stop_ids, 7) for L in lengths}
            out = {L: {"cumulative": c, "mal": {k: round(eagle3.mean_acceptance_length(c, k), 3) for k in (1, 3, 5, 7)}} for L, c in res.items()}
            out["mean"] = {k: round(sum(v["mal"][k] for v in out.values()) / len(lengths), 3) for k in (1, 3, 5, 7)}
            return out

        summary["old"] = evaluate(old)
        log({"old": summary["old"]["mean"]})
        save()
        t0 = time.time()
        while not share_file.exists() and time.time() - t0 < args.wait_share_s:
            time.sleep(1)
        if share_file.exists():
            time.sleep(1)
            gen256 = torch.load(share_file).to(dev)
        else:  # generate our own
            prompts, _ = generation_set(tok, corp.train, 64 if args.smoke else 24576, 256 if not args.smoke else 64, ids, args.seed + 2)
            gen256 = gen_budget(prompts, 40)
        plen = gen256.shape[1] - gen_tokens
        log({"gen256": len(gen256), "waited_s": round(time.time() - t0, 1)})
        summary["pass1_sequences"] = len(gen256)
        remaining = deadline - args.reserve_s - time.time()
        p1 = min(args.pass1_s, 0.45 * remaining)
        if not args.init_from_old:
            summary["pass1_steps"] = train_drafter(target, drafter, {plen: gen256}, p1, 1e-3, 64 * gen256.shape[1], stop_ids, log, "pass1",
                                                deadline - args.reserve_s, args.seed)
            summary["after_pass1"] = evaluate(drafter)
            log({"after_pass1": summary["after_pass1"]["mean"]})
            drafter.save(args.out / f"{name}-pass1")
            save()
        buckets = dict(train)
        if args.pass2_with_256:
            buckets[plen] = gen256
        summary["pass2_steps"] = train_drafter(target, drafter, buckets, deadline - args.reserve_s - time.time(), args.lr2, 24000, stop_ids, log,
                                            "pass2", deadline - args.reserve_s, args.seed + 1 + args.data_seed, warmup_frac=0.05)
        summary["after_pass2"] = evaluate(drafter)
        log({"after_pass2": summary["after_pass2"]["mean"]})

    drafter.save(args.out / stem)
    with tarfile.open(args.results / f"{stem}.tar", "w") as tar:
        tar.add(args.out / stem, arcname=name)
        if (args.out / f"{name}-pass1").exists():
            tar.add(args.out / f"{name}-pass1", arcname=f"{name}-pass1")
    summary["done"] = True
    save()
    log({"done": round(time.time() - t_start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
