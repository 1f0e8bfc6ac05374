"""Continue the embedded target on retrieval-augmented FIM samples, then its drafters.

    python -m training.context_finetune --out DIR [--fim-prompts prompts.jsonl] [budgets]

1. corpus (training/corpus.py) and two sample sets: the old mix
   (training/samples.py, same seed as the first training) and context samples
   (training/context_samples.py: the bridge's prompt around a hole, the
   definitions it finds in other training files);
2. the shipped target, continued from its weights on a mix of both (so it
   keeps plain FIM), with held-out losses (old-mix and context-sample rows from
   the held-out distributions) before and after;
3. optional: greedy answers of the old and the new target to the FIM quality
   prompts built by training/fim_offline.py (float32, 48 tokens, the server's
   stop tokens), for scoring on the CPU machine;
4. both drafters continued from their weights on the new target's greedy
   continuations (training/drafter_only.py: EAGLE-3 at 256-token prompts,
   P-EAGLE at six prompt lengths), and the model card's EAGLE-3 measure
   (1,024 held-out prompts of 256 tokens) for old and new.

Writes DIR/target, DIR/drafter-p-eagle, DIR/drafter-eagle3, logs and a summary.
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
from training import context_samples, corpus as corpus_mod, samples, target as target_mod
from training.pipeline import Log, generation_set, pack

EMBEDDED = Path(__file__).resolve().parents[1] / "quickdraft" / "models" / "embedded"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _mix(old: torch.Tensor, ctx: torch.Tensor, ctx_share: float, seed: int) -> torch.Tensor:
    """All context rows plus enough random old-mix rows for ``ctx_share``."""
    n_old = min(len(old), int(len(ctx) * (1 - ctx_share) / ctx_share))
    g = torch.Generator().manual_seed(seed)
    keep = torch.randperm(len(old), generator=g)[:n_old]
    return torch.cat([old[keep], ctx])


@torch.no_grad()
def fim_generations(model, prompts_path: Path, name: str, out, batch: int = 192, new_tokens: int = 48, stop_ids=()) -> int:
    """Greedy answers (left-padded batches, attention mask) -> JSONL records."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(EMBEDDED / "target" / "tokenizer.json"))
    items = []
    with open(prompts_path) as f:
        for line in f:
            r = json.loads(line)
            for cond, c in r["conditions"].items():
                if c["ids"]:
                    items.append((r["task"], cond, c["ids"]))
    items.sort(key=lambda x: len(x[2]))
    dev = next(model.parameters()).device
    pad = stop_ids[0]
    n = 0
    for i in range(0, len(items), batch):
        chunk = items[i : i + batch]
        L = max(len(x[2]) for x in chunk)
        ids = torch.full((len(chunk), L), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for j, (_t, _c, p) in enumerate(chunk):
            ids[j, L - len(p) :] = torch.tensor(p)
            mask[j, L - len(p) :] = 1
        outs = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=list(stop_ids), pad_token_id=pad)
        for j, (task, cond, _p) in enumerate(chunk):
            gen = outs[j, L:].tolist()
            cut = next((k for k, t in enumerate(gen) if t in stop_ids), len(gen))
            text = tok.decode(gen[:cut], skip_special_tokens=True)
            out.write(json.dumps({"model": name, "task": task, "condition": cond, "text": text, "tokens": cut}) + "\n")
            n += 1
    return n


