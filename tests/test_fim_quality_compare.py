"""bench/fim_quality_compare.py: models compared on the same fim_quality tasks."""

from __future__ import annotations

import json

import pytest

from quickdraft.bench import fim_quality_compare as fc

TASKS = [("a.py", "return x"), ("b.py", "y = 2"), ("c.py", "pass"), ("d.py", "import os")]


def _run(answers: dict[str, list[str]]) -> dict:
    return {"tasks": [{"path": p, "expected": e, **{cond: a[i] for cond, a in answers.items()}}
                      for i, (p, e) in enumerate(TASKS)]}


def test_paired_differences_against_the_first_model(tmp_path):
    ref = _run({"tree-sitter": ["return x", "", "pas", "import sys"], "plain window": ["", "", "", ""]})
    other = _run({"tree-sitter": ["return x", "y = 2", "pass", "import os"], "plain window": ["return x", "", "", ""]})
    files = []
    for name, run in (("ref", ref), ("other", other)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(run))
    out = fc.main([f"ref={files[0]}", f"other={files[1]}", "--json", str(tmp_path / "cmp.json")])
    ts = out["conditions"]["tree-sitter"]
    assert ts["models"]["ref"]["exact_match"] == 0.25 and ts["models"]["other"]["exact_match"] == 1.0
    assert ts["models"]["ref"]["empty"] == 1 and ts["models"]["other"]["empty"] == 0
    diff = ts["paired"]["other - ref"]
    assert diff["exact_match"]["mean"] == pytest.approx(0.75)
    assert diff["edit_similarity"]["wins"] == 3 and diff["edit_similarity"]["losses"] == 0
    assert diff["edit_similarity"]["ci95"][0] > 0
    # the bridge's context against the plain window, per model
    assert out["tree_sitter_minus_plain"]["other"]["mean"] == pytest.approx(0.75)
    assert json.loads((tmp_path / "cmp.json").read_text())["tasks"] == 4


def test_runs_of_different_tasks_are_refused():
    a = _run({"tree-sitter": ["", "", "", ""], "plain window": ["", "", "", ""]})
    b = json.loads(json.dumps(a))
    b["tasks"][2]["expected"] = "something else"
    with pytest.raises(SystemExit, match="not the same tasks"):
        fc.compare({"a": a, "b": b})
