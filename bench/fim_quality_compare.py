"""Models against each other on the same fim_quality tasks (issue 27).

Reads the JSON files of ``bench/fim_quality.py`` runs made with the same
``--source-dir``, ``--tasks`` and ``--seed`` against different servers, checks
that they hold the same tasks, and prints per condition each model's exact
match and edit similarity, and the paired difference of edit similarity and
of exact match of every model against the first one (95% bootstrap interval
over tasks, as fim_quality.paired_difference computes it).

    python -m quickdraft.bench.fim_quality_compare NAME=FILE.json NAME=FILE.json [...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

from quickdraft.bench.fim_quality import edit_similarity, paired_difference

CONDITIONS = ("tree-sitter", "plain window")


def scores(run: dict, condition: str) -> tuple[list[float], list[float]]:
    """(exact match 0/1, edit similarity) per task, recomputed from the shown first lines."""
    exact, sim = [], []
    for task in run["tasks"]:
        got = task.get(condition, "")
        exact.append(float(got == task["expected"]))
        sim.append(edit_similarity(got, task["expected"]))
    return exact, sim


def compare(runs: dict[str, dict], seed: int = 0) -> dict:
    names = list(runs)
    first = runs[names[0]]["tasks"]
    for name in names[1:]:
        other = runs[name]["tasks"]
        if [(t["path"], t["expected"]) for t in other] != [(t["path"], t["expected"]) for t in first]:
            raise SystemExit(f"{name}: not the same tasks as {names[0]} (same --source-dir, --tasks and --seed?)")
    out: dict = {"tasks": len(first), "models": names, "conditions": {}}
    for cond in CONDITIONS:
        per = {name: scores(run, cond) for name, run in runs.items()}
        rows = {name: {"exact_match": statistics.fmean(e), "edit_similarity": statistics.fmean(s),
                       "empty": sum(not t.get(cond) for t in runs[name]["tasks"])} for name, (e, s) in per.items()}
        vs = {}
        for name in names[1:]:
            vs[f"{name} - {names[0]}"] = {
                "edit_similarity": paired_difference(per[name][1], per[names[0]][1], seed=seed),
                "exact_match": paired_difference(per[name][0], per[names[0]][0], seed=seed),
            }
        out["conditions"][cond] = {"models": rows, "paired": vs}
    for name in names:  # the bridge's context against the plain window, per model
        (_, ts), (_, pw) = scores(runs[name], "tree-sitter"), scores(runs[name], "plain window")
        out.setdefault("tree_sitter_minus_plain", {})[name] = paired_difference(ts, pw, seed=seed)
    return out


def _ci(p: dict) -> str:
    return f"{p['mean']:+.3f} ({p['ci95'][0]:+.3f} .. {p['ci95'][1]:+.3f})"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=FILE", help="the first is the reference of the paired differences")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        name, _, path = spec.partition("=")
        with open(path) as f:
            runs[name] = json.load(f)
    result = compare(runs, args.seed)
    print(f"{result['tasks']} tasks; paired differences against {result['models'][0]}, 95% bootstrap intervals\n")
    print("| condition | model | exact match | edit similarity | empty | edit similarity vs ref | exact match vs ref |")
    print("|---|---|---|---|---|---|---|")
    for cond, c in result["conditions"].items():
        for name, row in c["models"].items():
            p = c["paired"].get(f"{name} - {result['models'][0]}")
            print(f"| {cond} | {name} | {row['exact_match']:.3f} | {row['edit_similarity']:.3f} | {row['empty']} | "
                  f"{_ci(p['edit_similarity']) if p else '(ref)'} | {_ci(p['exact_match']) if p else '(ref)'} |")
    print("\n| model | tree-sitter - plain window, edit similarity | wins / losses / ties |")
    print("|---|---|---|")
    for name, p in result["tree_sitter_minus_plain"].items():
        print(f"| {name} | {_ci(p)} | {p['wins']} / {p['losses']} / {p['ties']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
