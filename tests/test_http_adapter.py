"""The OpenAI-compatible HTTP API (server/openai/) over the real
CompletionService with a fake engine: request translation, response shapes,
errors, auth, admission and aborts when the client goes away. No vLLM engine;
the only network is loopback, and the serving objects are also driven without it."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from types import SimpleNamespace

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from quickdraft.server.config import ConfigError, load_config
from quickdraft.server.engine import EngineSnapshot
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.frontend import Auth
from quickdraft.server.openai.api_router import build_app
from quickdraft.server.openai.http_server import HttpServer
from quickdraft.server.openai.json_body import MAX_DEPTH
from quickdraft.server.openai.protocol import ApiError, chat_call, completion_call
from quickdraft.server.openai.serving import OpenAIServing
from quickdraft.server.presets import embedded_dir
from quickdraft.server.prompt_tokens import PromptTokenizer
from quickdraft.server.service import CompletionService
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import Telemetry

TOKENIZER = AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))
PROMPT_TOKENS = PromptTokenizer(TOKENIZER)
VOCAB = TOKENIZER.get_vocab()
SPEC = SpecConfig(True, 5)


@dataclass
class FakeEngine:
    """Yields `steps` (text, tokens) with `delay` between them; records what it was asked."""

    steps: list[tuple[str, int]] = field(default_factory=lambda: [("def", 1), (" f(", 3), ("):", 2)])
    delay: float = 0.0
    fail_after: int | None = None
    spec: SpecConfig = SPEC
    live: bool = False
    switches: int = 0
    dead: bool = False
    tokenizer: object = TOKENIZER
    prompt_tokens: PromptTokenizer = PROMPT_TOKENS
    stop_token_ids: list[int] = field(default_factory=lambda: [VOCAB["<|endoftext|>"]])
    calls: list[tuple[list[int], object]] = field(default_factory=list)
    unfinished: set = field(default_factory=set)
    aborted: list[str] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    snapshot: EngineSnapshot = field(default_factory=EngineSnapshot)

    async def generate(self, request_id, prompt_ids, sampling):
        self.calls.append((list(prompt_ids), sampling))
        self.unfinished.add(request_id)
        self.started.set()
        for i, (text, n) in enumerate(self.steps):
            await asyncio.sleep(self.delay)
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("boom")
            last = i == len(self.steps) - 1
            metrics = SimpleNamespace(histogram=[1, 1, 0, 0, 0, 0], num_draft_tokens=10) if last else None
            out = SimpleNamespace(text=text, token_ids=list(range(n)), finish_reason="length" if last else None, spec_decode_metrics=metrics)
            yield SimpleNamespace(outputs=[out])
        self.unfinished.discard(request_id)

    async def abort(self, request_id):
        self.aborted.append(request_id)
        self.unfinished.discard(request_id)

    def can_switch_to(self, spec: SpecConfig) -> bool:
        return spec == self.spec

    def shutdown(self):
        self.dead = True


@dataclass
class Api:
    http: HttpServer
    serving: OpenAIServing
    engine: FakeEngine
    service: CompletionService
    manager: EngineManager

    def client(self, api_key: str = "none") -> openai.AsyncOpenAI:
        # No retries: a 429 or 503 must reach the test as it was sent.
        return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{self.http.port}/v1", api_key=api_key, max_retries=0, timeout=30)

    async def raw(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
        """One HTTP/1.1 request on a plain socket; (status, JSON body)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.http.port)
        head = {"Host": "127.0.0.1", "Connection": "close", **(headers or {})}
        if body is not None:
            head["Content-Length"] = str(len(body))
        writer.write(f"{method} {path} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n" + (body or b""))
        await writer.drain()
        data = await reader.read()
        writer.close()
        status_line, _, rest = data.partition(b"\r\n")
        payload = rest.partition(b"\r\n\r\n")[2]
        return int(status_line.split()[1]), json.loads(payload) if payload else {}


async def start_api(engine: FakeEngine | None = None, start_engine: bool = True, **settings) -> Api:
    cfg = load_config(env={})
    cfg.http.port = 0
    for dotted, value in settings.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    engine = engine or FakeEngine()

    async def factory(cfg, spec, live=False):
        return engine

    manager = EngineManager(cfg, engine_factory=factory)
    service = CompletionService(cfg, manager, Telemetry("embedded"))
    if start_engine:
        await manager.start(SPEC)
    serving = OpenAIServing(cfg, service, Auth.from_config(cfg))
    http = HttpServer(cfg, build_app(serving))
    await http.start()
    return Api(http, serving, engine, service, manager)


async def stop_api(api: Api) -> None:
    await api.http.stop()
    await api.manager.stop()


