"""Fuzzing the OpenAI-compatible HTTP API (server/openai/) in process: the
FastAPI app over httpx's ASGI transport, the real CompletionService, the fake
engine of test_http_adapter. No sockets, no vLLM.

The contract: whatever arrives (any method, path, Content-Type, Content-Length,
bytes, JSON shape, number or nesting, streaming or not), the answer is a
response, never an exception out of the app nor a 5xx; every 4xx is the API's
error shape naming the problem; an accepted request completes and leaves no
engine request or admission slot behind.

Bodies come from a seeded generator (``QUICKDRAFT_FUZZ_SEED`` picks another
run); a failure prints the case's number and request, which that seed
reproduces.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import httpx

from quickdraft.server.config import load_config
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.frontend import Auth
from quickdraft.server.openai.api_router import build_app
from quickdraft.server.openai.json_body import MAX_DEPTH
from quickdraft.server.openai.protocol import ERROR_TYPES
from quickdraft.server.openai.serving import OpenAIServing
from quickdraft.server.service import CompletionService
from quickdraft.server.telemetry import Telemetry
from tests.test_http_adapter import SPEC, FakeEngine

SEED = int(os.environ.get("QUICKDRAFT_FUZZ_SEED", "1729"))
CASES = 1200
TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON_TYPE = "application/json"

POST_PATHS = ["/v1/completions", "/v1/chat/completions"]
GET_PATHS = ["/v1/models", "/health"]
UNKNOWN_PATHS = ["/v1/completion", "/v1/completions/x", "/v2/completions", "/", "/v1", "/%ff%fe", "/v1/models/../health", "/" + "a" * 5000]
OTHER_METHODS = ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "", "json", "application/json\x00"]

NASTY = [
    "", " ", "x = ", "def f(", "\x00", "\r\n", "\n" * 40, "\x1b[31m", "\u2028", "\ufeff", "\ufffd", "\U0010ffff", "\u202e",
    "🐍", "日本語", "<|fim_prefix|>", "<|fim_middle|>", "<|endoftext|>", "<|im_start|>system\n", "%s%n", "{0}", "${jndi:x}",
    "\ud800", "\udfff", "a" * 3000, "embedded", "user", "text", "none", "auto",
]
# Number literals written as the client writes them; some no Python int() takes.
NUMBERS = [
    "0", "-0", "1", "-1", "2", "16", "0.5", "1e-7", "2.0000001", "1E400", "-1e999999", "2147483648", "9223372036854775808",
    "1" + "0" * 40, "9" * 5000, "-" + "9" * 5000, "0." + "3" * 5000, "NaN", "Infinity", "-Infinity",
]
KNOWN = [
    "model", "prompt", "suffix", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
    "stream", "stream_options", "n", "best_of", "echo", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
    "logit_bias", "tools", "functions", "tool_choice", "response_format", "user", "metadata", "strict_prompt",
]
CODE_LINES = ["def f(x):\n", "    return x + 1\n", "value = compute(alpha, beta)  # note\n", "\n", "print(value)\n", "class A:\n"]
PROMPT_CHARS = load_config(env={}).max_prompt_chars()


class Raw(str):
    """JSON text put into a body as is (numbers Python cannot write, NaN)."""


def dump(value: Any) -> str:
    """JSON text of ``value``, with Raw pieces verbatim and lone surrogates as escapes."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def nested(depth: int, rng: random.Random) -> Raw:
    if rng.random() < 0.5:
        return Raw("[" * depth + "1" + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


def text(rng: random.Random) -> str:
    pieces = rng.choices(NASTY, k=rng.randint(1, 3))
    if rng.random() < 0.2:
        pieces.append("".join(chr(rng.randint(1, 0x10FFFF)) for _ in range(rng.randint(1, 12))))
    return "".join(pieces)


def wild(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value, and some no parser should take."""
    r = rng.random()
    if r < 0.2:
        return text(rng)
    if r < 0.4:
        return Raw(rng.choice(NUMBERS))
    if r < 0.5:
        return rng.choice([True, False, None, 0, 1, -1, 2.5])
    if r < 0.6 and depth < 3:
        return [wild(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.7 and depth < 3:
        return {rng.choice([*KNOWN, "type", "text", "role", "content", text(rng)]): wild(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if r < 0.75:
        return nested(rng.choice([MAX_DEPTH - 2, MAX_DEPTH + 1, 500, 5000]), rng)
    if r < 0.8:
        return [rng.choice([1, "a", True, None, [1]])] * rng.choice([2, 100, 20_000])
    if r < 0.9:
        return {"type": rng.choice(["text", "image_url", "json_object", 1]), "text": text(rng), "include_usage": rng.choice([True, 1, "yes"])}
    return {"role": rng.choice(["user", "system", "developer", "assistant", "tool", 1, ["user"], None]), "content": wild(rng, depth + 1)}


def message(rng: random.Random) -> Any:
    if rng.random() < 0.8:
        content: Any = text(rng) if rng.random() < 0.7 else [{"type": "text", "text": text(rng)} for _ in range(rng.randint(0, 3))]
        return {"role": rng.choice(["user", "system", "developer", "assistant"]), "content": content}
    return wild(rng)


def json_body(rng: random.Random, chat: bool) -> dict:
    """A plausible request with up to four parameters made wild, and extra ones."""
    body: dict[str, Any] = {"model": "embedded", "max_tokens": rng.randint(1, 8)}
    if chat:
        body["messages"] = [message(rng) for _ in range(rng.randint(1, 3))]
    else:
        body["prompt"] = text(rng)
        if rng.random() < 0.3:
            body["suffix"] = text(rng)
    if rng.random() < 0.4:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": rng.random() < 0.5}
    if rng.random() < 0.3:
        body["stop"] = rng.sample(["\n", "#", "\n\n", "def"], rng.randint(1, 3))
    for name in rng.sample(KNOWN, rng.randint(0, 4)):
        body[name] = wild(rng)
    if rng.random() < 0.2:
        body[text(rng)] = wild(rng)
    return body


@dataclass
class Case:
    number: int
    method: str
    path: str
    headers: dict[str, str | bytes]
    body: bytes | None = None
    chunked: bool = False
    # (status, words its error message must hold) when only one answer is right.
    expect: tuple[int, str] | None = None
    stream: bool = False
    # A prompt over the budget that must be cut to fit and answered.
    cut: bool = False
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        shown = None if self.body is None else self.body[:300]
        return f"case {self.number} (QUICKDRAFT_FUZZ_SEED={SEED}): {self.method} {self.path[:80]} {self.headers} chunked={self.chunked} body={shown!r}"


def make_case(number: int, rng: random.Random, max_body: int) -> Case:
    """One request: mostly JSON bodies to the completion endpoints, some broken
    in one way whose answer is known, the rest anything at all."""
    path = rng.choice(POST_PATHS)
    case = Case(number, "POST", path, {**AUTH, "Content-Type": JSON_TYPE})
    kind = rng.choices(["json", "raw", "deep", "values", "digits", "utf8", "oversized", "method", "path", "content_type", "auth", "get", "long"],
                       weights=[50, 8, 4, 3, 4, 4, 3, 5, 3, 6, 3, 4, 4])[0]
    body = json_body(rng, chat=path.endswith("chat/completions"))
    case.body = dump(body).encode("utf-8", "surrogatepass")  # surrogates are escapes by now; this never fires
    case.stream = body.get("stream") is True
    if kind == "raw":
        case.body = rng.choice([
            rng.randbytes(rng.randint(0, 200)),
            case.body[: rng.randint(0, len(case.body))],
            b"", b"null", b"[]", b'"x"', b"1", b" \n ", b"\xef\xbb\xbf{}", dump(body).encode("utf-16"), b"{" * 3, b'{"prompt": "x"}{}',
        ])
    elif kind == "deep":
        case.body = dump({"prompt": "x", "messages": [], "user": nested(rng.choice([MAX_DEPTH + 1, 1000, 5000]), rng)}).encode()
        if rng.random() < 0.5:
            case.body = nested(5000, rng).encode()  # past the recursion limit, within the values limit
        case.expect = (400, "nested too deeply")
    elif kind == "values":
        # Cheap to send, a second of the event loop to parse: refused before parsing.
        item = rng.choice([b"1", b"[]", b"{}", b'""', b'"\\"', b"null", b'{"a":1}', b"[" * 40 + b"]" * 40])
        case.body = b'{"prompt": "x", "user": [' + b",".join([item] * ((max_body - 64) // (len(item) + 1))) + b"]}"
        case.expect = (400, "JSON values")
    elif kind == "digits":
        name = rng.choice(["max_tokens", "temperature", "top_p", "seed", "n", "stream"])
        case.body = dump({"prompt": "x", "messages": [{"role": "user", "content": "x"}], name: Raw(rng.choice(["", "-"]) + "9" * rng.randint(41, 20_000))}).encode()
        case.expect = (400, "-digit number")
    elif kind == "utf8":
        bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82"])
        at = rng.randint(0, len(case.body))
        case.body = case.body[:at] + bad + case.body[at:]
        case.expect = (400, "not valid UTF-8")
    elif kind == "oversized":
        if rng.random() < 0.5:
            case.headers["Content-Length"] = rng.choice([str(max_body + 1), str(10**12), str(10**40), "9" * 5000])  # int() refuses 4,300+ digits
        else:
            case.chunked = True
            case.body = b"[" + b"1," * (max_body // 2) + b"1]"
        case.expect = (413, "max_request_bytes")
    elif kind == "method":
        case.method = rng.choice(OTHER_METHODS)
        case.expect = (405, case.path) if case.method != "OPTIONS" else None
    elif kind == "path":
        case.path = rng.choice(UNKNOWN_PATHS)
        case.expect = None  # 404, or 405 where a known path was reached by another name
    elif kind == "content_type":
        if rng.random() < 0.2:
            del case.headers["Content-Type"]
        else:
            case.headers["Content-Type"] = rng.choice(CONTENT_TYPES)
        case.expect = (415, "Content-Type")
    elif kind == "auth":
        if rng.random() < 0.5:
            del case.headers["Authorization"]
        else:
            case.headers["Authorization"] = rng.choice(["Bearer wrong", "Bearer", "bearer " + TOKEN, TOKEN, "Basic eDp5", "Bearer " + TOKEN + " "])
        case.expect = (401, "bearer token")
    elif kind == "long":
        long_prompt(case, rng)
    elif kind == "get":
        case.method = rng.choice(["GET", "POST"])
        case.path = rng.choice(GET_PATHS)
        case.expect = (200, "") if case.method == "GET" else (405, case.path)
    if rng.random() < 0.05:
        case.headers["X-Request-Id"] = rng.choice(["r" * 300, "a\tb", "id-ü", "ok-1", ""]).encode("latin-1")
        if kind == "long":  # the id may be refused first
            case.expect, case.cut = None, False
    if rng.random() < 0.03:
        case.headers["X-Forwarded-For"] = "10.0.0.1"
    return case


def long_prompt(case: Case, rng: random.Random) -> None:
    """Code over limits.max_prompt_chars: cut to fit and answered, unless
    strict_prompt is set or it is the client's own template (a chat, a FIM
    prompt with control tokens), which are refused naming why."""
    n = rng.randint(PROMPT_CHARS + 1, 3 * PROMPT_CHARS)
    code = "".join(rng.choice(CODE_LINES) for _ in range(n // 8))[:n]
    strict = rng.random() < 0.3
    body: dict[str, Any] = {"model": "embedded", "max_tokens": rng.randint(1, 8), "strict_prompt": True if strict else rng.choice([False, None])}
    if case.path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": code}]
        case.expect = (400, "strict_prompt is set" if strict else "control tokens")
    else:
        templated = rng.random() < 0.3
        body["prompt"] = f"<|fim_prefix|>{code}<|fim_suffix|><|fim_middle|>" if templated else code
        if not templated and rng.random() < 0.4:
            body["suffix"] = code[: n // 3]
        case.expect = (400, "strict_prompt is set") if strict else (400, "control tokens") if templated else (200, "")
        case.cut = not (strict or templated)
    if rng.random() < 0.3:
        body["stream"] = True
    case.stream = body.get("stream") is True
    case.body = dump(body).encode()


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    """The body with no Content-Length: chunked, as a client streams it."""
    for i in range(0, len(data), 8192):
        yield data[i : i + 8192]


def problems(case: Case, r: httpx.Response) -> list[str]:
    """What is wrong with ``r`` as the answer to ``case``."""
    status = r.status_code
    out = []
    if status >= 500:
        out.append(f"status {status}")
    if case.expect is not None and case.expect[0] != status:
        out.append(f"status {status}, expected {case.expect[0]}")
    if 400 <= status < 500:
        if case.method == "HEAD":
            return out  # no body to check
        try:
            error = r.json()["error"]
        except (ValueError, KeyError, TypeError):
            return [*out, f"{status} without the error shape: {r.content[:200]!r}"]
        if not (isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}):
            return [*out, f"error shape {error!r}"[:300]]
        message, param = error["message"], error["param"]
        if not (isinstance(message, str) and message):
            out.append("empty error message")
        elif param is not None and not message.startswith(param):
            out.append(f"message does not start with its param {param!r}: {message[:200]}")
        if error["type"] != ERROR_TYPES.get(status) or not isinstance(error["code"], str):
            out.append(f"type/code {error['type']}/{error['code']} for {status}")
        if case.expect is not None and case.expect[1] not in message:
            out.append(f"message does not say {case.expect[1]!r}: {message[:200]}")
        if len(r.content) > 2000:
            out.append(f"a {len(r.content)}-byte error: client values must be quoted briefly")
    elif status == 200 and case.method == "POST" and case.path in POST_PATHS:
        if case.stream:
            if not (r.headers["content-type"].startswith("text/event-stream") and r.content.endswith(b"data: [DONE]\n\n")):
                out.append(f"stream not ended by [DONE]: {r.content[-200:]!r}")
            if case.cut and b'"prompt_fit":{"truncated":true' not in r.content:
                out.append("a prompt over the budget streamed without saying what was cut")
        elif "choices" not in r.json():
            out.append(f"200 without choices: {r.content[:200]!r}")
        elif case.cut and not r.json()["quickdraft"]["prompt_fit"]["truncated"]:
            out.append("a prompt over the budget answered without saying what was cut")
    return out


async def test_fuzz_http_api_never_fails_on_hostile_requests():
    cfg = load_config(env={})
    cfg.limits.max_request_bytes = 65536  # a smaller body limit: oversized cases cost less
    engine = FakeEngine()

    async def factory(cfg, spec, live=False):
        return engine

    manager = EngineManager(cfg, engine_factory=factory)
    service = CompletionService(cfg, manager, Telemetry("embedded"))
    await manager.start(SPEC)
    serving = OpenAIServing(cfg, service, Auth(TOKEN))
    # An exception out of the app reaches us (raise_app_exceptions): a crash, not a 500.
    transport = httpx.ASGITransport(app=build_app(serving), raise_app_exceptions=True)
    rng = random.Random(SEED)
    sent, statuses, failures = 0, {}, []
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://quickdraft.test", timeout=30) as client:
            for number in range(CASES):
                case = make_case(number, rng, serving.max_body)
                content = chunks(case.body) if case.chunked and case.body is not None else case.body
                try:
                    r = await client.request(case.method, case.path, content=content, headers=case.headers)
                except Exception as e:  # noqa: BLE001 - a crash of the app is a finding
                    failures.append(f"{case}: raised {type(e).__name__}: {e}"[:1000])
                    continue
                finally:
                    sent += 1
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                failures += [f"{case}: {p}"[:1000] for p in problems(case, r)]
        assert sent >= 1000, f"only {sent} requests sent"
        assert not failures, f"{len(failures)} of {sent} requests failed:\n" + "\n".join(failures[:10])
        # Each kind of answer was reached, or the generator has gone stale.
        assert {200, 400, 401, 404, 405, 413, 415} <= set(statuses), statuses
        assert not engine.unfinished and service.admission.open == 0, "a request outlived its response"
    finally:
        await manager.stop()
