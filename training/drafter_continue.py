"""Continue both candidate drafters on the candidate target, then measure them.

    python -m training.drafter_continue --target training/candidate/target \
        --drafters training/candidate --out /tmp/dc --results $OUT [budgets]

Runs training/drafter_only.py twice in one process (the corpus is collected
once): EAGLE-3 at 256-token prompts, P-EAGLE at the six prompt lengths of the
shipped second pass; each starts from the weights in ``--drafters`` and logs
its acceptance before and after on the same held-out sets as
context_finetune.py. Then the model card's EAGLE-3 measure (1,024 held-out
prompts of 256 tokens, K=1,3,5,7) for the drafter it started from and the new
one. ``--results`` gets the summary, both logs and one tar per drafter.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

import torch

from quickdraft.prompt_format import STOP_TOKENS
from training import corpus as corpus_mod

P_EAGLE_LENGTHS = "64,160,288,480,704,896"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafters", type=Path, required=True, help="folder holding drafter-eagle3/ and drafter-p-eagle/")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--eagle3-s", type=float, default=160)
    ap.add_argument("--eagle3-gen-s", type=float, default=20)
    ap.add_argument("--eagle3-prompts", type=int, default=12288)
    ap.add_argument("--p-eagle-s", type=float, default=160)
    ap.add_argument("--p-eagle-gen-s", type=float, default=36)
    ap.add_argument("--p-eagle-prompts", type=int, default=6144)
    ap.add_argument("--card-prompts", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true", help="toy sizes on a CPU")
    ap.add_argument("--site-packages", type=Path, help="collect the corpus from this folder only (no stdlib; for --smoke)")
    args = ap.parse_args(argv)

    t_start = time.time()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    args.results.mkdir(parents=True, exist_ok=True)
    summary: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save():
        summary["wall_s"] = round(time.time() - t_start, 1)
        (args.results / "drafter_continue_summary.json").write_text(json.dumps(summary, indent=1))

    collect, cache = corpus_mod.collect, {}

    def collect_once(*a, **k):
        if "c" not in cache:
            cache["c"] = collect([args.site_packages], include_stdlib=False) if args.site_packages else collect(*a, **k)
        return cache["c"]

    corpus_mod.collect = collect_once

    from training import drafter_only

    smoke = ["--batch-tokens", "2000", "--gen-tokens", "16"] if args.smoke else []
    # (drafter_only makes 256 held-out prompts per length: the smoke corpus must hold enough held-out files)
    for name, secs, gen_s, n_prompts, lengths in (
        ("drafter-eagle3", args.eagle3_s, args.eagle3_gen_s, args.eagle3_prompts, "256"),
        ("drafter-p-eagle", args.p_eagle_s, args.p_eagle_gen_s, args.p_eagle_prompts, "64,160" if args.smoke else P_EAGLE_LENGTHS),
    ):
        d_out = args.out / f"_{name}"
        drafter_only.main(["--target", str(args.target), "--drafter", str(args.drafters / name), "--out", str(d_out),
                           "--seconds", str(secs), "--gen-seconds", str(gen_s), "--prompt-lengths", lengths,
                           "--prompts-per-length", str(n_prompts)] + smoke)
        shutil.copytree(d_out / name, args.out / name)
        log_lines = (d_out / "drafter_log.jsonl").read_text().splitlines()
        before = next(json.loads(x)["before"] for x in log_lines if '"before"' in x)
        summary[name] = {**json.loads((d_out / "drafter_summary.json").read_text()),
                         "before": {L: {"mal5": v["mal5"], "cumulative": v["cumulative"]} for L, v in before.items()}}
        shutil.copy(d_out / "drafter_log.jsonl", args.results / f"{name}_log.jsonl")
        with tarfile.open(args.results / f"{name}.tar", "w") as tar:
            tar.add(args.out / name, arcname=name)
        save()

        if name == "drafter-eagle3":  # the model card's measure, while P-EAGLE has not started
            summary["eagle3_card_measure"] = card_measure(args, cache["c"])
            save()

    summary["done"] = True
    save()
    print(json.dumps({"done": summary["wall_s"]}), flush=True)
    return 0


@torch.no_grad()
def card_measure(args, corp) -> dict:
    """1,024 held-out prompts of 256 tokens (pipeline.py seed 0 + 3), 96 greedy tokens, K=1,3,5,7."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from training import eagle3
    from training import target as target_mod
    from training.pipeline import acceptance_eval, generation_set
    from training.tokenizer import special_ids

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    ids = special_ids(tok)
    stop_ids = [ids[s] for s in STOP_TOKENS]
    n_eval, plen = (8, 64) if args.smoke else (args.card_prompts, 256)
    prompts, _ = generation_set(tok, corp.held_out, n_eval, plen, ids, 0 + 3)
    tgt = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).to(dev).eval()
    gen = torch.cat([target_mod.greedy_generate(tgt, prompts[i : i + 1024].to(dev), 96) for i in range(0, len(prompts), 1024)])
    card = {"prompts": len(prompts)}
    for label, dpath in (("before", args.drafters / "drafter-eagle3"), ("after", args.out / "drafter-eagle3")):
        dr = eagle3.Eagle3Drafter.load(dpath).to(dev).eval()
        cum = acceptance_eval(tgt, dr, gen, plen, stop_ids, 7)
        card[label] = {"cumulative": cum, "mean_acceptance_length": {k: round(eagle3.mean_acceptance_length(cum, k), 3) for k in (1, 3, 5, 7)}}
    print(json.dumps({"eagle3_card_measure": card}), flush=True)
    return card


if __name__ == "__main__":
    sys.exit(main())