async def until(pred, timeout: float = 10.0) -> bool:
    """Poll for a condition; the deadline only bounds a hang, it is not what is tested."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if pred():
            return True
        await asyncio.sleep(0.01)
    return pred()


@pytest.fixture
async def api():
    a = await start_api()
    yield a
    await stop_api(a)


# --- translation (no server) -------------------------------------------------


def test_prompt_alone_is_raw_and_suffix_makes_fim():
    raw = completion_call({"prompt": "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "max_tokens": 8, "stop": "\n"})
    assert raw.req.raw_prompt and not raw.req.HasField("suffix")
    assert list(raw.req.stop) == ["\n"] and raw.req.max_tokens == 8 and not raw.stream
    fim = completion_call({"prompt": ["def f("], "suffix": "", "temperature": 0.5, "top_p": 0.9, "seed": 3})
    assert not fim.req.raw_prompt and fim.req.HasField("suffix") and fim.req.prefix == "def f("
    assert fim.req.temperature == 0.5 and fim.req.seed == 3


def test_chat_renders_chatml_and_prefers_max_completion_tokens():
    call = chat_call({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 5, "max_completion_tokens": 7})
    assert call.req.raw_prompt and call.chat
    assert call.req.prefix == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert call.req.max_tokens == 7 and call.names["max_tokens"] == "max_completion_tokens"


def test_session_is_the_grpc_requests_session():
    # With replicas, the routing key (docs/scaling.md); left out, the server makes one.
    assert completion_call({"prompt": "x", "session": "alice/repo"}).req.session == "alice/repo"
    assert chat_call({"messages": [{"role": "user", "content": "hi"}], "session": "s"}).req.session == "s"
    assert completion_call({"prompt": "x"}).req.session == ""


# --- completions over HTTP ---------------------------------------------------------


async def test_completion_body_usage_and_figures(api):
    r = await api.client().completions.create(model="embedded", prompt="x = ", max_tokens=16, temperature=0.5, stop=["\n\n", "#"])
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == "embedded"
    assert r.choices[0].text == "def f():" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens == r.usage.prompt_tokens + 6
    qd = r.model_extra["quickdraft"]
    assert qd["speculative"]["num_drafts"] == 2 and qd["speculative"]["mean_acceptance_length"] == pytest.approx(1.5)
    assert qd["request_id"] == r.id.removeprefix("cmpl-")
    ids, sampling = api.engine.calls[-1]
    assert sampling.max_tokens == 16 and sampling.temperature == 0.5 and sampling.stop == ["\n\n", "#"]
    assert ids == TOKENIZER.encode("x = ", add_special_tokens=False)


async def test_raw_prompt_keeps_control_tokens_and_suffix_is_rendered(api):
    c = api.client()
    await c.completions.create(model="embedded", prompt="<|fim_prefix|>a = <|fim_suffix|>\n<|fim_middle|>", max_tokens=4)
    assert VOCAB["<|fim_middle|>"] in api.engine.calls[-1][0], "an editor's own FIM template must reach the model as control tokens"
    await c.completions.create(model="embedded", prompt="a = ", suffix="\nprint(a)\n", max_tokens=4)
    ids = api.engine.calls[-1][0]
    assert ids[0] == VOCAB["<|fim_prefix|>"] and ids[-1] == VOCAB["<|fim_middle|>"] and VOCAB["<|fim_suffix|>"] in ids


async def test_stream_chunks_then_usage_chunk(api):
    stream = await api.client().completions.create(model="embedded", prompt="x = ", max_tokens=16, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "def f():"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, None, "length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 6
    assert last.model_extra["quickdraft"]["speculative"]["enabled"]
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


async def test_stream_without_usage_puts_figures_on_the_finish_chunk(api):
    stream = await api.client().completions.create(model="embedded", prompt="x = ", stream=True)
    chunks = [c async for c in stream]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra["quickdraft"]["speculative"]["num_drafts"] == 2
    assert all("quickdraft" not in (c.model_extra or {}) for c in chunks[:-1])


async def test_chat_stream_and_body(api):
    c = api.client()
    r = await c.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant" and r.choices[0].message.content == "def f():"
    assert VOCAB["<|im_start|>"] in api.engine.calls[-1][0]
    stream = await c.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "hi"}], stream=True)
    chunks = [x async for x in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(x.choices[0].delta.content or "" for x in chunks) == "def f():"
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].object == "chat.completion.chunk"


async def test_an_oversized_prompt_completes_and_says_what_was_cut(api):
    limit = api.serving.cfg.max_prompt_tokens()
    c = api.client()
    r = await c.completions.create(model="embedded", prompt="x = 1\n" * 3000 + "y = ", max_tokens=4)  # over max_prompt_chars too
    fit = r.model_extra["quickdraft"]["prompt_fit"]
    assert fit["truncated"] and fit["prefix_chars_cut"] > 0 and fit["prompt_tokens_cut"] > 0
    ids = api.engine.calls[-1][0]
    assert len(ids) == r.usage.prompt_tokens <= limit
    assert TOKENIZER.decode(ids).endswith("x = 1\ny = "), "the text nearest the cursor is kept"
    stream = await c.completions.create(model="embedded", prompt="a = 1\n" * 2000, suffix="print(a)\n" * 1000, max_tokens=4, stream=True)
    chunks = [x async for x in stream]
    fit = chunks[-1].model_extra["quickdraft"]["prompt_fit"]
    assert fit["prefix_chars_cut"] > 0 and fit["suffix_chars_cut"] > 0
    ids = api.engine.calls[-1][0]
    assert len(ids) <= limit and ids[0] == VOCAB["<|fim_prefix|>"] and ids[-1] == VOCAB["<|fim_middle|>"]
    small = await c.completions.create(model="embedded", prompt="x = ", max_tokens=4)
    assert small.model_extra["quickdraft"]["prompt_fit"] == {"truncated": False, "prefix_chars_cut": 0, "suffix_chars_cut": 0,
                                                             "context_files_dropped": 0, "prompt_tokens_cut": 0}


async def test_strict_prompts_and_chats_over_the_budget_are_refused_naming_why(api):
    c = api.client()
    with pytest.raises(openai.BadRequestError) as err:
        await c.completions.create(model="embedded", prompt="1," * 2000, max_tokens=4, extra_body={"strict_prompt": True})
    message = err.value.body["message"]
    assert err.value.param == "prompt" and message.startswith("prompt: ")
    assert "limits.max_prompt_tokens" in message and "strict_prompt is set" in message
    # A chat is the client's own rendering (control tokens): the server does not cut it.
    with pytest.raises(openai.BadRequestError) as err:
        await c.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "1," * 2000}], max_tokens=4)
    assert err.value.param == "messages" and "control tokens" in err.value.body["message"]
    assert not api.engine.calls


async def test_models_and_health(api):
    models = await api.client().models.list()
    assert [m.id for m in models.data] == ["embedded"]
    status, body = await api.raw("GET", "/health")
    assert status == 200 and body == {"status": "serving"}


async def test_health_is_503_until_the_engine_serves():
    a = await start_api(start_engine=False)
    try:
        assert (await a.raw("GET", "/health"))[0] == 503
        with pytest.raises(openai.InternalServerError) as err:
            await a.client().completions.create(model="embedded", prompt="x")
        assert err.value.status_code == 503 and err.value.code == "UNAVAILABLE"
        await a.manager.start(SPEC)
        assert (await a.raw("GET", "/health"))[0] == 200
    finally:
        await stop_api(a)


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, param",
    [
        (dict(n=2), "n"),
        (dict(best_of=3), "best_of"),
        (dict(logprobs=1), "logprobs"),
        (dict(echo=True), "echo"),
        (dict(prompt=["a", "b"]), "prompt"),
        (dict(prompt=[1, 2, 3]), "prompt"),
        (dict(prompt=""), "prompt"),
        (dict(max_tokens=100000), "max_tokens"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=5), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(stop=["a"] * 100), "stop"),
        (dict(extra_body={"stop": [1]}), "stop"),
        (dict(extra_body={"suffix": 3}), "suffix"),
        (dict(stream_options={"include_usage": True}), "stream_options"),
        (dict(prompt="x = 1\n" * 3000, extra_body={"strict_prompt": True}), "prompt"),
        (dict(extra_body={"strict_prompt": "yes"}), "strict_prompt"),
        (dict(extra_body={"session": ["a"]}), "session"),
    ],
)
async def test_bad_completion_parameters_are_named(api, fields, param):
    kwargs = dict(model="embedded", prompt="x = ", max_tokens=4) | fields
    with pytest.raises(openai.BadRequestError) as err:
        await api.client().completions.create(**kwargs)
    assert err.value.param == param
    assert err.value.body["message"].startswith(param) or param in err.value.body["message"]
    assert err.value.type == "invalid_request_error" and err.value.code == "INVALID_ARGUMENT"
    assert not api.engine.calls, "a refused request must not reach the engine"


@pytest.mark.parametrize(
    "fields, param",
    [
        (dict(messages=[]), "messages"),
        (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
        (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "messages[0].content"),
        (dict(max_completion_tokens=100000), "max_completion_tokens"),
        (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (dict(n=3), "n"),
    ],
)
async def test_bad_chat_parameters_are_named(api, fields, param):
    kwargs = dict(model="embedded", messages=[{"role": "user", "content": "hi"}]) | fields
    with pytest.raises(openai.BadRequestError) as err:
        await api.client().chat.completions.create(**kwargs)
    assert err.value.param == param


async def test_request_id_header_is_used_and_checked(api):
    c = api.client()
    raw = await c.completions.with_raw_response.create(model="embedded", prompt="x = ", extra_headers={"X-Request-Id": "editor-42"})
    assert raw.headers["x-request-id"] == "editor-42" and raw.parse().id == "cmpl-editor-42"
    with pytest.raises(openai.BadRequestError) as err:
        await c.completions.create(model="embedded", prompt="x = ", extra_headers={"X-Request-Id": "x" * 200})
    assert "X-Request-Id" in err.value.message


async def test_unknown_model_is_404(api):
    with pytest.raises(openai.NotFoundError) as err:
        await api.client().completions.create(model="gpt-4", prompt="x")
    assert err.value.param == "model" and "embedded" in err.value.message


async def test_malformed_bodies_and_unknown_paths_have_the_openai_shape(api):
    for method, path, body, status in [
        ("POST", "/v1/completions", b"{not json", 400),
        ("POST", "/v1/completions", b"[1, 2]", 400),
        ("GET", "/v1/nope", None, 404),
        ("GET", "/v1/completions", None, 405),
    ]:
        got, payload = await api.raw(method, path, body, {"Content-Type": "application/json"})
        assert got == status, (path, payload)
        assert set(payload["error"]) == {"message", "type", "param", "code"}
    # Refused on its Content-Length, before the body is read.
    got, payload = await api.raw("POST", "/v1/completions", None, {"Content-Length": str(api.serving.max_body + 1), "Content-Type": "application/json"})
    assert got == 413 and "max_request_bytes" in payload["error"]["message"]


async def test_engine_failure_mid_stream_is_an_error_event():
    a = await start_api(FakeEngine(fail_after=1))
    try:
        stream = await a.client().completions.create(model="embedded", prompt="x = ", stream=True)
        got = []
        with pytest.raises(openai.APIError) as err:
            async for chunk in stream:
                got.append(chunk.choices[0].text)
        assert got == ["def"] and "generation failed" in err.value.message
    finally:
        await stop_api(a)


# --- hostile bodies (in process) ---------------------------------------------------------------

JSON = {"Content-Type": "application/json"}


def asgi(api: Api, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    """The app without sockets; what the app raises reaches the test."""
    transport = httpx.ASGITransport(app=api.http.app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://quickdraft.test")


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def error_of(r: httpx.Response) -> dict:
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 5_000 + b"]" * 5_000,  # past the interpreter's recursion limit
        b'{"prompt": "x", "user": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_000 + b"}",
        # Just past MAX_DEPTH, in a parameter the server ignores: refused all the same.
        ('{"prompt": "x", "user": ' + nested(MAX_DEPTH) + "}").encode(),
    ],
    ids=["array-5k", "object-5k", "just-past-the-limit"],
)
async def test_deep_nesting_is_a_400_naming_it(api, body):
    async with asgi(api) as c:
        for path in ("/v1/completions", "/v1/chat/completions"):
            r = await c.post(path, content=body, headers=JSON)
            assert r.status_code == 400, r.text
            assert "nested too deeply" in error_of(r)["message"] and str(MAX_DEPTH) in r.json()["error"]["message"]
        # The deepest body allowed still runs (the object itself is the first level).
        r = await c.post("/v1/completions", content=('{"prompt": "x", "max_tokens": 2, "user": ' + nested(MAX_DEPTH - 1) + "}").encode(), headers=JSON)
        assert r.status_code == 200, r.text
    assert len(api.engine.calls) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b"1," * 2_000_000 + b"1]",  # 4 MB: 0.9 s of the event loop to parse, every other stream stalled
        b'{"prompt": "x", "user": [' + b"[]," * 1_000_000 + b"[]]}",
        b'{"prompt": "x", "user": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        b'{"prompt": "x", "stop": [' + b'"\\","\"",' * 100_000 + b'""]}',  # escapes cannot hide strings
    ],
    ids=["ints", "lists", "deep-objects", "escaped-strings"],
)
async def test_a_body_of_too_many_values_is_refused_before_it_is_parsed(api, body, monkeypatch):
    parsed = []
    monkeypatch.setattr("quickdraft.server.openai.json_body.json", SimpleNamespace(loads=lambda *a, **k: parsed.append(1)))
    async with asgi(api) as c:
        r = await c.post("/v1/completions", content=body, headers=JSON)
    assert r.status_code == 400 and f"more than {api.serving.bounds.max_json_values} JSON values" in error_of(r)["message"], r.text
    assert not parsed, "the body was handed to the parser"


def test_the_values_bound_never_undercounts():
    from quickdraft.server.openai.json_body import values_bound

    code = 'def f(a, b):\n    return {"k": [a, b], \'s\': "\\\""}\n' * 2000  # commas, colons, quotes, brackets and escapes in a prompt
    for value in [{"prompt": code, "max_tokens": 5, "stop": ["\n", "\\", '"']},
                  {"messages": [{"role": "user", "content": [{"type": "text", "text": code[:50]}] * 3}] * 200},
                  [[], {}, [1, [2, {"a": [None, True, 1.5e3, -0]}]], "\\\"[,{:"] * 50]:
        for text in (json.dumps(value), json.dumps(value, indent=2), json.dumps(value, ensure_ascii=False)):
            actual = count_values(json.loads(text))
            assert actual <= values_bound(text.encode(), 10**9)
            for limit in (0, actual // 2, actual - 1):  # a body past a limit is known to be past it
                assert values_bound(text.encode(), limit) > limit


def count_values(v) -> int:
    if isinstance(v, dict):
        return 1 + sum(1 + count_values(x) for x in v.values())  # each key, each value
    if isinstance(v, list):
        return 1 + sum(count_values(x) for x in v)
    return 1


async def test_the_largest_plausible_chat_is_within_the_values_limit(api):
    # As many messages and text parts as Bounds lets through, each a full object:
    # never refused for the values they take.
    n = api.serving.bounds.max_prompt_tokens
    parts = [{"type": "text", "text": "x"}] * n
    async with asgi(api) as c:
        for messages in ([{"role": "user", "content": "x"}] * n, [{"role": "user", "content": parts}]):
            r = await c.post("/v1/chat/completions", json={"model": "embedded", "messages": messages, "max_tokens": 2})
            # Served, or refused by the service for its length: either way parsed and translated.
            assert r.status_code == 200 or error_of(r)["param"] == "messages", r.text


@pytest.mark.parametrize("param", ["max_tokens", "temperature", "top_p", "seed", "n", "stream"])
async def test_a_5000_digit_number_is_a_400_naming_the_parameter(api, param):
    body = '{"prompt": "x", "%s": %s}' % (param, "9" * 5000)
    async with asgi(api) as c:
        r = await c.post("/v1/completions", content=body.encode(), headers=JSON)
        assert r.status_code == 400, r.text
        error = error_of(r)
        assert error["param"] == param and "5000-digit number" in error["message"]
        # In a parameter the server ignores, it is ignored like the rest.
        r = await c.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": 2, "user": -%s}' % (b"9" * 5000), headers=JSON)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"prompt": "x", "temperature": NaN}', "NaN is not a JSON number"),
        (b'{"prompt": "x", "top_p": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"prompt": "caf\xe9"}', "not valid UTF-8 (byte 15)"),
        (b'{"prompt": "\xed\xa0\x80"}', "not valid UTF-8"),  # a surrogate, UTF-8 encoded
        (b'\xef\xbb\xbf{"prompt": "x"}', "not valid JSON"),
        ('{"prompt": "x"}'.encode("utf-16"), "not valid UTF-8"),
        (b"", "not valid JSON"),
    ],
)
async def test_bodies_that_are_not_utf8_json_are_400_naming_why(api, body, says):
    async with asgi(api) as c:
        r = await c.post("/v1/completions", content=body, headers=JSON)
    assert r.status_code == 400 and says in error_of(r)["message"], r.text


@pytest.mark.parametrize(
    "path, fields, status, param",
    [
        ("/v1/chat/completions", {"messages": [{"role": ["user"], "content": "x"}]}, 400, "messages[0].role"),
        ("/v1/chat/completions", {"messages": [{"role": {"a": 1}, "content": "x"}]}, 400, "messages[0].role"),
        ("/v1/chat/completions", {"messages": ["hi"]}, 400, "messages[0]"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": {"text": "x"}}]}, 400, "messages[0].content"),
        ("/v1/chat/completions", {"messages": {"role": "user"}}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": [1]}}, 400, "response_format"),
        ("/v1/completions", {"prompt": "x", "model": ["embedded"]}, 400, "model"),
        ("/v1/completions", {"prompt": "x", "model": "\ud800"}, 404, "model"),
        ("/v1/completions", {"prompt": "x", "model": "m" * 100_000}, 404, "model"),
        ("/v1/completions", {"prompt": {"text": "x"}}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "suffix": "\udfff"}, 400, "suffix"),
        ("/v1/completions", {"prompt": "x", "stop": [1, 2]}, 400, "stop"),
        ("/v1/completions", {"prompt": "x", "stop": {"a": 1}}, 400, "stop"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
        ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": [True]}, 400, "stream_options"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"1": [2]}}, 400, "logit_bias"),
    ],
)
async def test_wrong_field_types_are_refused_naming_the_field(api, path, fields, status, param):
    body = json.dumps(fields).encode()  # lone surrogates become JSON escapes ("\\ud800"), as a client sends them
    async with asgi(api) as c:
        r = await c.post(path, content=body, headers=JSON)
    assert r.status_code == status, r.text
    error = error_of(r)
    assert error["param"] == param and error["message"].startswith(param)
    assert len(r.content) < 1000, "an error quotes a client's value briefly, never whole"
    assert not api.engine.calls


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonp"])
async def test_only_json_bodies_are_read(api, content_type):
    # A web page can send these to a local server without a CORS preflight; application/json it cannot.
    headers = {} if content_type is None else {"Content-Type": content_type}
    async with asgi(api) as c:
        r = await c.post("/v1/completions", content=b'{"prompt": "x"}', headers=headers)
        assert r.status_code == 415 and error_of(r)["param"] == "Content-Type", r.text
        r = await c.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": 2}', headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert r.status_code == 200
    assert len(api.engine.calls) == 1


async def test_a_chunked_body_is_refused_once_past_the_limit_not_read_to_its_end(api):
    sent = 0
    chunk = b" " * 65536
    total = 4 * api.serving.max_body

    async def endless():
        nonlocal sent
        while sent < total:
            sent += len(chunk)
            yield chunk

    async with asgi(api) as c:
        r = await c.post("/v1/completions", content=endless(), headers=JSON)  # no Content-Length: chunked
        assert r.status_code == 413 and "max_request_bytes" in error_of(r)["message"]
        assert sent <= api.serving.max_body + len(chunk), "the server read on past its limit"
        # Content-Length that int() cannot read: over any limit, or not a number at all.
        r = await c.post("/v1/completions", content=b"{}", headers={**JSON, "Content-Length": "9" * 5000})
        assert r.status_code == 413 and "max_request_bytes" in error_of(r)["message"]
        r = await c.post("/v1/completions", content=b"{}", headers={**JSON, "Content-Length": b"\xb2"})  # "²": isdigit() but not int()
        assert r.status_code == 400 and error_of(r)["param"] == "Content-Length"


async def test_hostile_counts_are_refused_before_they_are_walked(api):
    for call, body, param, says in [
        (completion_call, {"prompt": "x", "stop": ["a"] * 100_000}, "stop", "100000 stop sequences"),
        (completion_call, {"prompt": [7] * 1_000_000}, "prompt", "a list of 1000000 items"),
        (chat_call, {"messages": [{"role": "user", "content": "x"}] * 100_000}, "messages", "100000 messages"),
        (chat_call, {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 100_000}]}, "messages[0].content", "100000 parts"),
    ]:
        with pytest.raises(ApiError) as err:
            call(body, api.serving.bounds)
        assert err.value.status == 400 and err.value.param == param and says in err.value.message
    async with asgi(api) as c:  # over HTTP, such a body is refused before it is parsed
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}] * 100_000})
    assert r.status_code == 400 and "JSON values" in error_of(r)["message"]


async def test_hostile_bodies_over_a_socket_are_refused_by_name_and_the_server_keeps_serving(api):
    # Through uvicorn, as a client sends them: each was a 500 (an exception in the app) before.
    for body, status, says in [
        (b"[" * 5_000 + b"]" * 5_000, 400, "nested too deeply"),
        (b"[" + b"1," * 2_000_000 + b"1]", 400, "JSON values"),
        (b'{"prompt": "x", "max_tokens": %s}' % (b"9" * 5000), 400, "max_tokens: "),
        (b'{"prompt": "x", "seed": -%s}' % (b"9" * 5000), 400, "seed: "),
        (b'{"prompt": "x", "temperature": NaN}', 400, "NaN"),
        (b'{"messages": [{"role": ["user"], "content": "x"}]}', 400, "messages[0].role: "),
    ]:
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        got, payload = await api.raw("POST", path, body, JSON)
        assert got == status and says in payload["error"]["message"], (body[:60], got, payload)
    assert not api.engine.calls and api.service.admission.open == 0
    r = await api.client().completions.create(model="embedded", prompt="x = ", max_tokens=4)
    assert r.choices[0].text == "def f():"
    assert await api.raw("GET", "/health") == (200, {"status": "serving"})


async def test_models_name_the_model_never_a_filesystem_path(api):
    async with asgi(api) as c:
        r = await c.get("/v1/models")
    assert r.status_code == 200
    assert api.serving.cfg.target_path().startswith("/"), "the embedded model is a local folder: the case that leaked"
    assert api.serving.cfg.target_path() not in r.text and "/" not in r.text
    assert [(m["id"], m["root"]) for m in r.json()["data"]] == [("embedded", "embedded")]


async def test_a_server_bug_is_a_500_in_the_openai_shape(api, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(api.serving, "parse", broken)
    async with asgi(api, raise_app_exceptions=False) as c:
        r = await c.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 500 and error_of(r)["code"] == "INTERNAL" and "RuntimeError" in r.json()["error"]["message"]


async def test_a_client_gone_while_sending_its_body_is_no_server_error(api):
    sent: list[dict] = []
    incoming = iter([{"type": "http.request", "body": b'{"prompt": ', "more_body": True}, {"type": "http.disconnect"}])

    async def receive():
        return next(incoming)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    await api.http.app(scope, receive, send)  # raised ClientDisconnect before
    assert sent[0]["status"] == 499 and not api.engine.calls


# --- client identity behind proxies ---------------------------------------------------------


async def _second_stream_status(a: Api, forwarded: tuple[str, str]) -> int:
    """Open a stream claiming X-Forwarded-For forwarded[0], then another claiming
    forwarded[1], both from loopback, with limits.max_streams_per_client = 1."""
    c = a.client()
    first = await c.completions.create(model="embedded", prompt="x = ", stream=True, extra_headers={"X-Forwarded-For": forwarded[0]})
    await first.__anext__()
    try:
        second = await c.completions.create(model="embedded", prompt="x = ", stream=True, extra_headers={"X-Forwarded-For": forwarded[1]})
    except openai.RateLimitError as e:
        assert "max_streams_per_client" in e.message
        return 429
    finally:
        await first.close()
    await second.close()
    return 200


async def test_a_forged_x_forwarded_for_does_not_change_the_client():
    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: a local
    # user could take any client's name, or a fresh quota per request.
    a = await start_api(FakeEngine(steps=[("a", 1)] * 5000, delay=0.02), **{"limits__max_streams_per_client": 1})
    try:
        assert await _second_stream_status(a, ("10.0.0.1", "10.0.0.2")) == 429, "a forged header made a second client"
    finally:
        await stop_api(a)


async def test_trusted_proxies_name_the_client_they_forward():
    a = await start_api(FakeEngine(steps=[("a", 1)] * 5000, delay=0.02), **{"limits__max_streams_per_client": 1, "http__trusted_proxies": ["127.0.0.0/8"]})
    try:
        assert await _second_stream_status(a, ("10.0.0.1", "10.0.0.2")) == 200, "two clients behind the proxy share one quota"
        assert await until(lambda: a.service.admission.open == 0)
        assert await _second_stream_status(a, ("10.0.0.3", "10.0.0.3")) == 429, "one client behind the proxy got two quotas"
    finally:
        await stop_api(a)


@pytest.mark.parametrize("entry", ["*", "proxy.internal", "10.0.0.0/33", ""])
async def test_trusted_proxies_must_be_addresses(entry):
    cfg = load_config(env={}, overrides={"http.trusted_proxies": json.dumps(["10.0.0.1", entry])})
    cfg.http.port = 0
    with pytest.raises(ConfigError, match=r"http\.trusted_proxies\[1\]"):
        await HttpServer(cfg, app=None).start()  # type: ignore[arg-type]


# --- limits, auth, cancellation ------------------------------------------------------------


async def test_admission_limit_is_429_and_shared_with_the_service():
    a = await start_api(FakeEngine(steps=[("a", 1)] * 5000, delay=0.02), **{"limits__max_concurrent_streams": 1})
    try:
        c = a.client()
        first = await c.completions.create(model="embedded", prompt="x = ", stream=True)
        await first.__anext__()
        with pytest.raises(openai.RateLimitError) as err:
            await c.completions.create(model="embedded", prompt="x = ")
        assert err.value.code == "RESOURCE_EXHAUSTED" and "max_concurrent_streams" in err.value.message
        await first.close()
        assert await until(lambda: a.service.admission.open == 0)
    finally:
        await stop_api(a)


async def test_bearer_token_is_required_when_configured(monkeypatch):
    monkeypatch.setenv("QD_TEST_HTTP_TOKEN", "s3cret")
    a = await start_api(**{"security__auth_token_env": "QD_TEST_HTTP_TOKEN"})
    try:
        for key in ("wrong", "s3cret-and-more"):
            with pytest.raises(openai.AuthenticationError) as err:
                await a.client(key).completions.create(model="embedded", prompt="x = ", max_tokens=2)
            assert err.value.code == "UNAUTHENTICATED"
        with pytest.raises(openai.AuthenticationError):
            await a.client("wrong").models.list()
        assert (await a.raw("POST", "/v1/completions", b'{"prompt": "x"}'))[0] == 401
        assert (await a.raw("GET", "/health"))[0] == 200, "health stays open unless security.health_requires_auth"
        r = await a.client("s3cret").completions.create(model="embedded", prompt="x = ", max_tokens=2)
        assert r.choices[0].text
        assert not a.engine.calls[1:], "only the authorized request reached the engine"
    finally:
        await stop_api(a)


async def test_closing_a_stream_aborts_the_engine_request():
    a = await start_api(FakeEngine(steps=[("a", 1)] * 5000, delay=0.02))
    try:
        stream = await a.client().completions.create(model="embedded", prompt="x = ", stream=True)
        await stream.__anext__()
        assert a.engine.unfinished
        await stream.close()
        assert await until(lambda: not a.engine.unfinished), "the engine still holds the request"
        assert len(a.engine.aborted) == 1 and a.service.admission.open == 0
    finally:
        await stop_api(a)


@pytest.mark.parametrize("stream", [False, True])
async def test_hanging_up_before_any_text_aborts_the_request(stream):
    # The engine never produces a token: only noticing the closed connection can end it.
    a = await start_api(FakeEngine(steps=[("a", 1)], delay=3600))
    try:
        body = json.dumps({"model": "embedded", "prompt": "x = ", "max_tokens": 400, "stream": stream}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", a.http.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        await a.engine.started.wait()
        writer.close()
        assert await until(lambda: a.engine.aborted), "the engine request outlived its client"
        assert not a.engine.unfinished and a.service.admission.open == 0
    finally:
        await stop_api(a)


async def test_taken_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg = load_config(env={})
        cfg.http.port = s.getsockname()[1]
        with pytest.raises(OSError, match="http.port"):
            await HttpServer(cfg, app=None).start()  # type: ignore[arg-type]


def test_made_up_tokens_do_not_escape_the_per_client_limit_without_auth():
    # Without a tokens file a token names no one: every caller is its peer host, so
    # a fresh made-up token per call buys no fresh quota, and one shared token is
    # no longer one quota for the whole team.
    from quickdraft.server.frontend import http_peer_host

    peer = http_peer_host("127.0.0.1")
    without, shared = Auth(None), Auth("s3cret")
    for auth in (without, shared):
        clients = {auth.client(header, peer) for header in ("Bearer a", "Bearer b", "Bearer s3cret", "")}
        assert {c.key for c in clients} == {"ipv4:127.0.0.1"} and {c.user for c in clients} == {"anonymous"}
    assert shared.client("Bearer s3cret", "ipv4:10.0.0.1").key != shared.client("Bearer s3cret", "ipv4:10.0.0.2").key
    assert http_peer_host("::1") == "ipv6:[::1]", "written as gRPC writes peers: one client on both protocols"


async def test_made_up_tokens_get_no_second_stream_over_http():
    a = await start_api(FakeEngine(steps=[("a", 1)] * 5000, delay=0.02), **{"limits__max_streams_per_client": 1})
    try:
        first = await a.client("made-up-1").completions.create(model="embedded", prompt="x = ", stream=True)
        await first.__anext__()
        with pytest.raises(openai.RateLimitError) as err:
            await a.client("made-up-2").completions.create(model="embedded", prompt="x = ", max_tokens=2)
        assert "max_streams_per_client (1)" in err.value.message
        await first.close()
    finally:
        await stop_api(a)


def tokens_file(tmp_path, **users: int | None) -> tuple[str, dict[str, str]]:
    """A tokens file of ``users`` (name=max_streams); (its path, token by user)."""
    from quickdraft.server.auth import TokensFile

    tf = TokensFile()
    tokens = {name: tf.add(name, max_streams=limit) for name, limit in users.items()}
    path = tmp_path / "tokens.toml"
    tf.write(path)
    return str(path), tokens


async def test_each_user_of_a_tokens_file_has_its_own_quota_over_http(tmp_path, caplog):
    path, tokens = tokens_file(tmp_path, alice=1, bob=None)
    a = await start_api(FakeEngine(steps=[("a", 1)] * 5000, delay=0.02), **{"security__auth_tokens_file": path, "limits__max_streams_per_client": 3})
    try:
        first = await a.client(tokens["alice"]).completions.create(model="embedded", prompt="x = ", stream=True)
        await first.__anext__()
        # alice's own limit (1), not limits.max_streams_per_client (3).
        with pytest.raises(openai.RateLimitError) as err:
            await a.client(tokens["alice"]).completions.create(model="embedded", prompt="x = ", max_tokens=2)
        assert "this user's max_streams (1)" in err.value.message
        # The same machine, another user: a quota of its own.
        with caplog.at_level("INFO", logger="quickdraft.requests"):
            second = await a.client(tokens["bob"]).completions.create(model="embedded", prompt="x = ", stream=True)
            assert (await second.__anext__()).choices[0].text
            await second.close()
            await first.close()
            assert await until(lambda: a.service.admission.open == 0)
    finally:
        await stop_api(a)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "user=bob" in logged, "HTTP requests are logged by user, as gRPC's are"
    assert not any(t in logged for t in tokens.values()), "a token in the logs"


async def test_refusals_before_the_service_are_counted_by_user(tmp_path, monkeypatch):
    path, tokens = tokens_file(tmp_path, carol=None)
    a = await start_api(**{"security__auth_tokens_file": path})
    refused = []
    monkeypatch.setattr(a.service.telemetry, "reject", lambda code, latency_class="unknown", user="anonymous": refused.append((code, user)))
    try:
        async with asgi(a) as c:
            r = await c.post("/v1/completions", content=b"{", headers={**JSON, "Authorization": f"Bearer {tokens['carol']}"})
        assert r.status_code == 400 and refused == [("INVALID_ARGUMENT", "carol")]
    finally:
        await stop_api(a)


# --- serving without a network ---------------------------------------------------------------


async def test_serving_runs_a_request_without_a_network():
    cfg = load_config(env={})
    engine = FakeEngine()

    async def factory(cfg, spec, live=False):
        return engine

    manager = EngineManager(cfg, engine_factory=factory)
    serving = OpenAIServing(cfg, CompletionService(cfg, manager, Telemetry("embedded")), Auth(None))
    await manager.start(SPEC)
    try:
        call = serving.parse(b'{"model": "embedded", "prompt": "x = ", "max_tokens": 4}', completion_call, "rid-1")
        body = await serving.start(call, {}, serving.identify({}, "127.0.0.1")).body()
        assert body["id"] == "cmpl-rid-1" and body["choices"][0]["text"] == "def f():"
        chat = serving.parse(b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}', chat_call, None)
        with pytest.raises(ApiError) as err:
            await serving.start(chat, {}, serving.identify({}, None)).body()
        # The service's field (max_tokens) is named as the parameter the client sent.
        assert err.value.param == "max_completion_tokens" and err.value.message.startswith("max_completion_tokens: ")
        assert serving.health({}) == (200, {"status": "serving"})
        serving.service.stop_accepting()
        assert serving.health({}) == (503, {"status": "draining"})
    finally:
        await manager.stop()
