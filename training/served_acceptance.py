"""Served vs reference vs teacher-forced acceptance on the same prompts.

Runs the real vLLM engine (greedy, one engine per setting) on a drafter's
weights and reads vLLM's per-request, per-step accepted-draft counts
(``per_request_spec_decode_metrics="detailed"``); runs training/reference.py's
decoder on the same token ids; and scores the drafter teacher-forced
(training/pipeline.py's measure: every anchor of the continuation) on the
continuations vLLM produced. The three answer different questions:

- served vs reference: is the reference decoder what vLLM does (it must be,
  step by step, or tests comparing them prove nothing);
- reference vs teacher forced: how much of the gap comes from *where* a
  decoder drafts (only at step boundaries) rather than from what it is fed.

    .venv/bin/python -m training.served_acceptance --n 12 --k 5 --parallel \\
        --prefix-caching both --reference --teacher-forced --out /tmp/sa.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "quickdraft" / "models" / "embedded"
PROMPTS = ROOT / "bench" / "data" / "heldout_prompts.jsonl"


@dataclass
class RequestResult:
    prompt_ids: list[int]
    tokens: list[int]
    accepted_per_step: list[int] = field(default_factory=list)


def per_position(steps: list[list[int]], k: int) -> list[float]:
    """Share of verify steps whose drafts 1..i were all accepted, i = 1..k
    (vLLM's "acceptance at position i")."""
    flat = [a for s in steps for a in s]
    return [round(sum(a >= i for a in flat) / max(1, len(flat)), 4) for i in range(1, k + 1)]


def mean_al(steps: list[list[int]]) -> float:
    flat = [a for s in steps for a in s]
    return round(1 + sum(flat) / max(1, len(flat)), 4)


def stop_ids(target_dir: Path) -> list[int]:
    """The target's stop tokens: its generation config's, else (a folder model_cache built,
    which has none) the prompt format's stop tokens the server uses."""
    gen = target_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text())["eos_token_id"]
        return sorted(eos if isinstance(eos, list) else [eos])
    from transformers import AutoTokenizer

    from quickdraft.prompt_format import stop_token_ids

    return sorted(stop_token_ids(AutoTokenizer.from_pretrained(str(target_dir)).get_vocab()))


def prompt_ids(target_dir: Path, n: int, path: Path = PROMPTS, prefix_chars: int = 1500, suffix_chars: int = 500,
               prefix_only: bool = False) -> list[list[int]]:
    """The first n held-out FIM prompts as the server tokenizes them (qwen-fim);
    ``prefix_only``: without their suffix, as bench/gate.py sends them."""
    from transformers import AutoTokenizer

    from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
    from quickdraft.v1 import completion_pb2 as pb

    tokens = PromptTokenizer(AutoTokenizer.from_pretrained(str(target_dir)))
    out = []
    for line in path.read_text().splitlines()[:n]:
        r = json.loads(line)
        kw = {"suffix": r["suffix"][:suffix_chars]} if r.get("suffix") is not None and not prefix_only else {}
        out.append(tokenize(tokens, pb.CompleteRequest(prefix=r["prefix"][-prefix_chars:], **kw), "qwen-fim"))
    return out


