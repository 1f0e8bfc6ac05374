"""training/context_samples.py: retrieval-augmented FIM samples built with the bridge's own context engine."""

import random

import pytest

pytest.importorskip("tree_sitter_python")

from quickdraft.prompt_format import ENDOFTEXT, FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, REPO_NAME, render  # noqa: E402
from training import context_samples as cs  # noqa: E402

UTIL = '''"""Helpers."""


def compute_total(items, scale=1):
    """Sum of items, scaled."""
    return sum(items) * scale


class Basket:
    def __init__(self):
        self.items = []
'''

MAIN = '''from .util import compute_total


def run(xs):
    basket = []
    total = compute_total(xs, scale=2)
    print(total)
    return total
'''


@pytest.fixture
def package(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "util.py").write_text(UTIL)
    (pkg / "main.py").write_text(MAIN)
    return tmp_path


def _parts(sample: str) -> tuple[str, str, str, str]:
    head, rest = sample.split(FIM_PREFIX, 1)
    prefix, rest = rest.split(FIM_SUFFIX, 1)
    suffix, middle = rest.split(FIM_MIDDLE, 1)
    assert middle.endswith(ENDOFTEXT)
    return head, prefix, suffix, middle[: -len(ENDOFTEXT)]


def test_line_hole_matches_the_benchmark_cut():
    text = "a = 1\nif a:\n    b = 2\n    c = 3\nd = 4\n"
    hole = cs.line_hole(text, 2, 2)
    assert hole.doc == "a = 1\nif a:\n    \nd = 4\n"  # before + after, as make_tasks builds them
    assert hole.doc[: hole.cursor] == text[: hole.start]
    assert hole.doc[hole.cursor :] == text[hole.end :]


@pytest.mark.parametrize("seed", range(20))
def test_holes_cut_the_file(seed):
    rng = random.Random(seed)
    hole = cs.cut_hole(MAIN, rng)
    assert hole is not None
    assert hole.doc[: hole.cursor] == MAIN[: hole.start]
    assert hole.doc[hole.cursor :] == MAIN[hole.end :]


def test_some_holes_end_the_file_at_the_cursor():
    rng = random.Random(0)
    holes = [h for h in (cs.pick_hole(MAIN, rng) for _ in range(400)) if h is not None]
    eof = [h for h in holes if h.cursor == len(h.doc)]
    assert 0.08 < len(eof) / len(holes) < 0.25, len(eof)
    for h in holes:
        assert h.doc[: h.cursor] == MAIN[: h.start] and MAIN[h.start : h.end]
        assert h.doc[h.cursor :] in ("", MAIN[h.end :])


def test_definition_from_an_imported_file_and_the_blank_line_rewrite(package):
    root = str(package)
    main = str(package / "pkg" / "main.py")
    index = cs.restricted_index({str(package / "pkg" / "util.py")})
    first = MAIN.split("\n").index("    print(total)")
    hole = cs.line_hole(MAIN, first, 1)
    ctx, start, end = cs.bridge_prompt(root, main, hole, [], cs.BUDGET_TOKENS, 3.2, index)
    assert ctx.file_path == "pkg/main.py"
    paths = [p for p, _ in ctx.context_files]
    assert paths == ["pkg/util.py"]
    assert "def compute_total(items, scale=1):" in ctx.context_files[0][1]
    # the cursor's blank line is asked from its start: the model writes indentation and line break
    assert ctx.prefix.endswith("scale=2)\n")
    assert ctx.suffix == "    return total\n"
    assert MAIN[start:end] == "    print(total)\n"
    text = render(ctx)
    assert text.startswith(REPO_NAME) and text.index(FILE_SEP + "pkg/util.py\n") < text.index(FILE_SEP + "pkg/main.py\n")


def test_files_outside_the_allowed_set_are_not_read(package):
    index = cs.restricted_index(set())
    hole = cs.line_hole(MAIN, MAIN.split("\n").index("    print(total)"), 1)
    ctx, _, _ = cs.bridge_prompt(str(package), str(package / "pkg" / "main.py"), hole, [], cs.BUDGET_TOKENS, 3.2, index)
    assert ctx.context_files == ()


def test_build_renders_samples_whose_middle_fits_the_file(package):
    files = {"pkg": [(rel, (package / rel).read_text()) for rel in ("pkg/main.py", "pkg/util.py")]}
    texts, stats = cs.build(files, [str(package)], seconds=30, workers=1, seed=3)
    assert stats["samples"] == len(texts) == 2 * cs.HOLES_PER_FILE and stats["errors"] == 0
    for sample in texts:
        head, prefix, suffix, middle = _parts(sample)
        assert head.startswith(REPO_NAME + "pkg\n")
        original = MAIN if "pkg/main.py\n" + FIM_PREFIX in sample.replace(FILE_SEP, "") else UTIL
        if suffix:
            assert prefix + middle + suffix == original  # small files: nothing trimmed
        else:  # a hole at the end of what is written so far
            assert original.startswith(prefix + middle)
