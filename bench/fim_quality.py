"""FIM quality: the bridge's tree-sitter context against a plain prefix/suffix window.

Tasks are cut from real source files: a run of 1-4 lines is removed and the
model fills the hole at the start of the first removed line (after its
indentation); the first removed line is the expected answer. Each task is
asked twice, with the same token budget and generation settings:

- ``tree-sitter``: the prompt the bridge builds (windows cut at syntactic
  boundaries, enclosing headers and imports kept, repository context from
  neighbouring files opened as editor tabs and from followed imports);
- ``plain window``: the characters just before and after the hole (3:1), no
  repository context.

Both conditions go through the bridge's backend (``lsp_bridge/backend.py``),
one per condition: each learns bytes per token from its own answers, and a
prompt refused as too long is rebuilt once with the corrected ratio, as in the
editor.

Reported: first-line exact match and edit similarity (1 - Levenshtein
distance / longer length) of the line the bridge would show (the first line
that is not blank: the cursor is on a blank line, lsp_bridge/postprocess.py),
and the paired difference of edit similarity per task with a 95% bootstrap
interval: the tree-sitter context clearly wins when the interval excludes 0.

    python -m quickdraft.bench.fim_quality --server HOST:PORT --source-dir DIR [--tasks 200]
    python -m quickdraft.bench.fim_quality --source-dir DIR --dry-run   # prompts only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
from dataclasses import dataclass

from quickdraft.bench.lsp_common import report
from quickdraft.bench.servers import wait_address_serving
from quickdraft.client import build_request
from quickdraft.lsp_bridge.backend import UP, Backend, BackendConfig, Outcome
from quickdraft.lsp_bridge.completer import make_request
from quickdraft.lsp_bridge.context import SUFFIX_SHARE, Budget, ContextEngine, from_line_start
from quickdraft.lsp_bridge.languages import canonical_id
from quickdraft.lsp_bridge.postprocess import Draft, Shape
from quickdraft.lsp_bridge.settings import Settings
from quickdraft.lsp_bridge.workspace import Workspace, path_to_uri
from quickdraft.v1 import completion_pb2 as pb

_SKIP_DIRS = {".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", "target", ".tox"}
_COMMENT_STARTS = ("#", "//", "/*", "*", '"""', "'''")
MAX_FILE_BYTES = 200_000


@dataclass
class Task:
    path: str
    language: str
    before: str  # text up to the cursor (the hole's first line's indentation included)
    after: str  # text after the removed lines
    expected: str  # the first removed line, without indentation


def source_files(root: str, languages: set[str] | None) -> list[tuple[str, str]]:
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(directory, name)
            language = canonical_id("", path)
            if language is None or (languages and language not in languages):
                continue
            try:
                if 0 < os.path.getsize(path) <= MAX_FILE_BYTES:
                    found.append((path, language))
            except OSError:
                continue
    return found


