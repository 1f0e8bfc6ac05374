"""The LSP benchmarks run end to end (tiny sizes; their numbers are not checked here)."""

from __future__ import annotations

import argparse
import json

import pytest

from quickdraft.bench import fim_quality, lsp_context, lsp_reparse


def test_context_and_reparse_benchmarks_write_reports(tmp_path):
    out = tmp_path / "context.json"
    lsp_context.main(["--lines", "400", "--samples", "60", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["measure"] for r in rows] == ["ContextEngine.build", "gate + shape + build"]
    assert all(r["n"] == 60 and r["p99_ms"] >= r["p50_ms"] > 0 for r in rows)

    out = tmp_path / "reparse.json"
    lsp_reparse.main(["--lines", "400", "--samples", "30", "--debounce-samples", "3", "--debounce-ms", "1", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["measure"] == "incremental reparse" and rows[0]["n"] == 30


def fim_args(fake_server, src, out, **changed) -> argparse.Namespace:
    """fim_quality's arguments against the fake server: one-line greedy tasks from ``src``, the report to ``out``."""
    args = dict(server=fake_server.address, source_dir=str(src), tasks=6, seed=1, languages=None, max_tokens=16,
                budget_tokens=0, chars_per_token=0.0, open_neighbours=4, timeout=10.0, wait=10.0, dry_run=False,
                json=str(out), file_only=False, blank_line_at_cursor=False, prefix_only=False)
    return argparse.Namespace(**(args | changed))


SHAPES = "import math\n\n\ndef area(r):\n    return math.pi * r * r\n\n\ndef double(x):\n    return x * 2\n"


async def test_fim_quality_against_the_fake_server(tmp_path, fake_server):
    src = tmp_path / "src"
    src.mkdir()
    (src / "shapes.py").write_text(SHAPES)
    (src / "main.py").write_text("from shapes import area\n\n\ndef report(r):\n    value = area(r)\n    return double(value)\n")
    fake_server.fake.deltas = ["return x * 2\nextra"]
    out = tmp_path / "fim.json"
    await fim_quality.run(fim_args(fake_server, src, out))
    report = json.loads(out.read_text())
    by_name = {r["condition"]: r for r in report["rows"]}
    assert set(by_name) == {"tree-sitter", "plain window"}
    assert all(r["tasks"] == 6 and r["errors"] == 0 and 0 <= r["edit_similarity"] <= 1 for r in by_name.values())
    assert len(fake_server.fake.requests) == 12
    assert all(list(r.stop) == [] and r.max_tokens == 16 for r in fake_server.fake.requests)
    assert {t["tree-sitter"] for t in report["tasks"]} == {"return x * 2"}  # the first line, cut client-side
    # both conditions ask from the start of the cursor's blank line, as the bridge does
    assert report["blank_line_from_line_start"] is True
    assert all(r.prefix.endswith("\n") and not r.suffix.startswith("\n") for r in fake_server.fake.requests)
    paired = report["paired"]["edit_similarity_tree_sitter_minus_plain"]
    assert paired["wins"] + paired["losses"] + paired["ties"] == 6
    assert report["budget_tokens"] == 1024  # from the server's limits


async def test_fim_quality_prefix_only_sends_the_prefix_without_and_with_an_empty_suffix(tmp_path, fake_server):
    src = tmp_path / "src"
    src.mkdir()
    (src / "shapes.py").write_text(SHAPES)
    fake_server.fake.deltas = ["return x * 2\n"]
    out = tmp_path / "fim.json"
    await fim_quality.run(fim_args(fake_server, src, out, tasks=3, prefix_only=True))
    report = json.loads(out.read_text())
    assert {r["condition"] for r in report["rows"]} == {"tree-sitter", "plain window", "prefix only", "prefix only, empty suffix"}
    requests = fake_server.fake.requests
    assert len(requests) == 12
    no_suffix = [r for r in requests if not r.HasField("suffix")]
    empty = [r for r in requests if r.HasField("suffix") and r.suffix == ""]
    assert len(no_suffix) == 3 and len(empty) >= 3  # a task at the file's end may leave a window's suffix empty too
    assert all(r.prefix.endswith("\n") and not r.context_files for r in no_suffix)


async def test_fim_quality_rebuilds_prompts_refused_as_too_long(tmp_path, fake_server):
    src = tmp_path / "src"
    src.mkdir()
    (src / "table.py").write_text("ROWS = [\n" + "".join(f"    ({i}, {i * 3}, {i * 7}),\n" for i in range(12)) + "]\n")
    fake = fake_server.fake
    # The server's tokenizer sees 1 byte per token where it announced 4: every first prompt is too long.
    fake.bytes_per_token, fake.max_prompt_tokens = 1.0, 60
    fake.info.limits.prompt_budget_tokens = 60
    out = tmp_path / "fim.json"
    await fim_quality.run(fim_args(fake_server, src, out, tasks=4, seed=3, file_only=True))
    rows = {r["condition"]: r for r in json.loads(out.read_text())["rows"]}
    assert all(r["errors"] == 0 for r in rows.values()), rows
    assert all(r["rebuilt_smaller"] >= 1 for r in rows.values()), rows
    assert fake.refused == sum(r["rebuilt_smaller"] for r in rows.values())
    assert set(rows) == {"tree-sitter", "plain window", "tree-sitter, file only"}


def test_edit_similarity():
    assert fim_quality.edit_similarity("abc", "abc") == 1.0
    assert fim_quality.edit_similarity("abc", "abd") == 1 - 1 / 3
    assert fim_quality.edit_similarity("", "xy") == 0.0
    assert fim_quality.edit_similarity("", "") == 1.0


def test_paired_difference_says_when_a_win_is_clear():
    from quickdraft.bench.fim_quality import paired_difference

    clear = paired_difference([0.5, 0.6, 0.7] * 20, [0.4, 0.5, 0.6] * 20)
    assert clear["mean"] == pytest.approx(0.1) and clear["ci95"][0] > 0 and clear["wins"] == 60
    mixed = paired_difference([0.9, 0.1] * 30, [0.1, 0.9] * 30)
    assert mixed["ci95"][0] < 0 < mixed["ci95"][1] and mixed["wins"] == mixed["losses"] == 30


async def test_fim_quality_waits_for_the_engine_and_gives_up_saying_so(tmp_path, fake_server):
    """A server whose engine still starts (health NOT_SERVING) gets no task: the run waits,
    then stops naming the server, instead of scoring every task as an error."""
    from grpc_health.v1 import health_pb2

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(y):\n    return y * 2\n")
    await fake_server.health.set("quickdraft.v1.Completion", health_pb2.HealthCheckResponse.NOT_SERVING)
    args = fim_args(fake_server, src, tmp_path / "fim.json", tasks=2, max_tokens=8, wait=1.0)
    with pytest.raises(SystemExit, match=f"{fake_server.address} was not serving within --wait 1"):
        await fim_quality.run(args)
    assert fake_server.fake.requests == []
