"""Python clients against a real gRPC server on loopback with a scripted servicer (no engine)."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from quickdraft.client import AsyncCompletionClient, CompletionClient, PlaintextTokenError, RetryPolicy, build_request, is_loopback_target
from quickdraft.client.request import make_credentials
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionServicer, add_CompletionServicer_to_server

FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.001, max_backoff_s=0.002)


class Scripted(CompletionServicer):
    """Fails the first `fail_first` calls with UNAVAILABLE, optionally after sending text."""

    def __init__(self, fail_first: int = 0, text_before_failing: bool = False):
        self.calls = 0
        self.fail_first = fail_first
        self.text_before_failing = text_before_failing
        self.requests: list[pb.CompleteRequest] = []
        self.metadata: list[dict] = []

    async def Complete(self, request, context):
        self.calls += 1
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        if self.calls <= self.fail_first:
            if self.text_before_failing:
                yield pb.CompleteResponse(text="partial")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "engine restarting")
        for piece in ("def ", "f():", " pass"):
            yield pb.CompleteResponse(text=piece)
        yield pb.CompleteResponse(final=pb.CompleteFinal(completion_tokens=3, finish_reason=pb.FINISH_REASON_STOP))

    async def GetServerInfo(self, request, context):
        return pb.ServerInfo(model="scripted")


@pytest.fixture
def serve():
    """Start a scripted servicer on a loopback port in a background loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = []

    def start(servicer):
        async def boot():
            s = grpc.aio.server()
            add_CompletionServicer_to_server(servicer, s)
            port = s.add_insecure_port("127.0.0.1:0")
            await s.start()
            servers.append(s)
            return port

        return asyncio.run_coroutine_threadsafe(boot(), loop).result(10)

    yield start
    for s in servers:
        asyncio.run_coroutine_threadsafe(s.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


def test_streams_text_and_final(serve):
    port = serve(Scripted())
    with CompletionClient(f"127.0.0.1:{port}") as c:
        r = c.complete_text(prefix="x", suffix="y", context_files={"a.py": "1"}, max_tokens=5, stop=["\n"], latency_class="chat")
    assert r.text == "def f(): pass"
    assert r.final.completion_tokens == 3


def test_retries_unavailable_before_the_first_token(serve):
    servicer = Scripted(fail_first=2)
    port = serve(servicer)
    with CompletionClient(f"127.0.0.1:{port}", retry=FAST) as c:
        assert c.complete_text(prefix="x").text == "def f(): pass"
    assert servicer.calls == 3


def test_never_retries_after_text_arrived(serve):
    servicer = Scripted(fail_first=1, text_before_failing=True)
    port = serve(servicer)
    with CompletionClient(f"127.0.0.1:{port}", retry=FAST) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete_text(prefix="x")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls == 1


def test_gives_up_after_max_attempts(serve):
    servicer = Scripted(fail_first=10)
    port = serve(servicer)
    with CompletionClient(f"127.0.0.1:{port}", retry=FAST) as c:
        with pytest.raises(grpc.RpcError):
            c.complete_text(prefix="x")
    assert servicer.calls == FAST.max_attempts


def test_async_client_retries_and_sends_token(serve):
    servicer = Scripted(fail_first=1)
    port = serve(servicer)

    async def run():
        async with AsyncCompletionClient(f"127.0.0.1:{port}", retry=FAST, token="s3cret") as c:
            stream = c.complete(prefix="x")
            text = await stream.text()
            return text, stream.final

    text, final = asyncio.run(run())
    assert text == "def f(): pass" and final.completion_tokens == 3
    assert servicer.metadata[-1]["authorization"] == "Bearer s3cret"


def test_build_request_rejects_unknown_latency_class():
    with pytest.raises(ValueError, match="latency_class"):
        build_request(prefix="x", latency_class="urgent")
    req = build_request(prefix="x", suffix="", temperature=0.2, seed=3)
    assert req.HasField("suffix") and req.temperature == pytest.approx(0.2) and req.seed == 3


# -- a bearer token never travels in plaintext to another machine -------------------

REMOTE_TARGETS = [
    "10.0.0.5:50051",
    "example.com:443",
    "localhost.example.com:50051",
    "0.0.0.0:50051",
    "[2001:db8::1]:50051",
    "dns:///example.com:50051",
    "dns://8.8.8.8/localhost:50051",  # that DNS server decides where "localhost" is
    "ipv4:127.0.0.1:50051,10.0.0.5:50051",  # one remote address is enough
    "xds:///completion",
]
LOOPBACK_TARGETS = [
    "127.0.0.1:50051",
    "127.9.9.9:50051",
    "localhost:50051",
    "[::1]:50051",
    "unix:/tmp/quickdraft.sock",
    "unix-abstract:quickdraft",
    "dns:///localhost:50051",
    "ipv6:[::1]:50051",
]


@pytest.mark.parametrize("target", REMOTE_TARGETS)
@pytest.mark.parametrize("client_cls", [CompletionClient, AsyncCompletionClient])
def test_refuses_a_plaintext_token_to_a_remote_host(target, client_cls):
    # No server anywhere: the check happens at construction, before any connection.
    with pytest.raises(PlaintextTokenError, match=r"without TLS.*TLS.*loopback") as err:
        client_cls(target, token="s3cret")
    assert target in str(err.value)
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("client_cls", [CompletionClient, AsyncCompletionClient])
def test_an_authorization_header_in_metadata_counts_as_a_token(client_cls):
    with pytest.raises(PlaintextTokenError):
        client_cls("10.0.0.5:50051", metadata={"Authorization": "Bearer s3cret"})


def test_plaintext_token_is_allowed_to_loopback_and_tls_or_no_token_anywhere():
    async def construct_and_close(target: str, **kwargs) -> None:
        await AsyncCompletionClient(target, **kwargs).close()

    for target in LOOPBACK_TARGETS:
        assert is_loopback_target(target), target
        CompletionClient(target, token="s3cret").close()
        asyncio.run(construct_and_close(target, token="s3cret"))
    for target in REMOTE_TARGETS:
        assert not is_loopback_target(target), target
        CompletionClient(target).close()  # no token: nothing secret to leak
        CompletionClient(target, token="s3cret", credentials=make_credentials()).close()
        asyncio.run(construct_and_close(target, token="s3cret", credentials=make_credentials()))