@torch.no_grad()
def padding_check(model, prompts_path: Path, stop_ids, k: int = 6) -> list[bool]:
    """Left-padded batched answers (16 tokens) equal each prompt decoded alone?"""
    items = []
    with open(prompts_path) as f:
        for line in f:
            r = json.loads(line)
            for c in r["conditions"].values():
                if c["ids"]:
                    items.append(c["ids"])
            if len(items) >= k:
                break
    dev = next(model.parameters()).device
    L = max(len(p) for p in items)
    ids = torch.full((len(items), L), stop_ids[0], dtype=torch.long)
    mask = torch.zeros((len(items), L), dtype=torch.long)
    for j, p in enumerate(items):
        ids[j, L - len(p) :] = torch.tensor(p)
        mask[j, L - len(p) :] = 1
    batched = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=16, do_sample=False,
                             eos_token_id=list(stop_ids), pad_token_id=stop_ids[0])[:, L:]
    res = []
    for j, p in enumerate(items):
        alone = target_mod.greedy_generate(model, torch.tensor([p], device=dev), 16)[0, len(p) :]
        m = min(len(alone), batched.shape[1])
        res.append(bool((alone[:m] == batched[j, :m]).all()))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", type=Path, help="copy small results here as they appear ($OUT)")
    ap.add_argument("--fim-prompts", type=Path)
    ap.add_argument("--ctx-build-s", type=float, default=45)
    ap.add_argument("--ctx-share", type=float, default=0.5)
    ap.add_argument("--old-mix-chars", type=int, default=120_000_000)
    ap.add_argument("--target-s", type=float, default=140)
    ap.add_argument("--target-lr", type=float, default=6e-4)
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--eagle3-s", type=float, default=60)
    ap.add_argument("--eagle3-gen-s", type=float, default=12)
    ap.add_argument("--p-eagle-s", type=float, default=80)
    ap.add_argument("--p-eagle-gen-s", type=float, default=30)
    ap.add_argument("--skip-drafters", action="store_true")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="toy budgets on a CPU")
    ap.add_argument("--site-packages", type=Path, help="collect the corpus from this folder only (no stdlib; for --smoke)")
    args = ap.parse_args(argv)

    t_start = time.time()
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    results = args.results or out
    results.mkdir(parents=True, exist_ok=True)
    log = Log(results / "finetune_log.jsonl")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save_summary():
        summary["wall_s"] = round(time.time() - t_start, 1)
        (results / "finetune_summary.json").write_text(json.dumps(summary, indent=1))

    # 1. corpus and samples (worker processes fork before CUDA is touched)
    if args.site_packages:  # drafter_only collects the corpus again: the same folder there
        collect = corpus_mod.collect
        corpus_mod.collect = lambda *a, **k: collect([args.site_packages], include_stdlib=False)
    corp = corpus_mod.collect()
    roots = [str(args.site_packages)] if args.site_packages else context_samples.default_roots()
    workers = args.workers or corpus_mod.cpu_count()
    ctx_train, st_train = context_samples.build(corp.train, roots, seconds=args.ctx_build_s, workers=workers, seed=args.seed,
                                                max_files=200 if args.smoke else None)
    ctx_held, st_held = context_samples.build(corp.held_out, roots, seconds=10, workers=workers, seed=args.seed + 1,
                                              max_files=20 if args.smoke else 120)
    summary["context_samples"] = {"train": st_train, "held_out": st_held}
    log({"context_samples": summary["context_samples"]})
    (results / "context_sample_example.txt").write_text("\n\n=====\n\n".join(ctx_train[:3]))
    old_train = corpus_mod.cap(corp.train, args.old_mix_chars if not args.smoke else 3_000_000, args.seed)
    old_texts = list(samples.samples(old_train, args.seed))
    held_texts = list(samples.samples(corp.held_out, args.seed + 1))  # pipeline.py's held-out set

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(EMBEDDED / "target" / "tokenizer.json"))
    enc = lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    seq = 256 if args.smoke else 1024
    t0 = time.time()
    ctx_ids = enc(ctx_train)
    old_data = pack(enc(old_texts), seq)
    ctx_data = pack(ctx_ids, seq)
    n_held = 8 if args.smoke else 640
    held_old = pack(enc(held_texts), seq)[:n_held].to(dev)
    held_ctx = pack(enc(ctx_held), seq)[: n_held // 2].to(dev)
    data = _mix(old_data, ctx_data, args.ctx_share, args.seed).to(dev)
    summary["data"] = {"old_rows": len(old_data), "context_rows": len(ctx_data), "train_rows": len(data),
                       "context_tokens": sum(len(x) for x in ctx_ids), "held_out_old_rows": len(held_old),
                       "held_out_context_rows": len(held_ctx), "encode_s": round(time.time() - t0, 1)}
    log({"data": summary["data"]})
    del old_texts, ctx_ids

    # 2. the target, continued
    stop_ids = [tok.token_to_id(s) for s in STOP_TOKENS]
    old = AutoModelForCausalLM.from_pretrained(EMBEDDED / "target", dtype=torch.float32).to(dev).eval()
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED / "target", dtype=torch.float32).to(dev)
    losses = lambda m: {"held_out_old_mix": round(target_mod.eval_loss(m, held_old), 4), "held_out_context": round(target_mod.eval_loss(m, held_ctx), 4),
                        "train_old_mix": round(target_mod.eval_loss(m, old_data[:n_held].to(dev)), 4), "train_context": round(target_mod.eval_loss(m, ctx_data[: n_held // 2].to(dev)), 4)}
    summary["loss_before"] = losses(old)
    log({"loss_before": summary["loss_before"]})
    save_summary()
    hist = target_mod.train_target(model, data, args.target_s, args.batch if not args.smoke else 4, args.target_lr, log,
                                   eval_fn=lambda: target_mod.eval_loss(model, held_old), seed=args.seed + 11)
    summary["target_steps"] = hist[-1]["step"] if hist else 0
    summary["target_tokens"] = hist[-1]["tokens"] if hist else 0
    summary["target_history"] = hist
    summary["loss_after"] = losses(model)
    log({"loss_after": summary["loss_after"], "steps": summary["target_steps"]})
    del data, old_data, ctx_data
    tdir = out / "target"
    model.config.torch_dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(tdir, safe_serialization=True)
    model.float()
    for name in TOKENIZER_FILES + ("generation_config.json",):
        shutil.copy(EMBEDDED / "target" / name, tdir / name)
    save_summary()

    # 3. FIM quality answers, old and new target
    if args.fim_prompts:
        t0 = time.time()
        summary["fim_decode_check"] = padding_check(model, args.fim_prompts, stop_ids)
        with open(results / "fim_generations.jsonl", "w") as f:
            n_old = fim_generations(old, args.fim_prompts, "old", f, stop_ids=stop_ids)
            n_new = fim_generations(model, args.fim_prompts, "new", f, stop_ids=stop_ids)
        summary["fim_generations"] = {"old": n_old, "new": n_new, "seconds": round(time.time() - t0, 1)}
        log({"fim": summary["fim_generations"], "check": summary["fim_decode_check"]})
        save_summary()
    del old, model
    if args.skip_drafters:
        log({"done": round(time.time() - t_start, 1)})
        return 0

    # 4. drafters, continued on the new target
    from training import drafter_only

    smoke = ["--prompts-per-length", "32", "--batch-tokens", "2000", "--gen-tokens", "16"] if args.smoke else []
    for name, secs, gen_s, lengths in (("drafter-eagle3", args.eagle3_s, args.eagle3_gen_s, "256"),
                                       ("drafter-p-eagle", args.p_eagle_s, args.p_eagle_gen_s, "64,160" if args.smoke else "64,160,288,480,704,896")):
        d_out = out / f"_{name}"
        drafter_only.main(["--target", str(tdir), "--drafter", str(EMBEDDED / name), "--out", str(d_out), "--seconds", str(secs),
                           "--gen-seconds", str(gen_s), "--prompt-lengths", lengths] + smoke)
        shutil.copytree(d_out / name, out / name)
        shutil.copy(d_out / "drafter_summary.json", results / f"{name}_summary.json")
        summary[name] = json.loads((d_out / "drafter_summary.json").read_text())
        save_summary()

    # the model card's EAGLE-3 measure: 1,024 held-out prompts of 256 tokens (pipeline.py seed + 3)
    from training import eagle3
    from training.pipeline import acceptance_eval
    from training.tokenizer import special_ids

    ids = special_ids(tok)
    n_eval, plen = (8, 64) if args.smoke else (1024, 256)
    prompts, _ = generation_set(tok, corp.held_out, n_eval, plen, ids, args.seed + 3)
    card = {}
    for label, tpath, dpath in (("old", EMBEDDED / "target", EMBEDDED / "drafter-eagle3"), ("new", tdir, out / "drafter-eagle3")):
        tgt = AutoModelForCausalLM.from_pretrained(tpath, dtype=torch.float32).to(dev).eval()
        dr = eagle3.Eagle3Drafter.load(dpath).to(dev).eval()
        gen = torch.cat([target_mod.greedy_generate(tgt, prompts[i : i + 1024].to(dev), 96) for i in range(0, len(prompts), 1024)])
        cum = acceptance_eval(tgt, dr, gen, plen, stop_ids, 7)
        card[label] = {"cumulative": cum, "mean_acceptance_length": {k: round(eagle3.mean_acceptance_length(cum, k), 3) for k in (1, 3, 5, 7)}}
    summary["eagle3_card_measure"] = card
    log({"eagle3_card_measure": card})
    save_summary()
    log({"done": round(time.time() - t_start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
