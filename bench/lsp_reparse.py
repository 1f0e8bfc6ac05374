"""Incremental reparse after a one-character edit on a 5,000-line file (target <= 1 ms).

For random positions, applies a one-character insertion the way ``didChange``
does (document splice, line index, ``Tree.edit``) and then times the reparse
that reuses the old tree. Reported separately: the edit bookkeeping, the
reparse, and, for reference, a full parse from scratch.

    python -m quickdraft.bench.lsp_reparse [--lines 5000] [--file PATH] [--language python]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

from quickdraft.bench.lsp_common import generate_python, percentiles, report
from quickdraft.lsp_bridge.languages import canonical_id, load
from quickdraft.lsp_bridge.syntax import captures, parser_for
from quickdraft.lsp_bridge.workspace import Change, Workspace

TARGET_MS = 1.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--file", help="use this source file instead of the generated Python one")
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--debounce-samples", type=int, default=100)
    parser.add_argument("--debounce-ms", type=int, default=75)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="lsp_reparse.json")
    args = parser.parse_args(argv)

    if args.file:
        with open(args.file, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        language = canonical_id("", args.file) or "python"
        name = os.path.basename(args.file)
    else:
        text, language, name = generate_python(args.lines, args.seed), "python", "service.py"

    ws = Workspace()
    opened = ws.open(f"file:///bench/{name}", text, language_id=language)
    assert opened.tree is not None
    rng = random.Random(args.seed)
    doc = opened.doc
    spec = load(language)
    # Edit where a user types without breaking the file: inside identifiers
    # (an edit that leaves a syntax error makes every later parse slower,
    # which random insertions would do). Each edit is undone afterwards.
    identifiers = captures(spec, "identifiers", opened.tree.root_node).get("identifier", [])
    targets = [n.end_byte for n in identifiers]
    edit_ms, reparse_ms = [], []
    version = 1
    for _ in range(args.samples):
        offset = rng.choice(targets)
        line, character = doc.position_at(offset)
        version += 1
        t0 = time.perf_counter()
        ws.change(opened.uri, version, [Change("x", (line, character), (line, character))])
        t1 = time.perf_counter()
        tree = opened.tree  # reparse, reusing the edited old tree
        t2 = time.perf_counter()
        assert tree is not None
        edit_ms.append((t1 - t0) * 1e3)
        reparse_ms.append((t2 - t1) * 1e3)
        version += 1
        ws.change(opened.uri, version, [Change("", (line, character), (line, character + 1))])
        assert opened.tree is not None

    assert doc.text == text  # every edit was undone

    # In the server the reparse starts on a worker thread at didChange; a
    # completion asked after the debounce waits only for what is left of it.
    wait_ms = asyncio.run(_background_waits(text, language, name, targets, rng, args))

    full_ms = []
    for _ in range(max(5, args.samples // 50)):
        t0 = time.perf_counter()
        parser_for(spec).parse(doc.data)
        full_ms.append((time.perf_counter() - t0) * 1e3)

    combined = [a + b for a, b in zip(edit_ms, reparse_ms)]
    rows = [
        {"measure": "incremental reparse", **percentiles(reparse_ms)},
        {"measure": "didChange bookkeeping (splice, lines, Tree.edit)", **percentiles(edit_ms)},
        {"measure": "edit + reparse", **percentiles(combined)},
        {"measure": f"wait for the tree {args.debounce_ms} ms after the edit (background reparse)", **percentiles(wait_ms)},
        {"measure": "full parse (reference)", **percentiles(full_ms)},
    ]
    over = {"incremental reparse": reparse_ms, "edit + reparse": combined}
    for row in rows:
        if row["measure"] in over:
            samples = over[row["measure"]]
            row["share_over_target"] = sum(ms > TARGET_MS for ms in samples) / len(samples)
        row["p50_vs_target"] = row["p50_ms"] / TARGET_MS
        row["p99_vs_target"] = row["p99_ms"] / TARGET_MS
    report(
        f"One-character edit on {doc.line_count} lines of {language} (target reparse <= {TARGET_MS} ms)",
        rows,
        [("measure", "measure"), ("n", "n"), ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"), ("max_ms", "max ms"), ("p50_vs_target", "p50 / target"), ("p99_vs_target", "p99 / target"), ("share_over_target", "share > target")],
        args.json,
        {"lines": doc.line_count, "language": language, "target_ms": TARGET_MS},
    )
    return {"rows": rows}


async def _background_waits(text, language, name, targets, rng, args) -> list[float]:
    """Edit, wait the debounce, then time how long the completion waits for the tree."""
    ws = Workspace(background_parse=True)
    opened = ws.open(f"file:///bench/bg-{name}", text, language_id=language)
    waits = []
    for i in range(args.debounce_samples):
        line, character = opened.doc.position_at(rng.choice(targets))
        ws.change(opened.uri, 2 * i + 2, [Change("x", (line, character), (line, character))])
        await asyncio.sleep(args.debounce_ms / 1000)
        t0 = time.perf_counter()
        await opened.fresh_tree()
        waits.append((time.perf_counter() - t0) * 1e3)
        ws.change(opened.uri, 2 * i + 3, [Change("", (line, character), (line, character + 1))])
    return waits


if __name__ == "__main__":
    main()
