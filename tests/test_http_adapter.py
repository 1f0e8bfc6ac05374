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

import openai
import pytest
from transformers import AutoTokenizer

from quickdraft.server.config import load_config
from quickdraft.server.engine import EngineSnapshot
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.frontend import Auth
from quickdraft.server.openai.api_router import build_app
from quickdraft.server.openai.http_server import HttpServer
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
        (dict(prompt="x = 1\n" * 3000), "prompt"),
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
    got, payload = await api.raw("POST", "/v1/completions", None, {"Content-Length": str(api.serving.max_body + 1)})
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
    from quickdraft.server.frontend import http_peer_host

    peer = http_peer_host("127.0.0.1")
    without, with_auth = Auth(None), Auth("s3cret")
    assert without.client_identity("Bearer a", peer) == without.client_identity("Bearer b", peer) == "ipv4:127.0.0.1"
    assert with_auth.client_identity("Bearer a", peer) != with_auth.client_identity("Bearer b", peer)
    assert http_peer_host("::1") == "ipv6:[::1]", "written as gRPC writes peers: one client on both protocols"


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
        body = await serving.start(call, {}, "127.0.0.1").body()
        assert body["id"] == "cmpl-rid-1" and body["choices"][0]["text"] == "def f():"
        chat = serving.parse(b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}', chat_call, None)
        with pytest.raises(ApiError) as err:
            await serving.start(chat, {}, None).body()
        # The service's field (max_tokens) is named as the parameter the client sent.
        assert err.value.param == "max_completion_tokens" and err.value.message.startswith("max_completion_tokens: ")
        assert serving.health({}) == (200, {"status": "serving"})
        serving.service.stop_accepting()
        assert serving.health({}) == (503, {"status": "draining"})
    finally:
        await manager.stop()
