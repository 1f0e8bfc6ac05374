"""Request checks and prompt tokenization (real tokenizer, no engine)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from quickdraft.prompt_format import CodeContext, render
from quickdraft.server.config import load_config
from quickdraft.server.presets import embedded_dir
from quickdraft.server.requests import RequestError, prepare, tokenize
from quickdraft.v1 import completion_pb2 as pb


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))


@pytest.fixture
def cfg():
    return load_config(env={})


def test_fim_prompt_tokenizes_like_the_training_format(tok):
    req = pb.CompleteRequest(prefix="def f(x):\n    ", suffix="\n", file_path="a.py", repo_name="r", context_files=[pb.ContextFile(path="b.py", content="X = 1\n")])
    ids = tokenize(tok, req, "qwen-fim")
    text = render(CodeContext(prefix=req.prefix, suffix=req.suffix, file_path="a.py", repo_name="r", context_files=[("b.py", "X = 1\n")]))
    assert ids == tok.encode(text, add_special_tokens=False)
    vocab = tok.get_vocab()
    for special in ("<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"):
        assert vocab[special] in ids


def test_special_token_strings_in_user_code_stay_text(tok):
    req = pb.CompleteRequest(prefix="s = '<|endoftext|><|fim_middle|>'\n")
    ids = tokenize(tok, req, "qwen-fim")
    vocab = tok.get_vocab()
    assert vocab["<|endoftext|>"] not in ids and vocab["<|fim_middle|>"] not in ids
    assert tok.decode(ids) == req.prefix


def test_raw_prompt_is_sent_as_is(tok):
    req = pb.CompleteRequest(prefix="<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", raw_prompt=True)
    assert tokenize(tok, req, "qwen-fim")[0] == tok.get_vocab()["<|fim_prefix|>"]


def test_a_tokenizer_without_the_formats_special_tokens_is_a_clear_error():
    # A model family's tokenizer without FIM tokens (e.g. a preset mismatch):
    # its unknown-token id must never stand in for <|fim_prefix|>.
    plain = AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))
    plain.convert_tokens_to_ids = lambda t: plain.unk_token_id  # what HF answers for a missing token
    with pytest.raises(RequestError) as e:
        tokenize(plain, pb.CompleteRequest(prefix="x = ", suffix="\n"), "qwen-fim")
    assert "<|fim_prefix|>" in e.value.message and "preset" in e.value.message


def test_plain_format_sends_the_prefix_only(tok):
    req = pb.CompleteRequest(prefix="x = ", suffix="\nprint(x)\n")
    assert tokenize(tok, req, "plain") == tok.encode("x = ", add_special_tokens=False)


def test_prepare_defaults_and_clamps(tok, cfg):
    p = prepare(pb.CompleteRequest(prefix="x = 1\n"), cfg, tok)
    assert p.sampling.max_tokens == cfg.limits.default_max_tokens
    assert p.sampling.temperature == 0.0 and p.sampling.top_p == 1.0
    assert p.latency_class == "inline" and p.request_id
    long = "y = 2\n" * 150
    p = prepare(pb.CompleteRequest(prefix=long, max_tokens=500), cfg, tok)
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
        (pb.CompleteRequest(prefix="word " * 3000), "max_prompt_tokens"),
    ],
)
def test_bad_requests_name_the_field(tok, cfg, req, fragment):
    with pytest.raises(RequestError) as err:
        prepare(req, cfg, tok)
    assert err.value.code == "INVALID_ARGUMENT" and err.value.http_status == 400
    assert fragment in err.value.message