def served(target_dir: Path, drafter_dir: Path, prompts: list[list[int]], *, k: int, parallel: bool, max_tokens: int,
           prefix_caching: bool, passes: int = 1, extra_spec: dict | None = None) -> list[list[RequestResult]]:
    """Greedy generations and per-step accepted counts from one vLLM engine,
    one request at a time (batch 1, as the benchmarks serve). ``passes`` > 1
    sends the same prompts again on the same engine: with prefix caching on
    those are cache hits."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = {"method": "eagle3", "model": str(drafter_dir), "num_speculative_tokens": k, "parallel_drafting": parallel}
    spec.update(extra_spec or {})
    llm = LLM(model=str(target_dir), dtype="float32", enforce_eager=True, max_model_len=2048, max_num_seqs=1, seed=0,
              enable_prefix_caching=prefix_caching, speculative_config=spec, per_request_spec_decode_metrics="detailed",
              gpu_memory_utilization=0.3)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=stop_ids(target_dir), skip_special_tokens=False)
    results = []
    try:
        for _ in range(passes):
            one = []
            for ids in prompts:
                out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
                m = out.spec_decode_metrics
                one.append(RequestResult(list(ids), list(out.token_ids), list(m.per_step_accepted) if m else []))
            results.append(one)
    finally:
        del llm
    return results


def reference(target_dir: Path, drafter_dir: Path, prompts: list[list[int]], *, k: int, parallel: bool, max_tokens: int) -> list[RequestResult]:
    import torch
    from transformers import AutoModelForCausalLM

    from training.eagle3 import Eagle3Drafter
    from training.reference import speculative_greedy

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    drafter = Eagle3Drafter.load(drafter_dir).eval()
    stops = set(stop_ids(target_dir))
    out = []
    for ids in prompts:
        tr = speculative_greedy(target, drafter, ids, max_tokens, k, parallel, stops)
        out.append(RequestResult(list(ids), tr.tokens, tr.accepted_per_step))
    return out


def teacher_forced(target_dir: Path, drafter_dir: Path, results: list[RequestResult], k: int) -> list[float]:
    """training/pipeline.py's acceptance_eval on each served continuation (every
    anchor, not only where a decoder drafts)."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.eagle3 import Eagle3Drafter
    from training.pipeline import acceptance_eval

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    drafter = Eagle3Drafter.load(drafter_dir).eval()
    stops = stop_ids(target_dir)
    hits = [0.0] * k
    count = 0
    with torch.no_grad():
        for r in results:
            if len(r.tokens) < 3:
                continue
            seq = torch.tensor([r.prompt_ids + r.tokens])
            acc = acceptance_eval(target, drafter, seq, len(r.prompt_ids), stops, ar_steps=k, batch_size=1)
            n = len(r.tokens) - 2  # anchors acceptance_eval scores (T - 2 - (prompt_len - 1))
            for i in range(k):
                hits[i] += acc[i] * n
            count += n
    return [round(h / max(1, count), 4) for h in hits]


def anchor_chains(target, drafter, prompt: list[int], tokens: list[int], k: int) -> list[int]:
    """Drafts accepted (0..k) at every anchor of prompt + tokens, teacher forced:
    anchor a is the last real drafter position when x_{a+1} is the bonus token;
    index 0 is the anchor of the first draft (a = len(prompt) - 1). Chains stop
    at the end of the known tokens."""
    import torch

    from training import eagle3
    from training.pipeline import ar_drafts

    dev = target.device
    seq = torch.tensor([prompt + tokens], device=dev)
    T, P = seq.shape[1], len(prompt)
    n_real = T - 1
    anchors = torch.arange(P - 1, T - 1, device=dev)
    embed, head = target.model.embed_tokens, target.lm_head.weight
    with torch.no_grad():
        aux, _ = eagle3.target_features(target, seq, drafter.cfg.aux_layer_ids)
        if drafter.cfg.parallel_slots:
            m = k - 1
            emb = torch.cat([embed(seq[:, 1:]), embed.weight[drafter.cfg.slot_token_id].expand(1, anchors.numel() * m, -1)], 1)
            hid = torch.cat([drafter.fc(aux[:, :n_real]), drafter.slot_hidden().expand(1, anchors.numel() * m, -1)], 1)
            pos = torch.cat([torch.arange(n_real, device=dev), (anchors[:, None] + torch.arange(1, m + 1, device=dev)).flatten()])
            out, _, _ = drafter.layer(emb, hid, pos, eagle3.chain_mask(n_real, anchors, m, seq.device))
            lg = out @ head.T
            d0 = lg[0, anchors].argmax(-1)[:, None]
            drafts = torch.cat([d0, lg[0, n_real:].view(anchors.numel(), m, -1).argmax(-1)], 1) if m else d0
        else:
            drafts = ar_drafts(drafter, embed, head, seq, aux, anchors, k)[0]
    drafts, known = drafts.tolist(), seq[0].tolist()
    chains = []
    for i, a in enumerate(anchors.tolist()):
        c = 0
        while c < k and a + 2 + c < T and drafts[i][c] == known[a + 2 + c]:
            c += 1
        chains.append(c)
    return chains


def visited(steps: list[int]) -> list[int]:
    """Anchor indices (0 = first draft) a decoder with these per-step accepted counts drafts at."""
    out, a = [], 0
    for acc in steps:
        out.append(a)
        a += acc + 1
    return out


