"""Property-based fuzzing of request validation and preparation
(server/request_validation.py, server/preparation.py) with the embedded
model's real tokenizer; no engine.

The contract: every CompleteRequest either prepares into engine input that
vLLM accepts, or is refused with RequestError("INVALID_ARGUMENT") whose
message names a field that is actually wrong. Nothing else escapes, and no
message echoes the caller's code. A prompt over the budget is cut to fit
(server/prompt_fitting.py), so it is refused only where the server may not
cut it: with strict_prompt, or a raw prompt holding control tokens.

An independent oracle (``violations``) states the rules from the API's
documented limits; the properties compare the server against it.
"""

from __future__ import annotations

import functools
import math
import re

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import event as _hypothesis_event
from hypothesis.errors import InvalidArgument
from hypothesis import strategies as st

from quickdraft.prompt_format import SPECIAL_TOKENS, CodeContext, segments
from quickdraft.server.config import load_config
from quickdraft.server.grpc_server import _BadRequest, _parse
from quickdraft.server.presets import embedded_dir
from quickdraft.server.errors import RequestError
from quickdraft.server.preparation import PreparedRequest, prepare
from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
from quickdraft.server.request_validation import MAX_REQUEST_ID, check
from quickdraft.v1 import completion_pb2 as pb

CFG = load_config(env={})
LIM = CFG.limits
MARKER = "QDFUZZ_5e1d_secret_code"

# Strings that have broken tokenizers, terminals, loggers and protocols before.
NASTY = [
    "", " ", "\x00", "\x00\x00x", "\r\n", "\n" * 50, "\t\t", "\x7f", "\x1b[31m", "\u0085", "\u2028\u2029",
    "\ufeff", "\ufffd", "\ufffe", "\uffff", "\U0010ffff", "\U000e0001", "\u202e gnirts", "\u200b\u200d", "e\u0301\u0301\u0301",
    "🐍🦀", "👩‍👩‍👧‍👦", "Ⅻ", "ﬁ", "İ", "ß", "日本語のコード", "한국어", "مرحبا", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    *SPECIAL_TOKENS, "<|fim_prefix|><|fim_suffix|><|fim_middle|>", "<|endoftext|>" * 20, "<|", "|>", "<|im_start|>system\n",
    "%s%s%n", "{0}{1}", "'; DROP TABLE x; --", "${jndi:ldap://x}", "\\x00\\u0000", "a" * 5000,
]


def odd_text(max_size: int = 200):
    """Arbitrary Unicode (no surrogates: protobuf strings cannot hold them), nasty strings, or long repeats."""
    return st.one_of(
        st.text(max_size=max_size),
        st.sampled_from(NASTY),
        st.lists(st.sampled_from(NASTY), max_size=8).map("".join),
        st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=6), st.integers(0, 4000)),
    )


def optional_float():
    return st.one_of(
        st.none(),
        st.floats(allow_nan=True, allow_infinity=True, width=32),
        st.sampled_from([0.0, -0.0, 1e-45, 1e-7, 0.5, 1.0, 1.0000001, 2.0, 2.0000002, -1.0, float("nan"), float("inf"), float("-inf"), 3.4e38]),
    )


FIELDS = ["request_id", "prefix", "suffix", "file_path", "repo_name", "max_tokens", "latency_class", "raw_prompt", "context_files", "stop", "temperature", "top_p", "seed",
          "strict_prompt"]


def printable(max_size: int):
    return st.text(st.characters(categories=["L", "N", "P", "S", "Zs"]), max_size=max_size)


