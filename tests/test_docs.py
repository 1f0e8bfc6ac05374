"""The docs are current and hold together.

- docs/configuration.md is what scripts/config_reference.py generates;
- every relative link in the hand-written docs and in the results archive
  resolves, and every docs/... path a doc names exists;
- the results archive's index lists every file in docs/results/;
- RELIABILITY.md names, for each guarantee, tests that exist;
- README.md stays short (the issue 23 rule: no lab notebook) and its two
  commands are the Makefile's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.config_reference import TARGET, render

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
INDEX = RESULTS / "README.md"
# Written by hand and kept current (the archive's files keep the text they had).
DOCS = [ROOT / "README.md", ROOT / "RELIABILITY.md", ROOT / "training" / "README.md", INDEX,
        *sorted((ROOT / "docs").glob("*.md"))]
ARCHIVE_MD = sorted(p for p in RESULTS.rglob("*.md") if p != INDEX)
# Named in README before it exists: the lead writes it (issue 23).
PENDING = {"docs/architecture.md"}
README_MAX_LINES = 160

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w./-])(docs/[\w./{},*-]*[\w}*])")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def prose(path: Path) -> str:
    """The text without code: fenced and indented blocks, inline spans (a
    formula such as E[L](K) is not a link)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"^(    |\t).*$", "", text, flags=re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def link_targets(path: Path) -> list[str]:
    out = []
    for m in LINK.finditer(prose(path)):
        target = m.group(1).split("#", 1)[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            out.append(target)
    return out


def test_configuration_reference_is_current():
    assert TARGET.read_text() == render(), "docs/configuration.md is stale: run python scripts/config_reference.py"


@pytest.mark.parametrize("doc", DOCS + ARCHIVE_MD, ids=rel)
def test_relative_links_resolve(doc):
    missing = [t for t in link_targets(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{rel(doc)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_docs_paths_named_in_a_doc_exist(doc):
    named = {m.group(1) for m in DOC_PATH.finditer(doc.read_text())}
    missing = sorted(p for p in named - PENDING if not any(c in p for c in "{*<") and not (ROOT / p).exists())
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


def test_nothing_points_at_the_old_perf_folder():
    docs = DOCS + ARCHIVE_MD + [ROOT / "quickdraft" / "models" / "embedded" / "MODEL_CARD.md",
                                *sorted((ROOT / "editors").glob("*/README.md"))]
    stale = [rel(d) for d in docs if "docs/perf" in d.read_text()]
    assert not stale, f"docs/perf/ moved to docs/results/; still named in {stale}"
    assert not (ROOT / "docs" / "perf").exists()


def test_archive_index_lists_every_file():
    listed = {(RESULTS / t).resolve() for t in link_targets(INDEX)}
    files = {p.resolve() for p in RESULTS.rglob("*") if p.is_file() and p != INDEX}
    unlisted = sorted(p.relative_to(RESULTS).as_posix() for p in files - listed)
    assert not unlisted, f"docs/results/README.md has no line for {unlisted}"


def test_reliability_guarantees_name_tests_that_exist():
    text = (ROOT / "RELIABILITY.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith(("| guarantee", "|---"))]
    assert rows, "RELIABILITY.md has no guarantee tables"
    current = None
    checked = 0
    for line in text.splitlines():
        for m in TEST_REF.finditer(line):
            current = m.group(1) or current
            assert current, f"{m.group(0)} names no test file before it"
            source = (ROOT / current).read_text()
            assert re.search(rf"^(async )?def {m.group(2)}\(", source, re.M), f"RELIABILITY.md: {current}::{m.group(2)} does not exist"
            checked += 1
    assert checked >= 20
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        if len(cells) == 2:  # | guarantee | shown by |
            assert TEST_REF.search(cells[1]) or "`tests/" in cells[1], f"a guarantee without a test: {cells[0][:80]}"


def test_readme_is_short_and_its_two_commands_are_the_makefiles():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "README.md is for users: move run notes to docs/results/"
    makefile = (ROOT / "Makefile").read_text()
    for target in ("serve", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"
    assert "docs/results/" in readme