def make_tasks(files: list[tuple[str, str]], count: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < count and files and attempts < count * 50:
        attempts += 1
        path, language = rng.choice(files)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except (OSError, UnicodeDecodeError):
            continue
        candidates = [
            i
            for i, line in enumerate(lines)
            if len(line.strip()) >= 6 and not line.strip().startswith(_COMMENT_STARTS) and i > 0
        ]
        if not candidates:
            continue
        first = rng.choice(candidates)
        removed = rng.randint(1, 4)
        line = lines[first]
        indent = line[: len(line) - len(line.lstrip())]
        before = "\n".join(lines[:first]) + "\n" + indent
        after = "\n" + "\n".join(lines[first + removed :])
        tasks.append(Task(path, language, before, after, line.strip()))
    return tasks


def edit_similarity(a: str, b: str) -> float:
    if not a and not b:
        return 1.0
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return 1.0 - previous[-1] / max(len(a), len(b))


def _neighbours(task: Task, files: list[tuple[str, str]], limit: int) -> list[str]:
    """Files an editor would likely have open: same directory and language."""
    directory = os.path.dirname(task.path)
    same = [p for p, lang in files if lang == task.language and p != task.path and os.path.dirname(p) == directory]
    return sorted(same)[:limit]


def tree_sitter_request(task: Task, root: str, files, budget: Budget, settings: Settings, neighbours: int,
                        repository_context: bool = True) -> pb.CompleteRequest:
    ws = Workspace([root], max_file_bytes=MAX_FILE_BYTES)
    for path in _neighbours(task, files, neighbours):
        try:
            with open(path, encoding="utf-8") as f:
                ws.open(path_to_uri(path), f.read(), language_id=task.language)
        except (OSError, UnicodeDecodeError):
            continue
    opened = ws.open(path_to_uri(task.path), task.before + task.after, language_id=task.language)
    offset = len(task.before.encode("utf-8", "surrogatepass"))
    request, _ = make_request(ws, ContextEngine(ws, repository_context=repository_context), opened, offset, budget, settings)
    return request


def plain_request(task: Task, root: str, budget: Budget, settings: Settings) -> pb.CompleteRequest:
    suffix_chars = int(budget.chars * SUFFIX_SHARE)
    prefix_chars = budget.chars - min(suffix_chars, len(task.after))
    prefix, suffix = task.before[-prefix_chars:] if prefix_chars > 0 else "", task.after[:suffix_chars]
    if settings.blank_line_from_line_start:  # the same cursor rendering as the bridge's
        prefix, suffix = from_line_start(prefix, suffix) or (prefix, suffix)
    return build_request(
        prefix=prefix,
        suffix=suffix,
        language_id=task.language,
        file_path=os.path.relpath(task.path, root).replace(os.sep, "/"),
        repo_name=os.path.basename(os.path.abspath(root)),
        latency_class="inline",
    )


def prefix_only_request(task: Task, root: str, budget: Budget, settings: Settings, *, empty_suffix: bool) -> pb.CompleteRequest:
    """The prefix window alone, as a raw client that knows nothing after the
    cursor sends it: without a suffix (the prompt format's plain
    continuation) or with an empty one (fill-in-the-middle at the end of the file)."""
    prefix, suffix = task.before[-budget.chars:], ""
    if settings.blank_line_from_line_start:
        prefix, suffix = from_line_start(prefix, suffix) or (prefix, suffix)
    return build_request(
        prefix=prefix,
        suffix=suffix if empty_suffix else None,
        language_id=task.language,
        file_path=os.path.relpath(task.path, root).replace(os.sep, "/"),
        repo_name=os.path.basename(os.path.abspath(root)),
        latency_class="inline",
    )


def _single_line(request: pb.CompleteRequest, max_tokens: int) -> pb.CompleteRequest:
    # Same generation settings in both conditions: one line, greedy. The
    # cursor sits on a blank line, so, as in the bridge, no server-side stop:
    # the Draft ends the stream after the first line that is not blank.
    request.max_tokens = max_tokens
    del request.stop[:]
    return request


def paired_difference(a: list[float], b: list[float], *, resamples: int = 2000, seed: int = 0) -> dict:
    """Mean of a - b over tasks, its 95% bootstrap interval (tasks resampled),
    and how many tasks each side wins: "clearly wins" means the interval
    excludes 0."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if not diffs:
        return {}
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return {
        "mean": statistics.fmean(diffs),
        "ci95": [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]],
        "wins": sum(d > 0 for d in diffs),
        "losses": sum(d < 0 for d in diffs),
        "ties": sum(d == 0 for d in diffs),
    }


def _prompt_chars(request: pb.CompleteRequest) -> int:
    return len(request.prefix) + len(request.suffix) + sum(len(f.path) + len(f.content) for f in request.context_files)


async def run(args: argparse.Namespace) -> dict:
    languages = set(args.languages.split(",")) if args.languages else None
    root = os.path.abspath(args.source_dir)
    files = source_files(root, languages)
    tasks = make_tasks(files, args.tasks, args.seed)
    if not tasks:
        raise SystemExit(f"no tasks: no usable source files under {root}")

    budget = Budget(args.budget_tokens or 1536, args.chars_per_token or 3.5)
    builders = {
        "tree-sitter": lambda task, b: tree_sitter_request(task, root, files, b, settings, args.open_neighbours),
        "plain window": lambda task, b: plain_request(task, root, b, settings),
    }
    if args.file_only:
        # diagnostic: the bridge's trimming, headers and imports, without repository context
        builders["tree-sitter, file only"] = lambda task, b: tree_sitter_request(
            task, root, files, b, settings, args.open_neighbours, repository_context=False)
    if args.prefix_only:
        # diagnostic: what a raw client that sends only the prefix gets, in both of the wire's forms
        builders["prefix only"] = lambda task, b: prefix_only_request(task, root, b, settings, empty_suffix=False)
        builders["prefix only, empty suffix"] = lambda task, b: prefix_only_request(task, root, b, settings, empty_suffix=True)
    backends: dict[str, Backend] = {}
    if not args.dry_run:
        # A server just started answers before its engine serves: every task would fail.
        if not await wait_address_serving(args.server, args.wait):
            raise SystemExit(f"the quickdraft server at {args.server} was not serving within --wait {args.wait:.0f} s")
        for name in builders:
            backends[name] = backend = Backend(BackendConfig(address=args.server, request_timeout_s=args.timeout))
            backend.start()
            for _ in range(int(args.timeout * 10)):
                if backend.state == UP:
                    break
                await asyncio.sleep(0.1)
            else:
                raise SystemExit(f"no quickdraft server answering at {args.server}")
            if args.budget_tokens:
                backend.budget = budget
            if args.chars_per_token:
                backend.ratio.announced = args.chars_per_token
        budget = next(iter(backends.values())).budget
    settings = Settings(blank_line_from_line_start=not args.blank_line_at_cursor)
    conditions = {name: [] for name in builders}
    prompt_chars = {name: [] for name in conditions}
    context_files = {name: [] for name in conditions}
    errors = {name: 0 for name in conditions}
    retries = {name: 0 for name in conditions}
    per_task = []
    for task in tasks:
        record = {"path": os.path.relpath(task.path, root), "expected": task.expected}
        for name, build in builders.items():
            backend = backends.get(name)
            if backend is None:  # dry run: the prompt only
                request = build(task, budget)
                prompt_chars[name].append(_prompt_chars(request))
                context_files[name].append(len(request.context_files))
                continue
            drafts: list[Draft] = []
            indent = task.before[task.before.rfind("\n") + 1 :]

            def sized_request(b: Budget, build=build, drafts=drafts, indent=indent):
                # every task's cursor is on a blank line: the setting decides the rendering
                drafts.append(Draft(Shape(False, indent, "", from_line_start=settings.blank_line_from_line_start)))
                return _single_line(build(task, b), args.max_tokens), drafts[-1].feed

            sized = await backend.complete_within_budget(sized_request, document=task.path, language=task.language)
            request = sized.request
            retries[name] += sized.rebuilt
            prompt_chars[name].append(_prompt_chars(request))
            context_files[name].append(len(request.context_files))
            if sized.outcome is not Outcome.ANSWERED:  # a failed request counts as a miss, and is reported
                errors[name] += 1
                record[f"{name} error"] = sized.outcome.value
            shown = drafts[-1].result()
            first = shown.text.strip() if shown is not None else ""
            conditions[name].append((first == task.expected, edit_similarity(first, task.expected)))
            record[name] = first
        per_task.append(record)
    for backend in backends.values():
        await backend.close()

    rows = []
    for name, results in conditions.items():
        row = {
            "condition": name,
            "tasks": len(tasks),
            "mean_prompt_chars": statistics.fmean(prompt_chars[name]),
            "mean_context_files": statistics.fmean(context_files[name]),
            "errors": errors[name],
            "rebuilt_smaller": retries[name],
        }
        if results:
            row["exact_match"] = sum(hit for hit, _ in results) / len(results)
            row["edit_similarity"] = statistics.fmean(sim for _, sim in results)
        rows.append(row)
    paired = {}
    if all(conditions.values()):
        sims = {name: [sim for _, sim in results] for name, results in conditions.items()}
        paired = {"edit_similarity_tree_sitter_minus_plain": paired_difference(sims["tree-sitter"], sims["plain window"], seed=args.seed)}
        if "tree-sitter, file only" in sims:
            paired["edit_similarity_file_only_minus_plain"] = paired_difference(sims["tree-sitter, file only"], sims["plain window"], seed=args.seed)
    report(
        f"FIM first-line quality, {len(tasks)} tasks from {root} (budget {budget.tokens} tokens)"
        + (" [dry run: prompts only]" if args.dry_run else f" against {args.server}")
        + ("; blank lines rendered at the cursor" if args.blank_line_at_cursor else ""),
        rows,
        [
            ("condition", "condition"),
            ("tasks", "tasks"),
            ("exact_match", "exact match"),
            ("edit_similarity", "edit similarity"),
            ("mean_prompt_chars", "prompt chars"),
            ("mean_context_files", "context files"),
            ("errors", "errors"),
            ("rebuilt_smaller", "rebuilt smaller"),
        ],
        args.json,
        {"server": args.server, "source_dir": root, "budget_tokens": budget.tokens,
         "blank_line_from_line_start": settings.blank_line_from_line_start, "paired": paired, "tasks": per_task},
    )
    for key, p in paired.items():
        print(f"\n{key.replace('_', ' ')}, paired by task: {p['mean']:+.4f} "
              f"(95% bootstrap interval {p['ci95'][0]:+.4f} .. {p['ci95'][1]:+.4f}); "
              f"better on {p['wins']} tasks, worse on {p['losses']}, equal on {p['ties']}")
    return {"rows": rows, "paired": paired}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default="127.0.0.1:50051", help="quickdraft gRPC server HOST:PORT")
    parser.add_argument("--source-dir", required=True, help="directory of real source files to cut tasks from")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--languages", help="comma-separated, e.g. python,go (default: all supported)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--budget-tokens", type=int, default=0, help="default: the server's prompt budget")
    parser.add_argument("--chars-per-token", type=float, default=0.0)
    parser.add_argument("--open-neighbours", type=int, default=4, help="same-directory files opened as editor tabs")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the server's engine to serve")
    parser.add_argument("--dry-run", action="store_true", help="build the prompts, ask no server")
    parser.add_argument("--file-only", action="store_true",
                        help="add a third condition: the bridge's prompt without repository context")
    parser.add_argument("--prefix-only", action="store_true",
                        help="add two conditions: the prefix window alone, sent without a suffix and with an empty one")
    parser.add_argument("--blank-line-at-cursor", action="store_true",
                        help="both conditions: send the prompt cut at the cursor, after the blank line's indentation "
                             "(the bridge's blankLineFromLineStart=false) instead of from the line's start")
    parser.add_argument("--json", default="fim_quality.json")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