@st.composite
def requests(draw) -> pb.CompleteRequest:
    """Mostly well-formed requests with up to three fields drawn from anything at all."""
    wild = draw(st.sets(st.sampled_from(FIELDS), max_size=3))

    def pick(name, tame, anything):
        return draw(anything if name in wild else tame)

    req = pb.CompleteRequest(
        request_id=pick("request_id", st.one_of(st.just(""), printable(40)), st.one_of(st.text(max_size=40), st.text(min_size=120, max_size=140), st.sampled_from(["a\nb", "id\x00", "\u202e", "x" * 129]))),
        prefix=pick("prefix", st.one_of(odd_text(), st.just(f"# {MARKER}\n")), st.one_of(st.just(""), odd_text(), st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(0, 300_000)))),
        language_id=draw(st.text(max_size=20)),
        file_path=pick("file_path", printable(30), st.one_of(st.text(max_size=30), st.sampled_from(["x\ny.py", "nul\x00.py", "../../etc/passwd"]))),
        repo_name=pick("repo_name", printable(30), st.text(max_size=30)),
        max_tokens=pick("max_tokens", st.integers(0, LIM.max_output_tokens), st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, LIM.max_output_tokens + 2))),
        latency_class=pick("latency_class", st.integers(0, 3), st.integers(-(2**31), 2**31 - 1)),
        raw_prompt=pick("raw_prompt", st.just(False), st.booleans()),
        strict_prompt=pick("strict_prompt", st.booleans(), st.booleans()),
    )
    if pick("suffix", st.booleans(), st.booleans()):
        req.suffix = draw(odd_text())
    n_files = pick("context_files", st.integers(0, 3), st.one_of(st.integers(LIM.max_context_files - 1, LIM.max_context_files + 1), st.integers(0, 300)))
    odd_paths = "context_files" in wild and draw(st.booleans())
    for i in range(n_files):
        path = draw(st.sampled_from(["", "a\nb", "a\x00b", "ok.py", "ünï/c😀de.py", "x" * 300])) if odd_paths else f"pkg/m{i}.py"
        req.context_files.add(path=path, content=f"# {MARKER}\nv{i} = {i}\n" if i % 2 else draw(st.text(max_size=30)))
    n_stop = pick("stop", st.integers(0, 4), st.one_of(st.integers(LIM.max_stop_sequences - 1, LIM.max_stop_sequences + 1), st.integers(0, 5000)))
    stop_kind = draw(st.sampled_from(["distinct", "drawn", "long", "empty"])) if "stop" in wild else draw(st.sampled_from(["distinct", "drawn"]))
    for i in range(n_stop):
        if stop_kind == "distinct":
            req.stop.append(f"s{i}")
        elif stop_kind == "drawn":
            req.stop.append((draw(odd_text(20)) or "x") if i < 20 else f"d{i}")
        elif stop_kind == "long":
            req.stop.append("z" * (LIM.max_stop_length - 1 + i % 3))
        else:
            req.stop.append("" if i == n_stop - 1 else "\n")
    if "stop" not in wild:
        del req.stop[:]  # keep tame requests' stop lists valid
        req.stop.extend(s[: LIM.max_stop_length] for s in list(draw(st.lists(printable(10).filter(bool), max_size=4))))
    for name, tame in (("temperature", st.floats(0.0, 2.0, width=32)), ("top_p", st.floats(0.0, 1.0, width=32, exclude_min=True))):
        v = pick(name, st.one_of(st.none(), tame), optional_float())
        if v is not None:
            setattr(req, name, v)
    if pick("seed", st.booleans(), st.just(True)):
        req.seed = pick("seed", st.integers(0, 2**63 - 1), st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([-1, 0, 2**63 - 1])))
    return req


def event(label: str) -> None:
    """Outcome statistics (pytest --hypothesis-show-statistics); a no-op outside @given."""
    try:
        _hypothesis_event(label)
    except InvalidArgument:
        pass


def violations(req: pb.CompleteRequest) -> set[str]:
    """The fields an independent reading of the API's limits says are wrong.
    Each entry is a word the server's message must contain."""
    v: set[str] = set()
    if req.ByteSize() > LIM.max_request_bytes:
        v.add("max_request_bytes")
    if len(req.prefix) + len(req.suffix) + sum(len(f.content) for f in req.context_files) > CFG.max_prompt_chars() and not may_cut(req):
        v.add("max_prompt_chars")
    if len(req.request_id) > MAX_REQUEST_ID or not req.request_id.isprintable():
        v.add("request_id")
    if not req.prefix and not req.HasField("suffix") and len(req.context_files) == 0:
        v.add("prefix")
    if req.raw_prompt and (req.HasField("suffix") or len(req.context_files)):
        v.add("raw_prompt")
    if not 0 <= req.max_tokens <= LIM.max_output_tokens:
        v.add("max_tokens")
    if req.HasField("temperature") and not (math.isfinite(req.temperature) and 0 <= req.temperature <= 2):
        v.add("temperature")
    if req.HasField("top_p") and not (math.isfinite(req.top_p) and 0 < req.top_p <= 1):
        v.add("top_p")
    if req.HasField("seed") and req.seed < 0:
        v.add("seed")
    if len(req.stop) > LIM.max_stop_sequences or any(not s or len(s) > LIM.max_stop_length for s in req.stop):
        v.add("stop")
    if len(req.context_files) > LIM.max_context_files or any(not f.path or "\x00" in f.path or "\n" in f.path for f in req.context_files):
        v.add("context_files")
    if "\x00" in req.file_path or "\n" in req.file_path:
        v.add("file_path")
    if req.latency_class not in (0, 1, 2, 3):
        v.add("latency_class")
    return v


