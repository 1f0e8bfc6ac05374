"""The gRPC server on the real vLLM engine (embedded model, CPU): streaming,
speculative figures, cancellation, deadlines, bad input, health, server info."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quickdraft.client import AsyncCompletionClient, CompletionClient
from quickdraft.v1 import completion_pb2 as pb

pytestmark = pytest.mark.engine

# Greedy output of the embedded model on this prompt runs to max_tokens.
LONG = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def"
HELD_OUT = Path(__file__).resolve().parents[2] / "bench" / "data" / "heldout_prompts.jsonl"


def heldout(n: int) -> list[dict]:
    rows = [json.loads(line) for line in HELD_OUT.read_text().splitlines()[:n]]
    return [{"prefix": r["prefix"][-1200:], "suffix": (r["suffix"] or "")[:400] if r["suffix"] is not None else None} for r in rows]


def wait_until(pred, timeout=15.0, step=0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def test_streams_deltas_and_final_figures(client):
    stream = client.complete(prefix=LONG, max_tokens=64)
    pieces = list(stream)
    assert len(pieces) > 1, "expected several deltas"
    final = stream.final
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert final.completion_tokens == 64
    assert final.prompt_tokens > 10
    assert 0 < final.ttft_ms < final.e2e_ms
    assert final.tpot_ms > 0
    spec = final.speculative
    assert spec.enabled and spec.parallel_drafting and spec.num_speculative_tokens == 5
    assert spec.num_drafts > 0 and spec.num_draft_tokens == 5 * spec.num_drafts
    assert len(spec.accepted_per_position) == 5
    assert spec.accepted_per_position[0] > 0, "the P-EAGLE drafter should get first tokens accepted"
    assert list(spec.accepted_per_position) == sorted(spec.accepted_per_position, reverse=True)
    assert spec.num_accepted_tokens == sum(spec.accepted_per_position)
    assert spec.mean_acceptance_length == pytest.approx(1 + spec.num_accepted_tokens / spec.num_drafts)
    # Tokens come from prefill (1) plus each verify step's accepted drafts and bonus token.
    assert final.completion_tokens <= 1 + spec.num_drafts + spec.num_accepted_tokens


def test_fim_request_completes(client):
    r = client.complete_text(prefix="def add(a, b):\n    return ", suffix="\n\n\nprint(add(1, 2))\n", max_tokens=16)
    assert r.final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert r.final.completion_tokens >= 1
    assert r.final.request_id


def test_quickdraft_complete_in_a_blank_lines_indentation_does_not_double_it(server, tmp_path, capsys):
    """The README's sample: the server asks from the line's start and drops the
    typed indentation (limits.blank_line_from_line_start), so the answer goes
    right after the 4 spaces."""
    from quickdraft.cli import main

    path = tmp_path / "fib.py"
    path.write_text("def fibonacci(n):\n    ")
    assert main(["complete", f"{path}:2:5", "--server", server.address, "--max-tokens", "16", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    assert text.strip() and not text[0].isspace(), repr(text)


def test_repository_context_is_accepted(client):
    r = client.complete_text(
        prefix="from utils import area\n\nprint(",
        suffix=")\n",
        file_path="main.py",
        repo_name="demo",
        context_files=[("utils.py", "def area(w, h):\n    return w * h\n")],
        max_tokens=8,
    )
    assert r.final.prompt_tokens > 20


def test_server_info_describes_engine_and_limits(client, server):
    info = client.server_info()
    assert info.preset == "embedded"
    assert info.state == "serving"
    assert info.speculative.method == "eagle3" and info.speculative.parallel_drafting
    assert info.speculative.num_speculative_tokens == 5
    assert "drafter-p-eagle" in info.speculative.drafter
    assert "vllm" in info.vllm_version
    assert info.hardware
    assert info.limits.prompt_budget_tokens == 768
    assert info.limits.max_prompt_tokens < 1024
    assert info.limits.chars_per_token > 2
    assert info.prompt_format == "qwen-fim"


def test_client_cancel_aborts_engine_request(client, server):
    stream = client.complete(prefix=LONG, max_tokens=400, request_id="cancel-me")
    it = iter(stream)
    next(it)
    assert server.engine.num_unfinished() == 1
    stream.cancel()
    assert wait_until(lambda: server.engine.num_unfinished() == 0), "engine still holds the cancelled request"
    assert wait_until(lambda: server.engine.snapshot.running == 0)


def test_deadline_aborts_engine_request(server):
    with CompletionClient(server.address) as c:
        with pytest.raises(grpc.RpcError) as err:
            "".join(c.complete(prefix=LONG, max_tokens=400, timeout=0.4))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_until(lambda: server.engine.num_unfinished() == 0)


def test_async_client_cancel_by_breaking_out(server):
    import asyncio

    async def run():
        async with AsyncCompletionClient(server.address) as c:
            got = []
            async for text in c.complete(prefix=LONG, max_tokens=400):
                got.append(text)
                if len(got) == 2:
                    break
            return got

    assert len(asyncio.run(run())) == 2
    assert wait_until(lambda: server.engine.num_unfinished() == 0)


@pytest.mark.parametrize(
    "fields, code, fragment",
    [
        (dict(prefix=""), grpc.StatusCode.INVALID_ARGUMENT, "empty prompt"),
        (dict(prefix="x = 1\n", max_tokens=-3), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
        (dict(prefix="x = 1\n", max_tokens=100000), grpc.StatusCode.INVALID_ARGUMENT, "max_output_tokens"),
        (dict(prefix="x = 1\n", temperature=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
        (dict(prefix="x = 1\n", top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        (dict(prefix="x = 1\n" * 2000, strict_prompt=True), grpc.StatusCode.INVALID_ARGUMENT, "max_prompt_tokens"),
        (dict(prefix="x", stop=["a"] * 1000), grpc.StatusCode.INVALID_ARGUMENT, "max_stop_sequences"),
    ],
)
def test_bad_input_is_named_and_server_keeps_serving(client, fields, code, fragment):
    with pytest.raises(grpc.RpcError) as err:
        client.complete_text(**fields)
    assert err.value.code() == code
    assert fragment in err.value.details()
    assert client.complete_text(prefix="x = 1\n", max_tokens=2).final.completion_tokens >= 1


def test_too_long_prompt_says_its_token_count_in_trailing_metadata(server, client):
    with pytest.raises(grpc.RpcError) as err:
        # About one token per character: over max_prompt_tokens, under max_prompt_chars.
        client.complete_text(prefix="1," * server.cfg.max_prompt_tokens(), strict_prompt=True)
    trailers = dict(err.value.trailing_metadata() or ())
    assert int(trailers["quickdraft-prompt-limit"]) == server.cfg.max_prompt_tokens()
    assert int(trailers["quickdraft-prompt-tokens"]) > int(trailers["quickdraft-prompt-limit"])
    assert trailers["quickdraft-prompt-tokens"] in err.value.details()
    assert "strict_prompt" in err.value.details()


def test_a_whole_file_completes_with_the_cut_reported(server, client):
    """Without strict_prompt a prefix over max_prompt_tokens (and over
    max_prompt_chars) runs on the real engine, cut to fit nearest the cursor."""
    prefix = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(600)) + LONG
    result = client.complete_text(prefix=prefix, suffix="\n", max_tokens=8)
    fit, final = result.prompt_fit, result.final
    assert fit.truncated and fit.prefix_chars_cut > len(prefix) - server.cfg.max_prompt_chars()
    assert not fit.suffix_chars_cut and not fit.context_files_dropped
    assert 0.9 * server.cfg.max_prompt_tokens() <= final.prompt_tokens <= server.cfg.max_prompt_tokens()
    assert final.completion_tokens >= 1 and final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)


def test_unknown_latency_class_is_invalid(client):
    req = pb.CompleteRequest(prefix="x = 1\n", latency_class=77)
    with pytest.raises(grpc.RpcError) as err:
        client.complete_text(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "latency_class" in err.value.details()


def test_invalid_utf8_is_invalid_argument(server):
    channel = grpc.insecure_channel(server.address)
    raw = channel.unary_stream("/quickdraft.v1.Completion/Complete", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    # Field 2 (prefix), length 2, bytes that are not UTF-8.
    with pytest.raises(grpc.RpcError) as err:
        list(raw(b"\x12\x02\xed\xa0"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in err.value.details()
    channel.close()


def test_health_serving(server):
    with grpc.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", "quickdraft.v1.Completion"):
            assert stub.Check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_service(server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name for r in responses for s in r.list_services_response.service]
    assert "quickdraft.v1.Completion" in names


def test_prometheus_endpoint_has_ours_and_vllms(client, server):
    import urllib.request

    client.complete_text(prefix=LONG, max_tokens=8)
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.cfg.telemetry.metrics_port}/metrics", timeout=10).read().decode()
    assert "gen_ai_server_time_to_first_token" in body
    assert "gen_ai_server_time_per_output_token" in body
    assert "quickdraft_speculative_accepted_tokens" in body
    assert "vllm:num_requests_running" in body


def test_source_code_never_in_logs_or_spans(client, server, caplog):
    marker = "QDMARKER_7f3a9c_do_not_log"
    caplog.set_level("DEBUG")
    client.complete_text(prefix=f"# {marker}\ndef f():\n    ", suffix=f"\n# {marker}\n", max_tokens=8)
    assert marker not in caplog.text
    assert any("request" in r.getMessage() for r in caplog.records), "the request log line is missing"
    spans = server.spans.get_finished_spans()
    assert spans, "no spans exported"
    for span in spans:
        assert marker not in json.dumps({k: str(v) for k, v in (span.attributes or {}).items()})
        assert marker not in span.name


def test_trace_context_from_metadata_is_the_parent(server):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    md = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    with CompletionClient(server.address, metadata=md) as c:
        c.complete_text(prefix="x = 1\n", max_tokens=2)
    ids = [format(s.context.trace_id, "032x") for s in server.spans.get_finished_spans()]
    assert trace_id in ids
