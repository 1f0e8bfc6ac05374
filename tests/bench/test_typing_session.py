"""quickdraft bench typing: the edit sequences and the analysis, on synthetic records."""

from __future__ import annotations

import math

import pytest

from quickdraft.bench.typing_session import analyze, function_spans, markdown, next_chunk, schedule, summarize

SOURCE = '''
def short(x):
    return x


def documented(a, b):
    """Add them."""
    total = a + b
    if total > 10:
        total = 10
    return total


class Box:
    def size(self):
        if self.items:
            return len(self.items)
        return 0
'''


def test_function_spans_start_after_the_docstring_and_end_with_the_function():
    spans = [SOURCE[a:b] for a, b in function_spans(SOURCE, 20, 400)]
    assert spans == [
        "total = a + b\n    if total > 10:\n        total = 10\n    return total",
        "if self.items:\n            return len(self.items)\n        return 0",
    ]  # short() is one line: not worth typing
    assert function_spans("def broken(:\n", 0, 100) == []


def test_a_keystroke_is_a_character_or_enter_with_the_next_indentation():
    span = "a = 1\n    if a:\n        b"
    chunks, i = [], 0
    while i < len(span):
        chunks.append(next_chunk(span, i))
        i += len(chunks[-1])
    assert chunks[:6] == ["a", " ", "=", " ", "1", "\n    "]
    assert "\n        " in chunks and "".join(chunks) == span


def test_schedule_interleaves_variants_reversing_every_other_round():
    assert schedule(["base", "stable", "prefetch"], 2) == [
        (1, "base"), (1, "stable"), (1, "prefetch"), (2, "prefetch"), (2, "stable"), (2, "base")]


def _records():
    requests, suggestions, blocks = [], [], []
    for variant, latency, hits, shown, accepted in (("base", 200.0, 400, 4, 1), ("stable", 150.0, 600, 6, 3)):
        for r in (1, 2):
            for k in range(10):
                requests.append({"variant": variant, "round": r, "trigger": "type" if k else "open", "superseded": k % 3 == 0,
                                 "outcome": "superseded" if k % 3 == 0 else "new", "latency_ms": latency})
            requests.append({"variant": variant, "round": r, "trigger": "accept", "superseded": False, "outcome": "empty",
                             "latency_ms": latency / 2})
            for k in range(shown):
                suggestions.append({"variant": variant, "round": r, "trigger": "accept" if k == 0 else "type",
                                    "latency_ms": latency + k, "accepted": k < accepted, "chars": 10})
            blocks.append({"variant": variant, "round": r, "typing_s": 30.0, "bridge": {"model_requests": 5},
                           "server": {"prefix_cache_queried_tokens": 1000, "prefix_cache_hit_tokens": hits,
                                      "wasted_tokens_cancelled": 20, "wasted_tokens_never_shown": 4}})
    return requests, suggestions, blocks