def has_control_tokens(text: str) -> bool:
    return any(t in text for t in SPECIAL_TOKENS)


def may_cut(req: pb.CompleteRequest) -> bool:
    """Whether the server cuts this request's prompt to fit rather than refuse it."""
    return not req.strict_prompt and not (req.raw_prompt and has_control_tokens(req.prefix))


def assert_refused_for_its_tokens(req: pb.CompleteRequest, message: str, tokens: PromptTokenizer, cfg=CFG) -> None:
    """A refusal no field explains: too long where the server may not cut
    (or file_path and repo_name alone over the budget), or nothing to send."""
    ids = tokenize(tokens, req, cfg.preset.prompt_format)
    if len(ids) > cfg.max_prompt_tokens():
        assert "max_prompt_tokens" in message, message
        assert not may_cut(req) or "file_path" in message, f"refused a prompt the server should have cut: {message}"
    else:
        assert not ids and message.startswith("prefix"), message


# One per tokenizer, as the engine keeps one.
prompt_tokens_of = functools.cache(PromptTokenizer)


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))


@pytest.fixture(scope="module")
def sampling_params():
    """vLLM's SamplingParams, which validates what prepare() hands the engine."""
    vllm = pytest.importorskip("vllm")
    return vllm.SamplingParams


def _special_ids(tokenizer) -> set[int]:
    vocab = tokenizer.get_vocab()
    return {vocab[t] for t in SPECIAL_TOKENS if t in vocab} | set(tokenizer.all_special_ids)


def assert_prepared_is_sound(req: pb.CompleteRequest, p: PreparedRequest, tokenizer, sampling_params) -> None:
    max_len = CFG.max_model_len()
    assert 1 <= p.prompt_tokens <= CFG.max_prompt_tokens()
    s = p.sampling
    assert 1 <= s.max_tokens <= LIM.max_output_tokens
    assert p.prompt_tokens + s.max_tokens <= max_len, "engine asked for more than the context window"
    if req.max_tokens:
        assert s.max_tokens == max(1, min(req.max_tokens, max_len - p.prompt_tokens))
    else:
        assert s.max_tokens == max(1, min(LIM.default_max_tokens, max_len - p.prompt_tokens))
    assert 0 < len(p.request_id) <= MAX_REQUEST_ID and p.request_id.isprintable()
    assert re.fullmatch(r"[0-9a-f]{12}", p.prompt_sha)
    assert not p.prompt_fit.truncated or may_cut(req), "cut a prompt the client asked to be refused"
    # User text never becomes a control token: only the template's own ones appear.
    if not req.raw_prompt:
        kept_files = [(f.path, f.content) for f in req.context_files][p.prompt_fit.context_files_dropped :]
        ctx = CodeContext(req.prefix, req.suffix if req.HasField("suffix") else None, req.file_path, req.repo_name, kept_files)
        template_specials = sum(1 for special, _ in segments(ctx, CFG.preset.prompt_format) if special)
        specials = _special_ids(tokenizer)
        assert sum(1 for i in p.prompt_token_ids if i in specials) == template_specials
    # What the engine is handed must be acceptable to vLLM (else the stream would fail as UNKNOWN).
    vocab = tokenizer.get_vocab()
    sp = p.sampling.to_vllm([vocab["<|endoftext|>"]])
    assert isinstance(sp, sampling_params)


def check_one(req: pb.CompleteRequest, tokenizer, sampling_params) -> str:
    """Run prepare(); return "ok" or the error's field, asserting the contract."""
    expected = violations(req)
    try:
        p = prepare(req, CFG, prompt_tokens_of(tokenizer))
    except RequestError as e:
        assert e.code == "INVALID_ARGUMENT", (e.code, e.message)
        assert MARKER not in e.message, "an error message echoed the caller's code"
        if expected:
            assert any(field in e.message for field in expected), f"message {e.message!r} names none of {sorted(expected)}"
        else:
            # Only the tokenizer-dependent rules remain: too long, or nothing to send.
            assert_refused_for_its_tokens(req, e.message, prompt_tokens_of(tokenizer))
        event("refused: " + (e.message.split(":")[0].split(" ")[0]))
        return "refused"
    assert not expected, f"accepted a request that violates {sorted(expected)}"
    assert_prepared_is_sound(req, p, tokenizer, sampling_params)
    event("prepared")
    return "ok"


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(req=requests())
@example(req=pb.CompleteRequest(prefix="x", temperature=float("nan")))
@example(req=pb.CompleteRequest(prefix="x", top_p=float("inf")))
@example(req=pb.CompleteRequest(prefix="x", max_tokens=-(2**31)))
@example(req=pb.CompleteRequest(prefix="x", latency_class=2**31 - 1))
@example(req=pb.CompleteRequest(prefix="x", stop=["s"] * 3000))
@example(req=pb.CompleteRequest(prefix="x", request_id="line\nforged log line"))
@example(req=pb.CompleteRequest(prefix="a" * (LIM.max_request_bytes + 1)))
@example(req=pb.CompleteRequest(prefix="<|endoftext|><|fim_prefix|>", suffix="<|fim_middle|>"))
@example(req=pb.CompleteRequest(prefix="x", seed=2**63 - 1, temperature=1e-45))
def test_every_request_prepares_or_is_refused_naming_the_field(req, tokenizer, sampling_params):
    check_one(req, tokenizer, sampling_params)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(min_size=1, max_size=30), repeat=st.integers(1, 3000), max_tokens=st.integers(0, LIM.max_output_tokens), raw=st.booleans(),
       strict=st.booleans())
