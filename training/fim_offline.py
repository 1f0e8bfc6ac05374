"""bench/fim_quality.py without a server: prompts here, greedy decoding on a GPU, scores here.

    # 1. here (needs the venv: tree-sitter, the bridge): both conditions' prompts as token ids
    python -m training.fim_offline prompts --source-dir /tmp/heldout --tasks 1200 --seed 2 --out prompts.jsonl
    # 2. on the device: training/context_finetune.py --fim-prompts prompts.jsonl (greedy, 48 tokens, float32)
    # 3. here: the benchmark's post-processing and scores
    python -m training.fim_offline score --prompts prompts.jsonl --generations gens.jsonl

Prompts are built by the benchmark's own functions (``make_tasks``,
``tree_sitter_request``, ``plain_request``) and rendered and tokenized by the
server's own ``tokenize`` (user text with special-token parsing off). The
bridge's bytes-per-token learning is replayed per condition (``BytesPerToken``: the announced 3.45, then each prompt's own ratio; a prompt
over the server's limit of 1,008 tokens is rebuilt once with the corrected
ratio, as ``Backend.complete_within_budget`` does). Answers go through the
same ``Draft`` (first line that is not blank, cursor on a blank line asked from
the line's start) and the same edit similarity and paired bootstrap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

BUDGET_TOKENS = 768  # server/presets.py, embedded
ANNOUNCED_CHARS_PER_TOKEN = 3.45
MAX_PROMPT_TOKENS = 1024 - 16  # server/config.py max_prompt_tokens(): max_model_len - 16
MAX_TOKENS = 48  # fim_quality --max-tokens default
CONDITIONS = ("tree-sitter", "plain window")
TARGET = "quickdraft/models/embedded/target"


def server_tokenizer(target_dir: str):
    """Request -> token ids exactly as the server computes them (server/prompt_tokens.py ``tokenize``)."""
    from transformers import AutoTokenizer

    from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize

    tokens = PromptTokenizer(AutoTokenizer.from_pretrained(target_dir))
    return lambda request: tokenize(tokens, request, "qwen-fim")


def build_prompts(source_dir: str, tasks: int, seed: int, out: str, neighbours: int = 4, target_dir: str = TARGET) -> dict:
    from quickdraft.bench import fim_quality as fq
    from quickdraft.lsp_bridge.context import Budget
    from quickdraft.lsp_bridge.settings import Settings
    from quickdraft.lsp_bridge.token_ratio import BytesPerToken, prompt_bytes

    root = os.path.abspath(source_dir)
    files = fq.source_files(root, {"python"})
    task_list = fq.make_tasks(files, tasks, seed)
    settings = Settings(blank_line_from_line_start=True)
    builders = {
        "tree-sitter": lambda task, b: fq.tree_sitter_request(task, root, files, b, settings, neighbours),
        "plain window": lambda task, b: fq.plain_request(task, root, b, settings),
    }
    ratios = {name: BytesPerToken(ANNOUNCED_CHARS_PER_TOKEN) for name in builders}
    token_ids = server_tokenizer(target_dir)
    stats = {name: {"rebuilt": 0, "refused": 0, "tokens": [], "context_files": []} for name in builders}
    with open(out, "w") as f:
        for i, task in enumerate(task_list):
            record = {"task": i, "path": os.path.relpath(task.path, root), "expected": task.expected,
                      "indent": task.before[task.before.rfind("\n") + 1 :], "conditions": {}}
            for name, build in builders.items():
                ratio = ratios[name]
                for attempt in range(2):
                    request = build(task, Budget(BUDGET_TOKENS, ratio.value(task.path, task.language)))
                    ids = token_ids(request)
                    if len(ids) <= MAX_PROMPT_TOKENS:
                        ratio.observe(task.path, task.language, prompt_bytes(request), len(ids))
                        break
                    ratio.refused(task.path, task.language, prompt_bytes(request), len(ids))
                stats[name]["rebuilt"] += attempt > 0
                refused = len(ids) > MAX_PROMPT_TOKENS
                stats[name]["refused"] += refused
                stats[name]["tokens"].append(len(ids))
                stats[name]["context_files"].append(len(request.context_files))
                record["conditions"][name] = {"ids": [] if refused else ids, "refused": refused,
                                              "context_files": len(request.context_files)}
            f.write(json.dumps(record) + "\n")
    return {name: {"rebuilt": s["rebuilt"], "refused": s["refused"], "mean_tokens": statistics.fmean(s["tokens"]),
                   "max_tokens": max(s["tokens"]), "mean_context_files": statistics.fmean(s["context_files"])}
            for name, s in stats.items()}


def shown_line(text: str, indent: str) -> str:
    """The line the bridge shows for a cursor on a blank line asked from the
    line's start (fim_quality: Draft(Shape(False, indent, "", from_line_start=True)))."""
    from quickdraft.lsp_bridge.postprocess import Draft, Shape

    draft = Draft(Shape(False, indent, "", from_line_start=True))
    draft.feed(text)
    shown = draft.result()
    return shown.text.strip() if shown is not None else ""


def score(prompts: str, generations: str, seed: int = 2) -> dict:
    from quickdraft.bench.fim_quality import edit_similarity, paired_difference

    tasks = {}
    with open(prompts) as f:
        for line in f:
            r = json.loads(line)
            tasks[r["task"]] = r
    gens: dict[str, dict[str, dict[int, str]]] = {}
    with open(generations) as f:
        for line in f:
            g = json.loads(line)
            gens.setdefault(g["model"], {}).setdefault(g["condition"], {})[g["task"]] = g["text"]
    results = {}
    for model, by_cond in gens.items():
        rows, sims = {}, {}
        for cond in CONDITIONS:
            hits, sim, empty = [], [], 0
            for i in sorted(tasks):
                t = tasks[i]
                text = by_cond.get(cond, {}).get(i, "")  # a refused prompt counts as a miss
                first = shown_line(text, t["indent"]) if not t["conditions"][cond]["refused"] else ""
                empty += not first
                hits.append(first == t["expected"])
                sim.append(edit_similarity(first, t["expected"]))
            sims[cond] = sim
            rows[cond] = {"tasks": len(sim), "exact_match": sum(hits) / len(hits), "edit_similarity": statistics.fmean(sim),
                          "empty": empty / len(sim)}
        results[model] = {"conditions": rows,
                          "paired_tree_sitter_minus_plain": paired_difference(sims["tree-sitter"], sims["plain window"], seed=seed),
                          "_sims": sims}
    models = list(results)
    if len(models) == 2:  # new - old, per condition, paired by task
        a, b = models[1], models[0]
        results["new_minus_old"] = {c: paired_difference(results[a]["_sims"][c], results[b]["_sims"][c], seed=seed)
                                    for c in CONDITIONS} | {"models": [a, b]}
    for model in models:
        del results[model]["_sims"]
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--source-dir", required=True)
    p.add_argument("--tasks", type=int, default=1200)
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--out", required=True)
    s = sub.add_parser("score")
    s.add_argument("--prompts", required=True)
    s.add_argument("--generations", required=True)
    s.add_argument("--seed", type=int, default=2)
    s.add_argument("--json")
    args = ap.parse_args(argv)
    if args.cmd == "prompts":
        print(json.dumps(build_prompts(args.source_dir, args.tasks, args.seed, args.out), indent=1))
    else:
        res = score(args.prompts, args.generations, args.seed)
        text = json.dumps(res, indent=1)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
