"""Property-based fuzzing of the gRPC API on the real engine (shared server).

Every generated CompleteRequest gets a stream, or INVALID_ARGUMENT /
RESOURCE_EXHAUSTED whose details name the field or limit; bytes that are not
valid UTF-8 (lone surrogates as they travel in CESU-8/WTF-8) are refused
before they reach the service; and the server keeps serving afterwards.
Bounded: ~100 examples in all, each stream read for a few messages then
cancelled (or run to its end when short).
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quickdraft.client.request import channel_options
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionStub
from tests.integration.test_serve import wait_until
from tests.test_fuzz_requests import BAD_UTF8, MARKER, STRING_FIELDS, _field, assert_refused_for_its_tokens, event, requests, violations

pytestmark = pytest.mark.engine

READ_MESSAGES = 4  # then cancel: bounded time per example
CALL_TIMEOUT = 60.0  # only against hangs


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.address, options=channel_options(64 * 1024 * 1024))
    yield CompletionStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def raw_complete(server):
    channel = grpc.insecure_channel(server.address)
    yield channel.unary_stream("/quickdraft.v1.Completion/Complete", request_serializer=lambda b: b, response_deserializer=pb.CompleteResponse.FromString)
    channel.close()


def call(stub, req: pb.CompleteRequest) -> tuple[str, object]:
    """("stream", final-or-None) or (code name, details)."""
    stream = stub.Complete(req, timeout=CALL_TIMEOUT)
    final = None
    try:
        for i, msg in enumerate(stream):
            if msg.HasField("final"):
                final = msg.final
            if i + 1 >= READ_MESSAGES:
                break
        return "stream", final
    except grpc.RpcError as e:
        return e.code().name, e.details()
    finally:
        stream.cancel()


def assert_contract(server, req: pb.CompleteRequest, outcome: str, detail) -> None:
    expected = violations(req)
    if outcome == "stream":
        assert not expected, f"the server streamed a request that violates {sorted(expected)}"
        event("stream")
        if detail is not None:  # ran to its end within READ_MESSAGES
            assert detail.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
            assert 1 <= detail.prompt_tokens <= server.cfg.max_prompt_tokens()
        return
    event(outcome)
    assert outcome in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"), (outcome, detail)
    assert MARKER not in detail, "error details echoed the caller's code"
    if expected:
        assert any(f in detail for f in expected), f"{outcome} {detail!r} names none of {sorted(expected)}"
    else:
        assert_refused_for_its_tokens(req, detail, server.engine.prompt_tokens, server.cfg)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(req=requests())
@example(req=pb.CompleteRequest(prefix="x", temperature=float("nan")))
@example(req=pb.CompleteRequest(prefix="x", top_p=float("-inf")))
@example(req=pb.CompleteRequest(prefix="x", max_tokens=-1))
@example(req=pb.CompleteRequest(prefix="x", max_tokens=2**31 - 1))
@example(req=pb.CompleteRequest(prefix="x", latency_class=-5))
@example(req=pb.CompleteRequest(prefix="x", stop=[f"s{i}" for i in range(5000)]))
@example(req=pb.CompleteRequest(prefix="x", suffix="", context_files=[pb.ContextFile(path=f"f{i}", content="") for i in range(1000)]))
@example(req=pb.CompleteRequest(prefix="<|endoftext|>" * 50, suffix="<|fim_middle|>", max_tokens=4))
@example(req=pb.CompleteRequest(prefix="\U0010ffff\u202e\ufeff\x00" * 100, max_tokens=4, temperature=1.5, top_p=0.01, seed=2**63 - 1))
@example(req=pb.CompleteRequest(prefix="a" * (2 * 1024 * 1024)))
def test_any_request_streams_or_is_refused_naming_the_field(server, stub, req):
    outcome, detail = call(stub, req)
    assert_contract(server, req, outcome, detail)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(STRING_FIELDS)), bad=st.sampled_from(BAD_UTF8), tail=st.text(st.characters(codec="ascii"), max_size=8))
def test_invalid_utf8_on_the_wire_is_invalid_argument(server, raw_complete, field, bad, tail):
    """Lone surrogates cannot be put in a Python proto string; send them as raw bytes."""
    data = pb.CompleteRequest(prefix="x = 1\n", max_tokens=2).SerializeToString() + _field(field, bad + tail.encode())
    with pytest.raises(grpc.RpcError) as err:
        list(raw_complete(data, timeout=CALL_TIMEOUT))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in err.value.details()


def test_message_over_max_message_bytes_is_resource_exhausted(server, stub):
    limit = server.cfg.server.max_message_bytes
    outcome, detail = call(stub, pb.CompleteRequest(prefix="a" * (limit + 1024)))
    assert outcome == "RESOURCE_EXHAUSTED", (outcome, detail)
    assert str(limit) in detail, detail  # gRPC names the limit: "larger than max (N vs. limit)"


def test_prompt_at_the_context_window_edge_completes(server, stub):
    """A prompt of exactly max_prompt_tokens with a huge max_tokens runs to the end of the window."""
    tok = server.engine.tokenizer
    limit = server.cfg.max_prompt_tokens()
    ids = tok.encode("x = [1, 2, 3]\n" * 400, add_special_tokens=False)[:limit]
    text = tok.decode(ids)
    assert len(tok.encode(text, add_special_tokens=False)) == limit
    stream = stub.Complete(pb.CompleteRequest(prefix=text, raw_prompt=True, max_tokens=server.cfg.limits.max_output_tokens), timeout=CALL_TIMEOUT)
    final = [m.final for m in stream if m.HasField("final")]
    assert final and final[0].prompt_tokens == limit
    assert final[0].prompt_tokens + final[0].completion_tokens <= server.cfg.max_model_len()


def test_server_keeps_serving_after_fuzzing(server, stub):
    """Runs after the fuzzers (file order): health, a normal completion, nothing left in the engine."""
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        assert health.Check(health_pb2.HealthCheckRequest(service="quickdraft.v1.Completion"), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    msgs = list(stub.Complete(pb.CompleteRequest(prefix="def add(a, b):\n    return ", max_tokens=8), timeout=CALL_TIMEOUT))
    assert msgs[-1].HasField("final") and msgs[-1].final.completion_tokens >= 1
    assert wait_until(lambda: server.engine.num_unfinished() == 0, timeout=30)
    assert server.server.service.admission.open == 0
