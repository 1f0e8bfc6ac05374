"""Editor-like completion traffic: FIM tasks and the typing that cancels them.

Tasks come from the held-out prompts (bench/data/heldout_prompts.jsonl: 256
prompts of code from distributions held out of the embedded model's training,
already cut at a cursor), from those distributions' installed packages
(``heldout-packages``: thousands of distinct tasks, for runs that must not
repeat a prompt), or from a directory of real source files, cut here:

- single-line: the cursor sits inside a line (after its indentation); the
  middle is the rest of that line. Requests stop at the newline and ask for
  few tokens, as ghost text for the current line does.
- multi-line: the cursor sits at the start of a line's code; the middle is
  2-8 whole lines (a block body, a statement sequence).

Each request is then planned: its latency class (inline, or chat for a share
of explicit invocations) and, for a share of inline requests, a cancellation
a few tens of milliseconds after it starts (the user kept typing). The plan
is a deterministic function of the seed, so two configs in a sweep see the
same sequence of requests.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

HELDOUT = Path(__file__).resolve().parent / "data" / "heldout_prompts.jsonl"
HELDOUT_PACKAGES_SOURCE = "heldout-packages"
# The distributions training/corpus.py keeps out of the embedded model's training (its
# HELD_OUT; a test keeps the two in step). Most are installed with quickdraft's dependencies.
HELDOUT_DISTRIBUTIONS = ("httpx", "httpcore", "anyio", "click", "jinja2", "rich", "attrs", "yarl", "starlette", "idna")

SOURCE_SUFFIXES = frozenset(
    ".py .pyi .js .jsx .ts .tsx .go .rs .java .kt .c .h .cc .cpp .hpp .cs .rb .php .swift .scala .sh .lua".split()
)
SKIP_DIRS = frozenset({".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox", ".mypy_cache", "target"})
MAX_FILE_BYTES = 1_000_000
SINGLE, MULTI = "single-line", "multi-line"


@dataclass(frozen=True)
class Task:
    """One completion request's content, independent of the protocol."""

    prefix: str
    suffix: str | None
    path: str
    kind: str  # SINGLE or MULTI
    max_tokens: int
    stop: tuple[str, ...] = ()
    expected: str | None = None  # the middle that was cut out, when known


@dataclass(frozen=True)
class Planned:
    """A task as sent: its class and whether (and when) typing cancels it."""

    index: int
    task: Task
    latency_class: str  # inline or chat
    cancel_after_s: float | None


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that shapes the traffic; recorded in every report."""

    source: str = "heldout"  # "heldout", "heldout-packages" or a directory
    tasks: int = 128
    seed: int = 0
    single_line_share: float = 0.5
    single_line_max_tokens: int = 24
    multi_line_max_tokens: int = 64
    prefix_chars: int = 1500
    suffix_chars: int = 500
    cancel_share: float = 0.3
    cancel_after_ms: tuple[float, float] = (20.0, 150.0)
    chat_share: float = 0.1

    def validate(self) -> None:
        for name in ("single_line_share", "cancel_share", "chat_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} = {v}: must be within 0..1")
        lo, hi = self.cancel_after_ms
        if not 0 <= lo <= hi:
            raise ValueError(f"cancel_after_ms = {self.cancel_after_ms}: need 0 <= low <= high")
        if self.tasks < 1 or self.single_line_max_tokens < 1 or self.multi_line_max_tokens < 1:
            raise ValueError("tasks and max tokens must be at least 1")


def _shape(rng: random.Random, spec: WorkloadSpec) -> tuple[str, int, tuple[str, ...]]:
    if rng.random() < spec.single_line_share:
        return SINGLE, spec.single_line_max_tokens, ("\n",)
    return MULTI, spec.multi_line_max_tokens, ()


def load_prompts(n: int, prefix_chars: int = 1500, suffix_chars: int = 500, path: Path = HELDOUT) -> list[dict]:
    """The first ``n`` held-out prompts as ``{"prefix", "suffix"}`` (suffix
    None: a plain continuation), the prefix's last and the suffix's first
    characters kept."""
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return [{"prefix": r["prefix"][-prefix_chars:], "suffix": None if r["suffix"] is None else r["suffix"][:suffix_chars]}
            for r in rows]


def heldout_tasks(spec: WorkloadSpec, path: Path = HELDOUT) -> list[Task]:
    """Tasks from the held-out prompts, in file order; each gets a shape by the seed.

    The held-out rows carry no middle (the cursor is where the file was cut),
    so the shape only sets the request's length and stop.
    """
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rng = random.Random(spec.seed)
    out = []
    for r in rows[: spec.tasks]:
        kind, max_tokens, stop = _shape(rng, spec)
        suffix = None if r.get("suffix") is None else r["suffix"][: spec.suffix_chars]
        out.append(Task(prefix=r["prefix"][-spec.prefix_chars :], suffix=suffix, path=r.get("path", ""), kind=kind, max_tokens=max_tokens, stop=stop))
    return out


def source_files(root: Path) -> list[Path]:
    """Source files under ``root`` (by suffix), skipping VCS, virtualenv and build folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.suffix in SOURCE_SUFFIXES:
                try:
                    if 0 < p.stat().st_size <= MAX_FILE_BYTES:
                        found.append(p)
                except OSError:
                    continue
    return found


