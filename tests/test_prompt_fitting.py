"""Prompt fitting (server/prompt_fitting.py): a prompt over the budget is cut
to fit, keeping the text nearest the cursor, unless strict_prompt is set.

Exact kept text on a fake tokenizer of a known number of characters per
token; exact token counts and a kept text that tokenizes as reported on the
embedded model's real tokenizer; the serving path through CompletionService.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from quickdraft.prompt_format import SPECIAL_TOKENS
from quickdraft.server.config import ConfigError, load_config
from quickdraft.server.errors import RequestError
from quickdraft.server.preparation import prepare
from quickdraft.server.prompt_tokens import tokenize
from quickdraft.server.speculative import SpecConfig
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import PROMPT_LIMIT_KEY, PROMPT_TOKENS_KEY
from tests.test_service import PROMPT_TOKENS, FakeEngine, make_service

PREFIX = "".join(f"line {i:02}\n" for i in range(20)) + "x = "  # 164 characters, 8 per line
SUFFIX = "".join(f"tail {i:02}\n" for i in range(20))  # 160 characters


class CharTokens:
    """A tokenizer of ``per`` characters per token (the last one may be
    shorter), control tokens one each; it records the length of every text
    it was handed."""

    control_tokens = SPECIAL_TOKENS

    def __init__(self, per: int = 1):
        self.per = per
        self.seen: list[int] = []

    def text(self, s: str) -> list[int]:
        self.seen.append(len(s))
        return [ord(c) for c in s[:: self.per]]

    def raw(self, s: str) -> list[int]:
        return self.text(s)

    def special(self, token: str) -> int:
        return 1_000_000 + SPECIAL_TOKENS.index(token)


def config(max_prompt_tokens: int = 60, max_prompt_chars: int = 1000, prefix_only: str = "plain"):
    cfg = load_config(env={})
    cfg.limits.max_prompt_tokens = max_prompt_tokens
    cfg.limits.max_prompt_chars = max_prompt_chars
    cfg.limits.prefix_only = prefix_only
    return cfg


def kept(req: pb.CompleteRequest, fit: pb.PromptFit) -> pb.CompleteRequest:
    """The request as the report says it was cut."""
    out = pb.CompleteRequest()
    out.CopyFrom(req)
    out.prefix = req.prefix[fit.prefix_chars_cut :]
    if req.HasField("suffix"):
        out.suffix = req.suffix[: len(req.suffix) - fit.suffix_chars_cut]
    del out.context_files[: fit.context_files_dropped]
    return out


# --- exact kept text on the fake tokenizer ----------------------------------------------------


def test_an_over_budget_prefix_keeps_its_end_from_a_line_start():
    p = prepare(pb.CompleteRequest(prefix=PREFIX), config(58), CharTokens())
    # 58 characters would start inside "line 13"; the cut moves to the next line start.
    assert "".join(map(chr, p.prompt_token_ids)) == "".join(f"line {i:02}\n" for i in range(14, 20)) + "x = "
    fit = p.prompt_fit
    assert fit.truncated and fit.prefix_chars_cut == 112 and fit.prompt_tokens_cut == 112
    assert fit.suffix_chars_cut == 0 and fit.context_files_dropped == 0


def test_the_suffix_keeps_its_start_to_a_line_end_and_the_prefix_the_rest():
    p = prepare(pb.CompleteRequest(prefix=PREFIX, suffix=SUFFIX), config(60), CharTokens())
    fim_prefix, fim_suffix, fim_middle = (CharTokens().special(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    ids = p.prompt_token_ids
    assert ids[0] == fim_prefix and ids[-1] == fim_middle
    cut = ids.index(fim_suffix)
    # 57 tokens besides the 3 control tokens: the suffix a quarter (14), cut to
    # its whole first line (8); the prefix the other 49, from a line start.
    assert "".join(map(chr, ids[cut + 1 : -1])) == "tail 00\n"
    assert "".join(map(chr, ids[1:cut])) == "".join(f"line {i:02}\n" for i in range(15, 20)) + "x = "
    assert p.prompt_fit.suffix_chars_cut == 152 and p.prompt_fit.prefix_chars_cut == 120
    assert len(ids) <= 60


def test_context_files_are_dropped_whole_from_the_least_relevant():
    files = [pb.ContextFile(path=f"{c}.py", content=c * 4) for c in "abc"]  # 11 tokens each with <|file_sep|>
    req = pb.CompleteRequest(prefix=PREFIX, context_files=files)
    p = prepare(req, config(60), CharTokens())
    text = "".join(chr(i) if i < 1_000_000 else "|" for i in p.prompt_token_ids)
    # Context gets at most 30% (16 tokens): the last file (most relevant) stays.
    assert text == "|\n|c.py\ncccc\n|\n" + "".join(f"line {i:02}\n" for i in range(15, 20)) + "x = "
    assert p.prompt_fit.context_files_dropped == 2 and len(p.prompt_token_ids) <= 60


def test_tokens_are_counted_exactly_not_estimated():
    """Three characters per token: the cut is measured, and the prompt fills the limit."""
    prefix = "".join(f"value_{i:03} = {i}\n" for i in range(300))
    p = prepare(pb.CompleteRequest(prefix=prefix), config(100), CharTokens(per=3))
    assert 90 <= p.prompt_tokens <= 100
    assert tokenize(CharTokens(per=3), kept(pb.CompleteRequest(prefix=prefix), p.prompt_fit), "qwen-fim") == p.prompt_token_ids


def test_a_cursor_line_longer_than_the_budget_is_cut_between_words():
    prefix = "first line\n" + "word " * 30
    p = prepare(pb.CompleteRequest(prefix=prefix), config(58), CharTokens())
    assert "".join(map(chr, p.prompt_token_ids)) == " " + "word " * 11


def test_a_prompt_over_max_prompt_chars_is_cut_before_the_tokenizer_sees_it():
    tokens = CharTokens(per=4)
    files = [pb.ContextFile(path=f"f{i}.py", content="z = 0\n" * 500) for i in range(3)]
    req = pb.CompleteRequest(prefix=PREFIX * 60, suffix=SUFFIX * 60, context_files=files)
    p = prepare(req, config(max_prompt_tokens=100, max_prompt_chars=400), tokens)
    assert max(tokens.seen) <= 400, "the tokenizer was handed text over limits.max_prompt_chars"
    assert p.prompt_tokens <= 100
    fit = p.prompt_fit
    assert fit.truncated and fit.context_files_dropped == 3 and fit.prefix_chars_cut > 9000 and fit.suffix_chars_cut > 9000
    assert tokenize(CharTokens(per=4), kept(req, fit), "qwen-fim") == p.prompt_token_ids


def test_a_raw_prompt_without_control_tokens_is_cut_like_a_prefix():
    p = prepare(pb.CompleteRequest(prefix=PREFIX, raw_prompt=True), config(58), CharTokens())
    assert "".join(map(chr, p.prompt_token_ids)) == "".join(f"line {i:02}\n" for i in range(14, 20)) + "x = "
    assert p.prompt_fit.prefix_chars_cut == 112


@pytest.mark.parametrize("chars_limit, limit_named", [(1000, "limits.max_prompt_tokens"), (100, "limits.max_prompt_chars")])
def test_a_raw_prompt_with_control_tokens_is_refused_not_cut(chars_limit, limit_named):
    tokens = CharTokens()
    req = pb.CompleteRequest(prefix="<|im_start|>user\n" + PREFIX + "<|im_end|>\n<|im_start|>assistant\n", raw_prompt=True)
    with pytest.raises(RequestError) as err:
        prepare(req, config(60, chars_limit), tokens)
    assert err.value.code == "INVALID_ARGUMENT" and err.value.field == "prefix"
    assert limit_named in err.value.message and "control tokens" in err.value.message
    if chars_limit < len(req.prefix):
        assert tokens.seen == [], "refused by its size before any tokenizer ran"


def test_strict_prompt_over_max_prompt_tokens_is_refused_naming_the_limit():
    with pytest.raises(RequestError) as err:
        prepare(pb.CompleteRequest(prefix=PREFIX, strict_prompt=True), config(60), CharTokens())
    e = err.value
    assert e.code == "INVALID_ARGUMENT" and e.field == "prefix"
    assert "limits.max_prompt_tokens = 60" in e.message and "strict_prompt" in e.message
    assert e.metadata == {PROMPT_TOKENS_KEY: "164", PROMPT_LIMIT_KEY: "60"}


def test_strict_prompt_over_max_prompt_chars_is_refused_before_any_tokenizer_runs():
    tokens = CharTokens()
    with pytest.raises(RequestError) as err:
        prepare(pb.CompleteRequest(prefix=PREFIX, strict_prompt=True), config(60, 100), tokens)
    assert "limits.max_prompt_chars = 100" in err.value.message and "strict_prompt" in err.value.message
    assert tokens.seen == []


def test_a_prompt_within_the_budget_is_not_touched():
    req = pb.CompleteRequest(prefix=PREFIX, suffix=SUFFIX)
    p = prepare(req, config(400), CharTokens())
    assert not p.prompt_fit.truncated and p.prompt_fit == pb.PromptFit()
    assert p.prompt_token_ids == tokenize(CharTokens(), req, "qwen-fim")


def test_file_path_alone_over_the_budget_is_refused_naming_it():
    req = pb.CompleteRequest(prefix="x", file_path="p" * 100, repo_name="r", suffix="")
    with pytest.raises(RequestError) as err:
        prepare(req, config(60), CharTokens())
    assert "file_path" in err.value.message and "limits.max_prompt_tokens" in err.value.message


# --- the real tokenizer -------------------------------------------------------------------------


LINES = st.lists(st.text(st.characters(categories=["L", "N", "P", "S", "Zs"]), max_size=60), min_size=1, max_size=120).map(
    lambda lines: "".join(line + "\n" for line in lines))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prefix=LINES, suffix=st.one_of(st.none(), LINES), n_files=st.integers(0, 4), file_lines=LINES,
       limit=st.integers(40, 400), strict=st.booleans())
def test_real_tokenizer_fits_exactly_and_reports_what_it_cut(prefix, suffix, n_files, file_lines, limit, strict):
    """Within max_prompt_tokens exactly; the kept text is the end of the
    prefix, the start of the suffix and the last context files, as reported
    (the reported request tokenizes to the very ids sent)."""
    req = pb.CompleteRequest(prefix=prefix, context_files=[pb.ContextFile(path=f"m{i}.py", content=file_lines) for i in range(n_files)],
                             strict_prompt=strict)
    if suffix is not None:
        req.suffix = suffix
    cfg = config(limit, limit * 8)
    full = tokenize(PROMPT_TOKENS, req, "qwen-fim")
    chars = len(req.prefix) + len(req.suffix) + sum(len(f.content) for f in req.context_files)
    over = len(full) > limit or chars > cfg.max_prompt_chars()
    if strict and over:
        with pytest.raises(RequestError) as err:
            prepare(req, cfg, PROMPT_TOKENS)
        assert "max_prompt" in err.value.message and "strict_prompt" in err.value.message
        return
    p = prepare(req, cfg, PROMPT_TOKENS)
    event("cut" if p.prompt_fit.truncated else "whole")
    assert 1 <= p.prompt_tokens <= limit
    assert p.prompt_fit.truncated == over
    assert p.prompt_token_ids == tokenize(PROMPT_TOKENS, kept(req, p.prompt_fit), "qwen-fim")
    if chars <= cfg.max_prompt_chars():
        assert p.prompt_fit.prompt_tokens_cut == len(full) - p.prompt_tokens


def test_a_whole_file_fills_the_budget_with_whole_lines_on_the_real_tokenizer():
    prefix = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))
    cfg = load_config(env={})
    p = prepare(pb.CompleteRequest(prefix=prefix), cfg, PROMPT_TOKENS)
    limit = cfg.max_prompt_tokens()
    assert limit * 0.9 <= p.prompt_tokens <= limit
    text = PROMPT_TOKENS.hf.decode(p.prompt_token_ids)
    assert prefix.endswith(text) and prefix[len(prefix) - len(text) - 1] == "\n", "the kept prefix starts on a line start"


def test_limits_prefix_only_fim_asks_a_request_without_a_suffix_at_the_end_of_the_file():
    fim_prefix, fim_suffix, fim_middle = (CharTokens().special(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    req = pb.CompleteRequest(prefix="def f(x):\n    ")
    fim = prepare(req, config(prefix_only="fim"), CharTokens())
    assert fim.fim and fim.prompt_token_ids[0] == fim_prefix and fim.prompt_token_ids[-2:] == [fim_suffix, fim_middle]
    assert fim.typed_indent == "    ", "asked from the blank line's start, as with a suffix"
    assert prepare(pb.CompleteRequest(prefix="def f(x):\n    ", suffix=""), config(), CharTokens()).prompt_token_ids \
        == fim.prompt_token_ids, "the same as a client's empty suffix"
    plain = prepare(req, config(), CharTokens())  # the default
    assert not plain.fim and "".join(map(chr, plain.prompt_token_ids)) == "def f(x):\n    " and plain.typed_indent == ""
    raw = prepare(pb.CompleteRequest(prefix="def f(x):\n", raw_prompt=True), config(prefix_only="fim"), CharTokens())
    assert fim_prefix not in raw.prompt_token_ids, "a raw prompt is the client's own"
    with pytest.raises(ConfigError, match="limits.prefix_only"):
        load_config(env={}, overrides={"limits.prefix_only": "middle"}).validate(check_files=False, check_vllm=False)


# --- the serving path -------------------------------------------------------------------------


def test_the_service_completes_an_oversized_prompt_and_reports_the_cut():
    engines: list[FakeEngine] = []

    async def run():
        async def factory(cfg, mode, live=False):
            engines.append(FakeEngine(mode, live))
            return engines[-1]

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig.off())
        req = pb.CompleteRequest(prefix="x = 1\n" * 3000, suffix="print(x)\n" * 500)  # over max_prompt_chars too
        msgs = [m async for m in service.complete(req, "c")]
        with pytest.raises(RequestError) as err:
            req.strict_prompt = True
            [m async for m in service.complete(req, "c")]
        await manager.stop()
        return cfg, msgs[-1].final, err.value

    cfg, final, err = asyncio.run(run())
    assert final.prompt_fit.truncated and final.prompt_fit.prefix_chars_cut > 0 and final.prompt_fit.suffix_chars_cut > 0
    assert 0 < final.prompt_tokens <= cfg.max_prompt_tokens() and final.completion_tokens > 0
    assert "limits.max_prompt_chars" in err.message and "strict_prompt" in err.message


def test_clients_send_strict_prompt_and_the_cli_says_what_was_cut():
    from quickdraft.cli import prompt_fit_note
    from quickdraft.client import build_request
    from quickdraft.client.sync import CompletionResult

    assert build_request(prefix="x", strict_prompt=True).strict_prompt and not build_request(prefix="x").strict_prompt
    final = pb.CompleteFinal(prompt_fit=pb.PromptFit(truncated=True, prefix_chars_cut=1200, context_files_dropped=2))
    assert CompletionResult("text", final).prompt_fit.prefix_chars_cut == 1200
    assert prompt_fit_note(final.prompt_fit) == ("the prompt was over the server's budget; it kept the text nearest the cursor "
                                                 "and cut 1200 characters before the cursor, 2 context files")
    assert prompt_fit_note(pb.PromptFit()) == ""
