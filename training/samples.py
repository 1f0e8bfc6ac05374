"""Training samples in the prompt formats the server renders.

Three kinds, mixed: fill-in-the-middle on one file (about half), repository
level (several files of one distribution joined with <|file_sep|>, the last
one sometimes FIM), and plain files. Middles are cut as an editor cursor
would see them: the rest of a line, whole lines, or a span of characters.
"""

from __future__ import annotations

import random
from typing import Iterator

from quickdraft.prompt_format import ENDOFTEXT, CodeContext, render

MAX_CHARS = 3600  # ~1k tokens: one packed training sequence


def window(text: str, rng: random.Random, max_chars: int = MAX_CHARS) -> str:
    """A run of whole lines of at most max_chars characters."""
    if len(text) <= max_chars:
        return text
    start = rng.randrange(0, len(text) - max_chars)
    start = text.rfind("\n", 0, start) + 1
    end = text.rfind("\n", start, start + max_chars)
    return text[start : end + 1 if end > start else start + max_chars]


def split_middle(text: str, rng: random.Random) -> tuple[str, str, str]:
    """(prefix, middle, suffix) with the middle cut the way editors ask for it."""
    lines = text.splitlines(keepends=True)
    if len(lines) < 3:
        a = rng.randrange(0, len(text) + 1)
        b = rng.randrange(a, min(len(text), a + 200) + 1)
        return text[:a], text[a:b], text[b:]
    kind = rng.random()
    i = rng.randrange(0, len(lines))
    line_start = sum(len(x) for x in lines[:i])
    content = lines[i].rstrip("\r\n")
    if kind < 0.45 and content.strip():
        # Cursor inside a line, at or after its indentation: the middle is the rest of it, sometimes more lines.
        indent = len(content) - len(content.lstrip())
        col = rng.randrange(indent, len(content) + 1)
        extra = rng.choice([0, 0, 0, 1, 2, 4]) if rng.random() < 0.35 else 0
        a = line_start + col
        b = line_start + len(content) if extra == 0 else sum(len(x) for x in lines[: min(len(lines), i + 1 + extra)])
    elif kind < 0.85:
        # Whole lines, as when the cursor sits at the start of an empty line (a blank line asked
        # as "inside a line" lands here too: the rest of a blank line is no answer).
        n = rng.choice([1, 1, 2, 3, 4, 6, 8])
        a = line_start
        b = sum(len(x) for x in lines[: min(len(lines), i + n)])
    else:
        a = rng.randrange(0, len(text))
        b = min(len(text), a + rng.randrange(1, 200))
    return text[:a], text[a:b], text[b:]


def fim_sample(path: str, text: str, rng: random.Random, context: list[tuple[str, str]] = (), repo: str = "") -> str:
    prefix, middle, suffix = split_middle(text, rng)
    prompt = render(CodeContext(prefix=prefix, suffix=suffix, file_path=path, repo_name=repo, context_files=context))
    return prompt + middle + ENDOFTEXT


def plain_sample(path: str, text: str, context: list[tuple[str, str]] = (), repo: str = "", file_end: bool = True) -> str:
    """A prefix-only sample; the end-of-text token only where the file really ends: after a
    chunk or window that stops mid-file it would teach the model to stop at any line break."""
    prompt = render(CodeContext(prefix=text, file_path=path, repo_name=repo, context_files=context))
    return prompt + ENDOFTEXT if file_end else prompt


def chunks(text: str, max_chars: int = MAX_CHARS) -> Iterator[str]:
    """Consecutive runs of whole lines covering the text, each at most max_chars."""
    start = 0
    while start < len(text):
        end = text.rfind("\n", start, start + max_chars) + 1 if start + max_chars < len(text) else len(text)
        if end <= start:
            end = min(len(text), start + max_chars)
        yield text[start:end]
        start = end


def samples(dist_files: dict[str, list[tuple[str, str]]], seed: int) -> Iterator[str]:
    """Every file once (long files in consecutive chunks), each chunk as a FIM,
    repository-level or plain sample."""
    rng = random.Random(seed)
    for dist, files in dist_files.items():
        order = list(range(len(files)))
        rng.shuffle(order)
        for idx in order:
            path, whole = files[idx]
            pieces = list(chunks(whole))
            for n, text in enumerate(pieces):
                yield _sample(dist, files, idx, path, text, rng, file_end=n == len(pieces) - 1)


def _sample(dist: str, files: list[tuple[str, str]], idx: int, path: str, text: str, rng: random.Random,
            file_end: bool = True) -> str:
    r = rng.random()
    if r < 0.25 and len(files) > 1:
        # Repository level: up to three other files of the distribution, shortened.
        others = [files[j] for j in rng.sample(range(len(files)), min(3, len(files) - 1)) if j != idx][:3]
        budget = MAX_CHARS // 2
        context = []
        for opath, otext in others:
            piece = window(otext, rng, max(200, budget // max(1, len(others))))
            context.append((opath, piece))
        own = window(text, rng, MAX_CHARS // 2)
        own_end = file_end and text.endswith(own)
        return (fim_sample(path, own, rng, context, dist) if rng.random() < 0.5
                else plain_sample(path, own, context, dist, file_end=own_end))
    elif r < 0.75:
        return fim_sample(path, text, rng)
    else:
        return plain_sample(path, text, file_end=file_end)


def generation_prompt(text: str, rng: random.Random, path: str = "", fim: bool = True) -> tuple[str, str]:
    """(prefix, suffix) of a completion prompt cut from a file; suffix '' for plain."""
    text = window(text, rng)
    prefix, _middle, suffix = split_middle(text, rng)
    return (prefix, suffix) if fim else (prefix, "")