def cut(text: str, rng: random.Random, kind: str, spec: WorkloadSpec, path: str = "") -> Task | None:
    """Cut one FIM task of ``kind`` out of ``text``; None when the file has no place for it."""
    lines = text.splitlines(keepends=True)
    code = [i for i, ln in enumerate(lines) if ln.strip() and i > 0]
    if not code:
        return None
    if kind == MULTI:
        # Start where at least two more code lines follow.
        code = [i for i in code if i + 2 <= len(lines)]
        if not code:
            return None
    i = rng.choice(code)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    line = lines[i]
    indent = len(line) - len(line.lstrip(" \t"))
    if kind == SINGLE:
        body = line.rstrip("\r\n")
        if len(body) - indent < 2:
            return None
        # Somewhere after the first character of code, leaving at least one character to complete.
        col = rng.randint(indent + 1, len(body) - 1)
        cursor, end = starts[i] + col, starts[i] + len(body)
        max_tokens, stop = spec.single_line_max_tokens, ("\n",)
    else:
        n = rng.randint(2, 8)
        cursor, end = starts[i] + indent, starts[min(len(lines), i + n)]
        max_tokens, stop = spec.multi_line_max_tokens, ()
    prefix, middle, suffix = text[:cursor], text[cursor:end], text[end:]
    return Task(
        prefix=prefix[-spec.prefix_chars :],
        suffix=suffix[: spec.suffix_chars],
        path=path,
        kind=kind,
        max_tokens=max_tokens,
        stop=stop,
        expected=middle,
    )


def heldout_package_files() -> dict[Path, str]:
    """The source files of the installed held-out distributions, each with its name in its
    distribution (``click/core.py``)."""
    out = {}
    for name in HELDOUT_DISTRIBUTIONS:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            path = Path(f.locate())
            if f.suffix in SOURCE_SUFFIXES and path.is_file() and 0 < path.stat().st_size <= MAX_FILE_BYTES:
                out[path] = str(f)
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def source_dir_tasks(spec: WorkloadSpec, root: Path) -> list[Task]:
    """``spec.tasks`` tasks cut from random places of random files under ``root``."""
    files = {f: str(f.relative_to(root)) for f in source_files(root)}
    if not files:
        raise ValueError(f"--source-dir {root}: no source files ({', '.join(sorted(SOURCE_SUFFIXES))})")
    tasks = cut_tasks(spec, files)
    if not tasks:
        raise ValueError(f"--source-dir {root}: no file had a line to cut a task from")
    return tasks


def cut_tasks(spec: WorkloadSpec, files: dict[Path, str]) -> list[Task]:
    """``spec.tasks`` distinct tasks cut from random places of random ``files`` (path -> its name in
    prompts). Distinct, so a run over them never meets a prompt in the prefix cache twice."""
    rng = random.Random(spec.seed)
    paths = list(files)
    texts: dict[Path, str] = {}
    out: list[Task] = []
    seen: set[tuple[str, str | None]] = set()
    attempts = 0
    while len(out) < spec.tasks and attempts < spec.tasks * 20:
        attempts += 1
        f = rng.choice(paths)
        if f not in texts:
            try:
                texts[f] = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                texts[f] = ""
        kind = SINGLE if rng.random() < spec.single_line_share else MULTI
        task = cut(texts[f], rng, kind, spec, path=files[f])
        if task is not None and (task.prefix, task.suffix) not in seen:
            seen.add((task.prefix, task.suffix))
            out.append(task)
    return out


def load_tasks(spec: WorkloadSpec) -> list[Task]:
    spec.validate()
    if spec.source == "heldout":
        return heldout_tasks(spec)
    if spec.source == HELDOUT_PACKAGES_SOURCE:
        files = heldout_package_files()
        if not files:
            raise ValueError(f"{HELDOUT_PACKAGES_SOURCE}: none of {', '.join(HELDOUT_DISTRIBUTIONS)} is installed here")
        return cut_tasks(spec, files)
    root = Path(spec.source)
    if not root.is_dir():
        raise ValueError(f"--source-dir {root}: not a directory")
    return source_dir_tasks(spec, root)


class Workload:
    """The planned request sequence: task i mod len(tasks), a class, maybe a cancellation."""

    def __init__(self, tasks: Sequence[Task], spec: WorkloadSpec):
        if not tasks:
            raise ValueError("a workload needs at least one task")
        self.tasks = list(tasks)
        self.spec = spec

    @classmethod
    def from_spec(cls, spec: WorkloadSpec) -> "Workload":
        return cls(load_tasks(spec), spec)

    def plan(self, n: int, offset: int = 0) -> list[Planned]:
        """Requests ``offset .. offset+n-1``. Request i's plan depends only on
        (seed, i), so every config and concurrency sees the same requests."""
        return [self.planned(i) for i in range(offset, offset + n)]

    def planned(self, i: int) -> Planned:
        spec = self.spec
        rng = random.Random(f"{spec.seed}:{i}")
        task = self.tasks[i % len(self.tasks)]
        latency_class = "chat" if rng.random() < spec.chat_share else "inline"
        cancel_after = None
        # Only inline requests are typed over; an explicit (chat) request is awaited.
        if latency_class == "inline" and rng.random() < spec.cancel_share:
            lo, hi = spec.cancel_after_ms
            cancel_after = rng.uniform(lo, hi) / 1000.0
        return Planned(index=i, task=task, latency_class=latency_class, cancel_after_s=cancel_after)

    def __iter__(self) -> Iterator[Planned]:
        i = 0
        while True:
            yield self.planned(i)
            i += 1

    def describe(self) -> dict:
        kinds = {k: sum(t.kind == k for t in self.tasks) for k in (SINGLE, MULTI)}
        fim = sum(t.suffix is not None for t in self.tasks)
        return {"tasks": len(self.tasks), "by_kind": kinds, "fim_tasks": fim, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.spec).items()}}
