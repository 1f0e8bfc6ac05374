"""Request validation, preparation and the prompt step (real tokenizer, no engine)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from quickdraft.prompt_format import CodeContext, render
from quickdraft.server.config import load_config
from quickdraft.server.presets import embedded_dir
from quickdraft.server.errors import RequestError
from quickdraft.server.preparation import prepare
from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
from quickdraft.v1 import completion_pb2 as pb


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))


@pytest.fixture(scope="module")
def tokens(tok):
    return PromptTokenizer(tok)


@pytest.fixture
def cfg():
    return load_config(env={})


def test_fim_prompt_tokenizes_like_the_training_format(tok, tokens):
    req = pb.CompleteRequest(prefix="def f(x):\n    ", suffix="\n", file_path="a.py", repo_name="r", context_files=[pb.ContextFile(path="b.py", content="X = 1\n")])
    ids = tokenize(tokens, req, "qwen-fim")
    text = render(CodeContext(prefix=req.prefix, suffix=req.suffix, file_path="a.py", repo_name="r", context_files=[("b.py", "X = 1\n")]))
    assert ids == tok.encode(text, add_special_tokens=False)
    vocab = tok.get_vocab()
    for special in ("<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"):
        assert vocab[special] in ids


def test_special_token_strings_in_user_code_stay_text(tok, tokens):
    req = pb.CompleteRequest(prefix="s = '<|endoftext|><|fim_middle|>'\n")
    ids = tokenize(tokens, req, "qwen-fim")
    vocab = tok.get_vocab()
    assert vocab["<|endoftext|>"] not in ids and vocab["<|fim_middle|>"] not in ids
    assert tok.decode(ids) == req.prefix


def test_raw_prompt_is_sent_as_is(tok, tokens):
    req = pb.CompleteRequest(prefix="<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", raw_prompt=True)
    assert tokenize(tokens, req, "qwen-fim")[0] == tok.get_vocab()["<|fim_prefix|>"]


def test_a_tokenizer_without_the_formats_special_tokens_is_a_clear_error():
    # A model family's tokenizer without FIM tokens (e.g. a preset mismatch):
    # its unknown-token id must never stand in for <|fim_prefix|>.
    plain = AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))
    plain.convert_tokens_to_ids = lambda t: plain.unk_token_id  # what HF answers for a missing token
    with pytest.raises(RequestError) as e:
        tokenize(PromptTokenizer(plain), pb.CompleteRequest(prefix="x = ", suffix="\n"), "qwen-fim")
    assert "<|fim_prefix|>" in e.value.message and "preset" in e.value.message


def test_plain_format_sends_the_prefix_only(tok, tokens):
    req = pb.CompleteRequest(prefix="x = ", suffix="\nprint(x)\n")
    assert tokenize(tokens, req, "plain") == tok.encode("x = ", add_special_tokens=False)


def test_prepare_defaults_and_clamps(tok, tokens, cfg):
    p = prepare(pb.CompleteRequest(prefix="x = 1\n"), cfg, tokens)
    assert p.sampling.max_tokens == cfg.limits.default_max_tokens
    assert p.sampling.temperature == 0.0 and p.sampling.top_p == 1.0
    assert p.latency_class == "inline" and p.request_id
    long = "y = 2\n" * 150
    p = prepare(pb.CompleteRequest(prefix=long, max_tokens=500), cfg, tokens)
    assert p.prompt_tokens + p.sampling.max_tokens <= cfg.max_model_len()


@pytest.mark.parametrize(
    "req, fragment",
    [
        (pb.CompleteRequest(), "empty prompt"),
        (pb.CompleteRequest(prefix="x", max_tokens=-1), "max_tokens"),
        (pb.CompleteRequest(prefix="x", temperature=float("inf")), "temperature"),
        (pb.CompleteRequest(prefix="x", temperature=-0.5), "temperature"),
        (pb.CompleteRequest(prefix="x", top_p=1.5), "top_p"),
        (pb.CompleteRequest(prefix="x", seed=-1), "seed"),
        (pb.CompleteRequest(prefix="x", stop=[""]), "stop[0]"),
        (pb.CompleteRequest(prefix="x", stop=["a" * 500]), "max_stop_length"),
        (pb.CompleteRequest(prefix="x", context_files=[pb.ContextFile(path="", content="")]), "context_files[0].path"),
        (pb.CompleteRequest(prefix="x", context_files=[pb.ContextFile(path="f", content="")] * 100), "max_context_files"),
        (pb.CompleteRequest(prefix="x", latency_class=9), "latency_class"),
        (pb.CompleteRequest(prefix="x", suffix="y", raw_prompt=True), "raw_prompt"),
        (pb.CompleteRequest(prefix="x" * 2_000_000), "max_request_bytes"),
        (pb.CompleteRequest(prefix="1," * 1200, strict_prompt=True), "max_prompt_tokens"),
        (pb.CompleteRequest(prefix="word " * 3000, strict_prompt=True), "max_prompt_chars"),
    ],
)
def test_bad_requests_name_the_field(tok, tokens, cfg, req, fragment):
    with pytest.raises(RequestError) as err:
        prepare(req, cfg, tokens)
    assert err.value.code == "INVALID_ARGUMENT"
    assert fragment in err.value.message


SPECIALS = st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|file_sep|>", "<|im_start|>"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(), SPECIALS, st.sampled_from(["\n", "    ", "\t\r\n", "é漢字🙂", "\u200b"])), max_size=12))
def test_prompt_tokenizer_gives_the_wrappers_ids(tok, tokens, parts):
    """The Rust tokenizer called directly must give exactly the ids the
    Hugging Face wrapper gives: user text with special-token strings kept as
    text, raw prompts with them parsed."""
    s = "".join(parts)
    assert tokens.text(s) == tok.encode(s, add_special_tokens=False, split_special_tokens=True)
    assert tokens.raw(s) == tok.encode(s, add_special_tokens=False)


def test_prompt_tokenizer_falls_back_to_a_slow_tokenizers_encode(tok):
    class Slow:  # no backend_tokenizer, as a Python-only tokenizer
        unk_token, unk_token_id = tok.unk_token, tok.unk_token_id

        def encode(self, s, **kw):
            return tok.encode(s, **kw)

        def convert_tokens_to_ids(self, t):
            return tok.convert_tokens_to_ids(t)

    slow = PromptTokenizer(Slow())
    assert slow.text("a <|endoftext|>") == tok.encode("a <|endoftext|>", add_special_tokens=False, split_special_tokens=True)
    assert slow.raw("<|endoftext|>") == [tok.convert_tokens_to_ids("<|endoftext|>")]
    assert slow.special("<|fim_prefix|>") == tok.convert_tokens_to_ids("<|fim_prefix|>")