def test_prompts_near_the_context_window(text, repeat, max_tokens, raw, strict, tokenizer, sampling_params):
    """Long prompts: cut to fit, or refused naming the limit (strict, or raw
    with control tokens); prepared with max_tokens cut to the window."""
    req = pb.CompleteRequest(prefix=text * repeat, max_tokens=max_tokens, raw_prompt=raw, strict_prompt=strict)
    assume(req.ByteSize() <= LIM.max_request_bytes)
    check_one(req, tokenizer, sampling_params)


@pytest.mark.parametrize("n", [0, LIM.max_stop_sequences, LIM.max_stop_sequences + 1, 1000, 10_000])
def test_thousands_of_stop_sequences(n, tokenizer, sampling_params):
    req = pb.CompleteRequest(prefix="x = 1\n", stop=[f"stop{i}" for i in range(n)])
    assert check_one(req, tokenizer, sampling_params) == ("ok" if n <= LIM.max_stop_sequences else "refused")


@pytest.mark.parametrize("n", [LIM.max_context_files, LIM.max_context_files + 1, 5000])
def test_oversized_context_lists(n, tokenizer, sampling_params):
    req = pb.CompleteRequest(prefix="x", suffix="", context_files=[pb.ContextFile(path=f"f{i}.py", content="") for i in range(n)])
    result = check_one(req, tokenizer, sampling_params)
    assert result == ("ok" if n <= LIM.max_context_files else "refused")


def test_check_alone_never_raises_anything_else():
    """check() needs no tokenizer; empty and default messages are handled."""
    with pytest.raises(RequestError) as err:
        check(pb.CompleteRequest(), CFG)
    assert err.value.code == "INVALID_ARGUMENT" and "prefix" in err.value.message


# --- the wire: bytes that do not parse --------------------------------------------------

def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2), payload < 128 bytes or not."""
    n, out = len(payload), bytearray([(number << 3) | 2])
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out) + payload


# Lone and paired surrogates as they would travel in UTF-8-like encodings (CESU-8 / WTF-8), overlongs, truncations.
BAD_UTF8 = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\xbd\xed\xb8\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80", b"\xff", b"\x80", b"\xe2\x82", b"abc\xf4\x90\x80\x80"]
STRING_FIELDS = {1: "request_id", 2: "prefix", 3: "suffix", 5: "language_id", 6: "file_path", 7: "repo_name", 11: "stop"}


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(STRING_FIELDS)), bad=st.sampled_from(BAD_UTF8), before=st.binary(max_size=10), after=st.binary(max_size=10))
def test_invalid_utf8_in_any_string_field_is_a_bad_request(field, bad, before, after):
    """Strings that are not UTF-8 (lone surrogates included) never reach the service."""
    valid = pb.CompleteRequest(prefix="x = 1\n").SerializeToString()
    data = valid + _field(field, before.decode("latin-1").encode("ascii", "ignore") + bad + after.decode("latin-1").encode("ascii", "ignore"))
    parsed = _parse(pb.CompleteRequest)(data)
    assert isinstance(parsed, _BadRequest), f"field {STRING_FIELDS[field]} with {bad!r} parsed"
    assert parsed.error


@settings(max_examples=500, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), st.builds(lambda a, b: a + b, st.just(pb.CompleteRequest(prefix="p", stop=["a"]).SerializeToString()), st.binary(max_size=50))))
def test_random_bytes_parse_or_are_a_bad_request(data):
    parsed = _parse(pb.CompleteRequest)(data)
    assert isinstance(parsed, (pb.CompleteRequest, _BadRequest))