def test_summary_figures():
    requests, suggestions, blocks = _records()
    pick = lambda rows: [x for x in rows if x["variant"] == "base"]  # noqa: E731
    s = summarize(pick(requests), pick(suggestions), pick(blocks))
    assert s["requests"] == 20  # "open" requests are not keystrokes
    assert s["superseded_share"] == pytest.approx(6 / 20)
    assert s["shown"] == 8 and s["shown_per_min"] == pytest.approx(8.0)  # 8 over one minute of typing
    assert s["accept_share"] == pytest.approx(2 / 8)
    assert s["shown_p50_ms"] == pytest.approx(202.0) and s["after_accept_n"] == 2 and s["after_accept_p50_ms"] == 100.0
    assert s["after_accept_shown"] == 2
    assert s["wasted_per_shown"] == pytest.approx(48 / 8)
    assert s["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert s["bridge"] == {"model_requests": 10}
    assert s["computed_per_model_request"] == pytest.approx((2000 - 800) / 10)
    empty = summarize([], [], [])
    assert empty["shown"] == 0 and math.isnan(empty["accept_share"]) and math.isnan(empty["shown_p50_ms"])


def test_ratios_to_base_pooled_and_per_round():
    a = analyze(*_records())
    r = a["ratios_to_base"]["stable"]
    assert r["prefix_cache_hit_rate"]["pooled"] == pytest.approx(1.5)
    assert r["prefix_cache_hit_rate"]["rounds"] == [pytest.approx(1.5)] * 2
    assert r["shown_p50_ms"]["pooled"] == pytest.approx(153.0 / 202.0)
    assert r["accept_share"]["pooled"] == pytest.approx((3 / 6) / (1 / 4))
    assert r["wasted_per_shown"]["pooled"] == pytest.approx((24 / 6) / (24 / 4))
    md = markdown({"analysis": a, "rounds": 2, "machine": "test"})
    assert "| prefix-cache hit rate | 40.0% | 60.0% |" in md
    assert "| prefix_cache_hit_rate | 1.50 [1.50, 1.50] |" in md


# -- the replay, through a real bridge, against a fake server ---------------------------


@pytest.mark.parametrize("variant", ["stable", "prefetch"])
async def test_a_block_types_the_function_and_accepts_what_matches(tmp_path, variant):
    from quickdraft.bench.typing_session import Target, Typist, run_block
    from tests.lsp.conftest import FakeCompletion, FakeServer

    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    source = "def add(a, b):\n    total = a\n    return a + b\n    x = 1\n"
    (package / "mod.py").write_text(source)
    start = source.index("total")
    target = Target(str(package), "pkg/mod.py", start, len(source) - 1)
    fake = FakeServer(FakeCompletion())  # answers "return a + b" to everything
    await fake.start()
    requests, suggestions = [], []
    try:
        fast = Typist(keys_per_s=200.0, line_pause_s=1.0, think_share=0.0, typo_share=0.0, redo_share=0.0, reaction_s=0.01)
        block = await run_block(fake.address, variant, 1, [target], fast, 0, tmp_path / "work", 0.0, requests, suggestions)
    finally:
        await fake.stop()
    # Typed "total = a", Enter; then "return a + b" was shown and accepted whole;
    # then Enter, where "return a + b" (the fake's answer) was shown again and typed over with "x = 1".
    accepted = [s for s in suggestions if s["accepted"]]
    assert [(s["trigger"], s["matched_chars"]) for s in accepted] == [("type", 12)]
    enter = [r for r in requests if r["trigger"] == "accept_enter"]
    assert len(enter) == 1 and enter[0]["outcome"] == "new"
    stats = block["bridge"]
    assert 0 < stats["requests"] <= len(requests)  # a request cancelled before its handler ran is not counted
    on = variant == "prefetch"
    # The prefetch asked for the next line before Enter; the editor's request after Enter took it.
    assert (stats.get("prefetch_started", 0), stats.get("prefetch_next_line", 0), stats.get("prefetch_used", 0)) == ((1, 1, 1) if on else (0, 0, 0))
    assert len(fake.fake.requests) == stats["model_requests"]
    summary = summarize(requests, suggestions, [block])
    assert summary["next_line_n"] == 1 and summary["next_line_shown"] == 1


def test_the_prefix_cache_model_hits_whole_blocks_less_the_draft_heads():
    from quickdraft.bench.typing_session import PrefixCacheModel

    cache = PrefixCacheModel(block_size=4, eagle=False)
    assert cache.lookup(list(range(10))) == 0  # cold
    assert cache.lookup(list(range(10))) == 8  # two full blocks; the third is partial
    assert cache.lookup(list(range(8))) == 4  # at most the length less one token: the last block is computed again
    assert cache.lookup([0, 1, 2, 3, 9, 9, 9, 9, 9]) == 4  # the first block only: the second differs
    eagle = PrefixCacheModel(block_size=4, eagle=True)
    eagle.lookup(list(range(13)))
    assert eagle.lookup(list(range(13))) == 8  # three blocks match, the last is dropped


def test_the_oracle_answers_what_the_typist_types_next():
    from types import SimpleNamespace

    from quickdraft.bench.typing_oracle import Oracle
    from quickdraft.v1 import completion_pb2 as pb

    before = "def f(a):\n    \n"
    span = "x = a\n    return x\n    y = 2"
    typed = "def f(a):\n    x = a\n    "
    session = SimpleNamespace(before=before, start=14, span=span, i=10, typo=False)
    right, wrong = Oracle(1.0, sessions={"m.py": session}), Oracle(0.0, sessions={"m.py": session})
    one_line = pb.CompleteRequest(file_path="m.py", prefix=typed, stop=["\n"], request_id="r1")
    assert right.answer(one_line) == "return x"
    # A blank line asked from its start (the bridge's rewrite) gets its indentation first.
    from_start = pb.CompleteRequest(file_path="m.py", prefix="def f(a):\n    x = a\n", stop=["\n"], request_id="r2")
    assert right.answer(from_start) == "    return x"
    block = pb.CompleteRequest(file_path="m.py", prefix=typed, request_id="r3")
    assert right.answer(block) == "return x\n    y = 2"
    assert wrong.answer(one_line) != "return x" and "wrong" in wrong.answer(one_line)
    # The next-line prefetch: asked at the end of "    return x" before Enter, for the line after it.
    session.i = len("x = a\n    return x")
    next_line = pb.CompleteRequest(file_path="m.py", prefix="def f(a):\n    x = a\n    return x\n", request_id="r4")
    assert right.answer(next_line) == "    y = 2"
    assert right.answer(pb.CompleteRequest(file_path="m.py", prefix="unrelated", request_id="r5")) == "pass"


def test_asked_at_finds_where_the_prompt_ends():
    from quickdraft.bench.typing_oracle import asked_at

    final = "a = 1\n    b = 2\nc"
    assert asked_at(final, 11, "    b") == 11  # the cursor
    assert asked_at(final, 11, "a = 1\n") == 6  # its line's start
    assert asked_at(final, 15, "b = 2\n") == 16  # after the line break that follows the cursor
    assert asked_at(final, 11, "zzz") is None


def test_prefetch_on_off_ratios_compare_prefetch_with_stable():
    requests, suggestions, blocks = _records()
    rename = {"base": "stable", "stable": "prefetch"}
    for rows in (requests, suggestions, blocks):
        for row in rows:
            row["variant"] = rename[row["variant"]]
    a = analyze(requests, suggestions, blocks)
    assert a["ratios_to_base"] == {}  # no base variant ran
    r = a["prefetch_on_off"]
    assert r["shown_p50_ms"]["pooled"] == pytest.approx(153.0 / 202.0)
    assert r["prefix_cache_hit_rate"]["rounds"] == [pytest.approx(1.5)] * 2
    assert r["wasted_per_shown"]["pooled"] == pytest.approx((24 / 6) / (24 / 4))
    md = markdown({"analysis": a, "rounds": 2, "machine": "test"})
    assert "Prefetch on / off" in md and "| prefix_cache_hit_rate | 1.50 [1.50, 1.50] |" in md


async def test_a_whole_run_against_a_server_without_a_stand_in(tmp_path):
    import argparse

    from quickdraft.bench.typing_session import Target, Typist, _run_all
    from tests.lsp.conftest import FakeCompletion, FakeServer

    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    source = "def add(a, b):\n    total = a\n    return a + b\n"
    (package / "mod.py").write_text(source)
    target = Target(str(package), "pkg/mod.py", source.index("total"), len(source) - 1)
    fake = FakeServer(FakeCompletion())
    await fake.start()
    args = argparse.Namespace(oracle=None, oracle_engine=False, variants="stable,prefetch", rounds=1, warmup_chars=0, seed=0)
    fast = Typist(keys_per_s=200.0, line_pause_s=0.2, think_share=0.0, typo_share=0.0, redo_share=0.0, reaction_s=0.01)
    try:
        records = await _run_all(args, fake.address, [[target]], fast, tmp_path / "work", 0.0)
    finally:
        await fake.stop()
    assert [(b["round"], b["variant"]) for b in records["blocks"]] == [(1, "stable"), (1, "prefetch")]
    assert records["suggestions"] and all(s["variant"] in ("stable", "prefetch") for s in records["suggestions"])


@pytest.mark.parametrize(("argv", "said"), [
    (["--oracle-engine"], "--oracle-engine needs --oracle P"),
    (["--oracle", "1.5"], "--oracle is a share between 0 and 1"),
])
def test_bad_stand_in_options_are_refused_with_a_reason(argv, said, capsys, tmp_path):
    from quickdraft.bench.typing_session import main

    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert said in capsys.readouterr().err
