"""The OpenAI-compatible HTTP API on the real vLLM engine (embedded model, CPU),
driven by the official openai client: completions streamed and not, FIM,
chat, models, health, errors in OpenAI's shape, and aborts on disconnect."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from tests.integration.test_serve import LONG, wait_until

pytestmark = pytest.mark.engine


@pytest.fixture
def oai(server):
    # No retries: what the server answered is what the test sees.
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.server.http.port}/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c


def http_get(server, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server.http.port}{path}", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def requests_total(server) -> float:
    """quickdraft_requests_total over all labels, from the Prometheus endpoint."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.cfg.telemetry.metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("quickdraft_requests_total{"))


def test_completion_body_with_usage_and_speculative_figures(oai, server):
    before = requests_total(server)
    r = oai.completions.create(model="embedded", prompt=LONG, max_tokens=32)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert r.usage.completion_tokens == 32 and r.usage.prompt_tokens > 10
    qd = r.model_extra["quickdraft"]
    assert 0 < qd["ttft_ms"] < qd["e2e_ms"] and qd["tpot_ms"] > 0
    spec = qd["speculative"]
    assert spec["enabled"] and spec["parallel_drafting"] and spec["num_speculative_tokens"] == 5
    assert spec["num_drafts"] > 0 and spec["mean_acceptance_length"] > 1, "the P-EAGLE drafter should get tokens accepted"
    assert requests_total(server) == before + 1, "HTTP requests count in the same metrics as gRPC's"


def test_stream_is_the_same_text_with_a_usage_chunk(oai):
    whole = oai.completions.create(model="embedded", prompt=LONG, max_tokens=24).choices[0].text
    stream = oai.completions.create(model="embedded", prompt=LONG, max_tokens=24, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 1, "expected several deltas"
    assert "".join(texts) == whole, "greedy streaming must match the non-streamed completion"
    assert chunks[-2].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 24
    assert last.model_extra["quickdraft"]["speculative"]["num_drafts"] > 0


def test_fim_with_suffix_renders_the_same_prompt_as_grpc(oai, client):
    prefix, suffix = "def add(a, b):\n    return ", "\n\n\nprint(add(1, 2))\n"
    r = oai.completions.create(model="embedded", prompt=prefix, suffix=suffix, max_tokens=16)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    grpc_final = client.complete_text(prefix=prefix, suffix=suffix, max_tokens=16).final
    assert r.usage.prompt_tokens == grpc_final.prompt_tokens, "the server renders FIM for both protocols"
    plain = oai.completions.create(model="embedded", prompt=prefix, max_tokens=1)
    assert plain.usage.prompt_tokens < r.usage.prompt_tokens, "without suffix no FIM tokens are added"


def test_chat_completion_and_stream(oai):
    messages = [{"role": "system", "content": "You complete Python."}, {"role": "user", "content": "def fib(n):"}]
    r = oai.chat.completions.create(model="embedded", messages=messages, max_tokens=16)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    chunks = list(oai.chat.completions.create(model="embedded", messages=messages, max_tokens=16, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (r.choices[0].message.content or "")
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_models_and_health(oai, server):
    assert [m.id for m in oai.models.list().data] == ["embedded"]
    assert http_get(server, "/health") == (200, {"status": "serving"})


@pytest.mark.parametrize(
    "fields, param",
    [
        (dict(n=2), "n"),
        (dict(logprobs=2), "logprobs"),
        (dict(echo=True), "echo"),
        (dict(prompt=["a = 1", "b = 2"]), "prompt"),
        (dict(max_tokens=100000), "max_tokens"),
        (dict(temperature=-1), "temperature"),
        (dict(prompt="x = 1\n" * 2000, extra_body={"strict_prompt": True}), "prompt"),  # unstrict, the server fits it
    ],
)
def test_bad_parameters_get_openai_errors_and_server_keeps_serving(oai, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(**(dict(model="embedded", prompt="x = 1\n", max_tokens=4) | fields))
    assert err.value.param == param and err.value.type == "invalid_request_error"
    assert oai.completions.create(model="embedded", prompt="x = 1\n", max_tokens=2).usage.completion_tokens >= 1


def test_unknown_model_is_not_found(oai):
    with pytest.raises(openai.NotFoundError) as err:
        oai.completions.create(model="gpt-3.5-turbo-instruct", prompt="x")
    assert err.value.param == "model"


def finish_of(server, request_id: str) -> str | None:
    """How the service recorded the request's end (its span), None until it has."""
    for span in server.spans.get_finished_spans():
        attrs = span.attributes or {}
        if attrs.get("quickdraft.request_id") == request_id:
            return attrs.get("quickdraft.finish")
    return None


def test_closing_the_stream_aborts_the_engine_request(oai, server):
    stream = oai.completions.create(model="embedded", prompt=LONG, max_tokens=400, stream=True, extra_headers={"X-Request-Id": "http-close-me"})
    it = iter(stream)
    next(it)
    assert server.engine.num_unfinished() == 1
    stream.close()
    assert wait_until(lambda: server.engine.num_unfinished() == 0), "engine still holds the request of a client that left"
    assert wait_until(lambda: finish_of(server, "http-close-me") is not None)
    # Not run to max_tokens: stopped when the client left.
    assert finish_of(server, "http-close-me") == "cancelled"
    assert wait_until(lambda: server.server.service.admission.open == 0)


def test_seed_sample_request_runs_as_documented(server):
    """docs/http-api.md's request, sent as curl sends it."""
    body = json.dumps({"model": "embedded", "prompt": "def fib(n):", "max_tokens": 32}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.server.http.port}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    assert out["object"] == "text_completion" and out["model"] == "embedded"
    assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] <= 32
