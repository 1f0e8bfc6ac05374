"""Retrieval-augmented fill-in-the-middle samples: the prompt the LSP bridge sends.

The old repository-level samples (``samples.py``) join *random* files of a
distribution, so the model never learned that context files hold the
definitions it needs. Here a hole is cut in a file the way an editor asks for
one, and the prompt around it is built by the bridge's own context engine
(``lsp_bridge/context.py``: windows cut at syntactic boundaries, enclosing
headers and imports kept, definitions of the symbols used near the cursor from
files opened as editor tabs and from followed imports), within the embedded
model's 768-token budget, with the blank-line rewrite of ``completer.make_request``
(a cursor on a blank line is asked from the line's start). The text is
rendered by ``quickdraft/prompt_format.py`` as the server renders requests, and
the middle (what was removed, seen from where the prompt ends) follows it.

Definitions come from the bridge's tree-sitter queries, not from a copy of
them, so training sees exactly what serving sends. Only files of the training
corpus are searched for definitions (held-out distributions installed in the
same site-packages are never read).

    samples = build(corpus.train, roots, seconds=60, workers=16, seed=0)
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from quickdraft.prompt_format import ENDOFTEXT, CodeContext, render

BUDGET_TOKENS = 768  # the embedded preset's prompt budget (server/presets.py)
# The bridge sizes prompts with a learned bytes-per-token ratio times 0.92
# (lsp_bridge/token_ratio.py); on Python that is about 3.45 * 0.92 = 3.2.
RATIO_RANGE = (2.6, 3.6)
OPEN_NEIGHBOURS = 4  # bench/fim_quality.py --open-neighbours
MAX_FILE_BYTES = 200_000
HOLES_PER_FILE = 3
EOF_SHARE = 0.15
"""Holes at the end of what is written so far: nothing after the cursor (a
function being written at the bottom of a file, the README's fibonacci).
Without them every prompt has a suffix and an empty one reads as "stop"."""
_COMMENT_STARTS = ("#", "//", "/*", "*", '"""', "'''")


def ensure_bridge() -> None:
    """Make ``quickdraft.lsp_bridge`` importable from a plain checkout
    (PYTHONPATH=repo root, no editable install): the bridge lives in the
    top-level ``lsp_bridge/`` folder, which pyproject maps into ``quickdraft``."""
    if importlib.util.find_spec("quickdraft.lsp_bridge") is None:
        import quickdraft

        quickdraft.__path__.append(str(Path(__file__).resolve().parents[1]))


@dataclass
class Hole:
    doc: str  # the document the editor holds: the file with the hole cut out
    cursor: int  # character offset of the cursor in doc
    start: int  # the removed text is text[start:end] of the original file
    end: int


def line_hole(text: str, first: int, removed: int) -> Hole:
    """Lines first..first+removed-1 (0-based) removed, the cursor left after the
    first one's indentation on the emptied line (bench/fim_quality.py make_tasks)."""
    lines = text.split("\n")
    start = sum(len(line) + 1 for line in lines[:first])
    line = lines[first]
    indent = line[: len(line) - len(line.lstrip())]
    before = "\n".join(lines[:first]) + "\n" + indent
    removed = max(1, min(removed, len(lines) - first - 1))  # keep the file's last line (break)
    if first + removed < len(lines):
        after = "\n" + "\n".join(lines[first + removed :])
        # doc == text[:start] + text[end:]: the last removed line's line break stays
        end = start + len("\n".join(lines[first : first + removed]))
    else:  # the file's last line, without a line break
        after, end = "", len(text)
    return Hole(before + after, len(before), start + len(indent), end)


def pick_hole(text: str, rng: random.Random) -> Hole | None:
    """A hole as an editor sees it: ``cut_hole``'s, and in ``EOF_SHARE`` of them
    the file ends at the cursor (nothing written after it yet)."""
    hole = cut_hole(text, rng)
    if hole is not None and rng.random() < EOF_SHARE:
        return Hole(hole.doc[: hole.cursor], hole.cursor, hole.start, hole.end)
    return hole


def cut_hole(text: str, rng: random.Random) -> Hole | None:
    """A hole in the middle of a file. Mostly (3/4) whole lines removed with the
    cursor left on the emptied line after its indentation, as in
    bench/fim_quality.py; otherwise the rest of a line (sometimes more lines)
    after a cursor inside it."""
    lines = text.split("\n")
    code = [i for i, line in enumerate(lines) if i > 0 and line.strip()]
    if not code:
        return None
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    if rng.random() < 0.75:
        strict = [i for i in code if len(lines[i].strip()) >= 6 and not lines[i].strip().startswith(_COMMENT_STARTS)]
        first = rng.choice(strict if strict and rng.random() < 0.8 else code)
        return line_hole(text, first, rng.randint(1, 4))
    i = rng.choice(code)
    line = lines[i]
    indent = len(line) - len(line.lstrip())
    col = rng.randrange(indent, len(line.rstrip()) + 1)
    extra = rng.choice([0, 0, 0, 1, 2]) if rng.random() < 0.35 else 0
    a = starts[i] + col
    last = min(len(lines) - 1, i + extra)
    b = starts[last] + len(lines[last])
    if b <= a:
        return None
    return Hole(text[:a] + text[b:], a, a, b)


def restricted_index(allowed: set[str]):
    """The bridge's SymbolIndex, reading only allowed files from disk (training files only)."""
    from quickdraft.lsp_bridge.symbols import SymbolIndex

    class Restricted(SymbolIndex):
        def for_path(self, path: str):
            return super().for_path(path) if path in allowed else None

    return Restricted(MAX_FILE_BYTES)


def bridge_prompt(root: str, path: str, hole: Hole, neighbours: list[tuple[str, str]], budget_tokens: int, ratio: float, index,
                  blank_line_from_line_start: bool = True) -> tuple[CodeContext, int, int]:
    """(rendered context, start, end): what the bridge + server send for this
    hole, and the span of the original file that the model must write (the hole,
    widened to the whole line when the prompt starts the cursor's line afresh)."""
    from quickdraft.lsp_bridge.context import Budget, ContextEngine, from_line_start
    from quickdraft.lsp_bridge.workspace import Workspace, path_to_uri

    ws = Workspace([root], max_file_bytes=MAX_FILE_BYTES)
    for npath, ntext in neighbours:
        ws.open(path_to_uri(npath), ntext, language_id="python")
    uri = path_to_uri(path)
    opened = ws.open(uri, hole.doc, language_id="python")
    offset = len(hole.doc[: hole.cursor].encode("utf-8", "surrogatepass"))
    try:
        prompt = ContextEngine(ws, index).build(opened, offset, Budget(budget_tokens, ratio))
    finally:
        index.forget_open(uri)
    prefix, suffix = prompt.prefix, prompt.suffix
    start, end = hole.start, hole.end
    line_start = hole.doc.rfind("\n", 0, hole.cursor) + 1
    line_end = hole.doc.find("\n", hole.cursor)
    line_end = len(hole.doc) if line_end < 0 else line_end
    on_blank_line = not hole.doc[line_start:line_end].strip()
    if blank_line_from_line_start and on_blank_line:  # completer.make_request
        moved = from_line_start(prefix, suffix)
        if moved is not None:
            prefix, suffix = moved
            # the model now writes the line's indentation and the line break too
            start -= hole.cursor - line_start
            end += min(line_end + 1, len(hole.doc)) - hole.cursor
    ctx = CodeContext(prefix=prefix, suffix=suffix, file_path=ws.relative_path(opened.path), repo_name="",
                      context_files=tuple(prompt.context_files))
    return ctx, start, end


def file_samples(dist: str, root: str, path: str, text: str, same_dir: list[tuple[str, str]], index, rng: random.Random,
                 holes: int = HOLES_PER_FILE) -> list[str]:
    """Training texts for ``holes`` holes cut in one file."""
    out = []
    for _ in range(holes):
        hole = pick_hole(text, rng)
        if hole is None:
            continue
        others = sorted(same_dir)
        if rng.random() < 0.6:
            neighbours = others[:OPEN_NEIGHBOURS]  # what the benchmark opens
        else:
            neighbours = rng.sample(others, min(len(others), rng.randint(0, OPEN_NEIGHBOURS)))
        ratio = rng.uniform(*RATIO_RANGE)
        ctx, start, end = bridge_prompt(root, path, hole, neighbours, BUDGET_TOKENS, ratio, index)
        ctx = CodeContext(ctx.prefix, ctx.suffix, ctx.file_path, dist, ctx.context_files)
        out.append(render(ctx) + text[start:end] + ENDOFTEXT)
    return out


# -- building many samples in worker processes ---------------------------

_STATE: dict = {}


def absolute_paths(dist_files: dict[str, list[tuple[str, str]]], roots: list[str]) -> dict[tuple[str, int], tuple[str, str]]:
    """(distribution, file index) -> (workspace root, absolute path), for files found under a root."""
    found = {}
    for dist, files in dist_files.items():
        for i, (rel, _text) in enumerate(files):
            for root in roots:
                p = os.path.join(root, rel)
                if os.path.isfile(p):
                    found[(dist, i)] = (root, p)
                    break
    return found


def _work(args) -> tuple[list[str], int]:
    jobs, deadline, seed = args
    ensure_bridge()
    dist_files, where = _STATE["dist_files"], _STATE["where"]
    index = restricted_index(_STATE["allowed"])
    rng = random.Random(seed)
    out, errors = [], 0
    for dist, i in jobs:
        if time.time() > deadline:
            break
        root, path = where[(dist, i)]
        directory = os.path.dirname(path)
        same_dir = [(where[(dist, j)][1], t) for j, (_r, t) in enumerate(dist_files[dist])
                    if j != i and (dist, j) in where and os.path.dirname(where[(dist, j)][1]) == directory]
        try:
            out += file_samples(dist, root, path, dist_files[dist][i][1], same_dir, index, rng)
        except Exception:  # a file the bridge cannot handle is skipped, not fatal
            errors += 1
    return out, errors


def build(dist_files: dict[str, list[tuple[str, str]]], roots: list[str], *, seconds: float, workers: int, seed: int,
          max_files: int | None = None) -> tuple[list[str], dict]:
    """Context samples for (a random subset of) the files, within ``seconds``."""
    import multiprocessing as mp

    where = absolute_paths(dist_files, roots)
    _STATE.update(dist_files=dist_files, where=where, allowed={p for _r, p in where.values()})
    keys = sorted(where)
    random.Random(seed).shuffle(keys)
    if max_files:
        keys = keys[:max_files]
    deadline = time.time() + seconds
    shards = [(keys[k::workers], deadline, seed * 1000 + k) for k in range(workers)]
    t0 = time.time()
    if workers > 1:
        with mp.get_context("fork").Pool(workers) as pool:
            results = pool.map(_work, shards)
    else:
        results = [_work(s) for s in shards]
    texts = [t for r, _e in results for t in r]
    stats = {"files": len(keys), "files_found": len(where), "samples": len(texts), "errors": sum(e for _r, e in results),
             "chars": sum(len(t) for t in texts), "seconds": round(time.time() - t0, 1)}
    return texts, stats


def default_roots() -> list[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    return [paths["purelib"], paths["stdlib"]]


if __name__ == "__main__":  # a quick look: python -m training.context_samples DIR [N]
    root = os.path.abspath(sys.argv[1])
    files = {}
    for directory, _dirs, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(".py"):
                p = os.path.join(directory, name)
                files.setdefault("local", []).append((os.path.relpath(p, root), open(p, encoding="utf-8").read()))
    texts, stats = build(files, [root], seconds=30, workers=1, seed=0, max_files=int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    print(stats)
    print(texts[0] if texts else "")
