"""Continue a P-EAGLE drafter with the served-matched loss, against a control.

The served decoder drafts only where its previous step ended (mostly right
after a rejected draft), and only reads slot k where drafts 1..k-1 were
accepted; teacher-forced training weighs every anchor and every slot alike
(docs/vllm-notes.md, "Teacher-forced vs served"). This continues the same
drafter twice from the same weights on the same batches: once with the old
loss (control) and once with ``parallel_loss(served_weight=, chain_condition=)``,
then measures both the way vLLM serves them (training/served_acceptance.py's
decoder replay on the target's greedy continuations of the benchmark's held-out
FIM prompts, equal to vLLM step for step) and teacher forced.

    # GPU (see docs/vllm-notes.md for the run that should replace the shipped head)
    PYTHONPATH=$PWD python3 -m training.drafter_served --out /tmp/ds --results $OUT \\
        --prompts-per-length 4096 --steps 1500 --served-weight 1 --chain-condition 1
    # CPU probe (stdlib prompts, small)
    .venv/bin/python -m training.drafter_served --out /tmp/ds --results /tmp/ds --stdlib-only \\
        --prompt-lengths 256 --prompts-per-length 192 --gen-tokens 64 --steps 120 --batch-tokens 4000
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from training import eagle3
from training.served_acceptance import EMBEDDED, anchor_chains, mean_al, per_position, prompt_ids, stop_ids


def served_measure(target, drafter, prompts: list[list[int]], k: int, new_tokens: int, stops: list[int]) -> dict:
    """Per-position acceptance a greedy K-draft decoder gets (vLLM's counters) and
    the teacher-forced figure over every anchor, on the target's greedy continuations."""
    from training.target import greedy_generate

    served, every = [], []
    for ids in prompts:
        seq = greedy_generate(target, torch.tensor([ids], device=target.device), new_tokens)[0].tolist()
        gen = seq[len(ids):]
        cut = next((i + 1 for i, t in enumerate(gen) if t in stops), len(gen))
        chains = anchor_chains(target, drafter, ids, gen[:cut], k)
        served.append(eagle3.decoder_steps(chains, k))
        every.append(chains)
    return {"served": {"per_position": per_position(served, k), "mean_acceptance_length": mean_al(served), "steps": sum(map(len, served))},
            "teacher_forced": {"per_position": per_position(every, k), "mean_acceptance_length": mean_al(every), "anchors": sum(map(len, every))}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=EMBEDDED / "target")
    ap.add_argument("--drafter", type=Path, default=EMBEDDED / "drafter-p-eagle")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--site-packages", type=Path, help="collect training prompts from this folder (default: the interpreter's)")
    ap.add_argument("--stdlib-only", action="store_true")
    ap.add_argument("--prompt-lengths", default="64,160,288,480,704,896")
    ap.add_argument("--prompts-per-length", type=int, default=4096)
    ap.add_argument("--gen-tokens", type=int, default=96)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch-tokens", type=int, default=24000)
    ap.add_argument("--served-weight", type=float, default=1.0)
    ap.add_argument("--chain-condition", type=float, default=1.0)
    ap.add_argument("--served-k", type=int, default=5)
    ap.add_argument("--eval-prompts", type=int, default=64, help="bench/data/heldout_prompts.jsonl, as the server tokenizes them")
    ap.add_argument("--eval-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=21)
    a = ap.parse_args(argv)

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from quickdraft.prompt_format import STOP_TOKENS
    from training import corpus as corpus_mod
    from training.pipeline import Log, generation_set, valid_mask
    from training.target import cosine_lr, greedy_generate
    from training.tokenizer import special_ids

    t_start = time.time()
    a.out.mkdir(parents=True, exist_ok=True)
    a.results.mkdir(parents=True, exist_ok=True)
    log = Log(a.results / "drafter_served_log.jsonl")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = Tokenizer.from_file(str(a.target / "tokenizer.json"))
    ids = special_ids(tok)
    stops = [ids[s] for s in STOP_TOKENS]
    assert sorted(stops) == stop_ids(a.target)
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    base = eagle3.Eagle3Drafter.load(a.drafter).to(dev).eval()
    assert base.cfg.parallel_slots, "a P-EAGLE drafter (parallel_slots > 0) is needed"

    if a.stdlib_only:
        empty = a.out / "empty-site"
        empty.mkdir(exist_ok=True)
        corp = corpus_mod.collect([empty], include_stdlib=True)
    else:
        corp = corpus_mod.collect([a.site_packages] if a.site_packages else None)
    buckets = {}
    for L in [int(x) for x in a.prompt_lengths.split(",")]:
        t0 = time.time()
        prompts, _ = generation_set(tok, corp.train, a.prompts_per_length, L, ids, a.seed + L)
        buckets[L] = torch.cat([greedy_generate(target, prompts[i : i + a.gen_batch].to(dev), a.gen_tokens) for i in range(0, len(prompts), a.gen_batch)])
        log({"prompt_len": L, "continuations": len(buckets[L]), "seconds": round(time.time() - t0, 1)})

    evals = prompt_ids(a.target, a.eval_prompts)
    summary: dict = {"args": {k: str(v) for k, v in vars(a).items()}, "before": served_measure(target, base, evals, a.served_k, a.eval_tokens, stops)}
    log({"before": summary["before"]})

    variants = {"control": (0.0, 0.0), "served": (a.served_weight, a.chain_condition)}
    models = {name: copy.deepcopy(base).train() for name in variants}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0) for name, m in models.items()}
    embed, head = target.model.embed_tokens, target.lm_head.weight
    g = torch.Generator().manual_seed(a.seed)
    lengths = sorted(buckets)
    for step in range(a.steps):
        L = lengths[step % len(lengths)]
        data = buckets[L]
        T = data.shape[1]
        seqs = data[torch.randint(0, len(data), (max(4, a.batch_tokens // T),), generator=g).to(dev)].long()
        anchors = torch.arange(L - 1, T - 2, device=dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            aux, logits = eagle3.target_features(target, seqs, base.cfg.aux_layer_ids)
            teacher = torch.softmax(logits.float(), dim=-1)
        valid = valid_mask(seqs, L, stops)
        rec: dict = {"step": step + 1, "prompt_len": L}
        for name, (sw, cc) in variants.items():
            for group in opts[name].param_groups:
                group["lr"] = cosine_lr(step / a.steps, a.lr)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss, accs = eagle3.parallel_loss(models[name], embed, head, seqs, aux.float(), teacher, valid, anchors,
                                                  served_weight=sw, served_k=a.served_k, chain_condition=cc)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(models[name].parameters(), 1.0)
            opts[name].step()
            rec[name] = {"loss": round(loss.item(), 4), "acc": [round(x, 3) for x in accs[:5]]}
        if (step + 1) % 20 == 0 or step == 0:
            rec["seconds"] = round(time.time() - t_start, 1)
            log(rec)
    for name, m in models.items():
        m.eval()
        summary[name] = served_measure(target, m, evals, a.served_k, a.eval_tokens, stops)
        log({name: summary[name]})
        m.save(a.out / f"drafter-p-eagle-{name}")
    summary["wall_s"] = round(time.time() - t_start, 1)
    (a.results / "drafter_served_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "args"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