def anchor_analysis(target_dir: Path, drafter_dir: Path, results: list[RequestResult], k: int) -> dict:
    """Teacher-forced chains at every anchor vs at the anchors the served decoder
    drafted at, split by what the step before was."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.eagle3 import Eagle3Drafter

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    drafter = Eagle3Drafter.load(drafter_dir).eval()
    groups: dict[str, list[int]] = {"all anchors": [], "visited": [], "visited: first step": [], "visited: after all K accepted": [],
                                    "visited: after a rejection": [], "not visited": []}
    mismatched = 0
    for r in results:
        chains = anchor_chains(target, drafter, r.prompt_ids, r.tokens, k)
        vis = visited(r.accepted_per_step)
        groups["all anchors"] += chains
        seen = set()
        for j, (v, acc) in enumerate(zip(vis, r.accepted_per_step)):
            if v >= len(chains):
                continue
            seen.add(v)
            groups["visited"].append(chains[v])
            # The last step may be cut by a stop token or max_tokens, where chains end.
            mismatched += chains[v] != acc and j < len(vis) - 1
            key = "first step" if j == 0 else ("after all K accepted" if r.accepted_per_step[j - 1] == k else "after a rejection")
            groups["visited: " + key].append(chains[v])
        groups["not visited"] += [c for i, c in enumerate(chains) if i not in seen]
    return {"steps_where_teacher_forced_chain_differs_from_served": int(mismatched),
            **{name: {"anchors": len(c), "per_position": per_position([c], k), "mean_acceptance_length": mean_al([c])} for name, c in groups.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=EMBEDDED / "target")
    ap.add_argument("--drafter", type=Path, default=None, help="default: the embedded P-EAGLE (--parallel) or EAGLE-3 head")
    ap.add_argument("--n", type=int, default=12, help="held-out prompts (bench/data/heldout_prompts.jsonl)")
    ap.add_argument("--prefix-only", action="store_true", help="drop the prompts' suffixes (bench/gate.py's plain continuations)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--parallel", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix-caching", choices=["on", "off", "both"], default="off")
    ap.add_argument("--passes", type=int, default=1, help="send the prompts this many times per engine (cache hits from the 2nd)")
    ap.add_argument("--no-block-drop", action="store_true", help="disable_eagle_block_drop=True (vLLM #53388)")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--teacher-forced", action="store_true")
    ap.add_argument("--anchors", action="store_true", help="teacher-forced chains at the anchors the served decoder visited vs all")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    drafter = a.drafter or EMBEDDED / ("drafter-p-eagle" if a.parallel else "drafter-eagle3")
    prompts = prompt_ids(a.target, a.n, prefix_only=a.prefix_only)
    report: dict = {"target": str(a.target), "drafter": str(drafter), "k": a.k, "parallel": a.parallel, "n": a.n,
                    "max_tokens": a.max_tokens, "prompt_tokens": [len(p) for p in prompts], "served": {}}
    extra = {"disable_eagle_block_drop": True} if a.no_block_drop else None
    first = None
    for pc in (["on", "off"] if a.prefix_caching == "both" else [a.prefix_caching]):
        t0 = time.monotonic()
        runs = served(a.target, drafter, prompts, k=a.k, parallel=a.parallel, max_tokens=a.max_tokens,
                      prefix_caching=pc == "on", passes=a.passes, extra_spec=extra)
        for p, rs in enumerate(runs):
            steps = [r.accepted_per_step for r in rs]
            report["served"][f"prefix_caching={pc} pass={p + 1}"] = {
                "per_position": per_position(steps, a.k), "mean_acceptance_length": mean_al(steps),
                "steps": sum(map(len, steps)), "seconds": round(time.monotonic() - t0, 1),
                "per_request_steps": steps, "tokens": [r.tokens for r in rs]}
        first = first or runs[0]
    if a.reference:
        ref = reference(a.target, drafter, prompts, k=a.k, parallel=a.parallel, max_tokens=a.max_tokens)
        steps = [r.accepted_per_step for r in ref]
        report["reference"] = {"per_position": per_position(steps, a.k), "mean_acceptance_length": mean_al(steps),
                               "steps": sum(map(len, steps)), "per_request_steps": steps,
                               "same_tokens_as_served": [r.tokens == s.tokens for r, s in zip(ref, first)]}
    if a.teacher_forced:
        tf = teacher_forced(a.target, drafter, first, a.k)
        report["teacher_forced"] = {"per_position": tf, "mean_acceptance_length": round(1 + sum(tf), 4)}
    if a.anchors:
        report["anchors"] = anchor_analysis(a.target, drafter, first, a.k)
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    summary = {key: {k2: v for k2, v in val.items() if k2 in ("per_position", "mean_acceptance_length", "steps", "seconds")}
               for key, val in [*report["served"].items(), *((k3, report[k3]) for k3 in ("reference", "teacher_forced") if k3 in report)]}
    if a.anchors:
        summary["anchors"] = report["anchors"]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
