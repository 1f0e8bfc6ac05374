"""RoutedService (server/replicas/ingress.py) with a fake DeploymentHandle:
retries before the first message, UNAVAILABLE after it, cancellation; the
front end before the replicas run."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve")

from ray.exceptions import ActorDiedError  # noqa: E402

from quickdraft.server.admission import Client  # noqa: E402
from quickdraft.server.config import load_config  # noqa: E402
from quickdraft.server.errors import RequestError  # noqa: E402
from quickdraft.server.replicas.ingress import RoutedService  # noqa: E402
from quickdraft.server.replicas.replica import MESSAGE, refusal  # noqa: E402
from quickdraft.server.telemetry import Telemetry  # noqa: E402
from quickdraft.v1 import completion_pb2 as pb  # noqa: E402

TEXT = (MESSAGE, pb.CompleteResponse(text="x").SerializeToString())
FINAL = (MESSAGE, pb.CompleteResponse(final=pb.CompleteFinal(completion_tokens=1)).SerializeToString())


class FakeCall:
    """One streaming handle call: yields ``items``; an exception item is raised."""

    def __init__(self, items, hang: bool = False):
        self.items = list(items)
        self.hang = hang
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.items:
            item = self.items.pop(0)
            if isinstance(item, BaseException):
                raise item
            return item
        if self.hang:
            await asyncio.sleep(3600)
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    def __init__(self, calls):
        self.calls = list(calls)
        self.made: list[FakeCall] = []
        self.sessions: list[str] = []

    def options(self, **_):
        return self

    @property
    def complete(self):
        return self

    def remote(self, payload, client, headers, session=""):
        self.sessions.append(session)
        call = self.calls.pop(0)
        self.made.append(call)
        return call


def service(calls, attempts: int = 3) -> tuple[RoutedService, FakeHandle]:
    cfg = load_config(env={}, overrides={"replicas.count": "2", "replicas.max_attempts": str(attempts)})
    handle = FakeHandle(calls)
    return RoutedService(cfg, handle, Telemetry("test")), handle


async def collect(svc, req=None, client=None):
    return [m async for m in svc.complete(req or pb.CompleteRequest(prefix="a", repo_name="repo"), client or Client("alice", user="alice"))]


async def test_a_replica_gone_before_streaming_is_retried_elsewhere_and_the_session_is_sent():
    svc, handle = service([FakeCall([ActorDiedError()]), FakeCall([refusal(RequestError("UNAVAILABLE", "restarting"))]), FakeCall([TEXT, FINAL])])
    out = await collect(svc)
    assert [m.text for m in out] == ["x", ""] and out[-1].final.completion_tokens == 1
    assert handle.sessions == ["alice/repo"] * 3 and svc.retried == 2
    assert svc.admission.open == 0


async def test_a_replica_gone_mid_stream_ends_unavailable_without_retry():
    svc, handle = service([FakeCall([TEXT, ActorDiedError()]), FakeCall([TEXT, FINAL])])
    got = []
    with pytest.raises(RequestError) as err:
        async for m in svc.complete(pb.CompleteRequest(prefix="a", session="s1"), Client("k")):
            got.append(m)
    assert err.value.code == "UNAVAILABLE" and len(got) == 1 and len(handle.made) == 1
    assert handle.sessions == ["s1"]


async def test_refusals_pass_through_with_their_code_and_attempts_are_bounded():
    svc, _ = service([FakeCall([refusal(RequestError("RESOURCE_EXHAUSTED", "full", {"retry-after-ms": "50"}))])])
    with pytest.raises(RequestError) as err:
        await collect(svc)
    assert err.value.code == "RESOURCE_EXHAUSTED" and err.value.metadata == {"retry-after-ms": "50"}
    svc, _ = service([FakeCall([ActorDiedError()]), FakeCall([ActorDiedError()])], attempts=2)
    with pytest.raises(RequestError) as err:
        await collect(svc)
    assert err.value.code == "UNAVAILABLE"


async def test_a_cancelled_caller_cancels_the_replica_call():
    svc, handle = service([FakeCall([TEXT], hang=True)])
    first = asyncio.Event()

    async def consume():
        async for _ in svc.complete(pb.CompleteRequest(prefix="a"), Client("k")):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.made[0].cancelled and svc.admission.open == 0


async def test_a_finished_call_is_not_cancelled():
    svc, handle = service([FakeCall([TEXT, FINAL])])
    await collect(svc)
    assert not handle.made[0].cancelled


async def test_before_the_replicas_run_requests_are_unavailable():
    svc, _ = service([])
    svc.handle = None
    with pytest.raises(RequestError) as err:
        await collect(svc)
    assert err.value.code == "UNAVAILABLE"


async def test_before_the_replicas_run_the_front_end_answers_controller_state_and_refuses_pins_and_reports_unavailable():
    # With replicas running, tests/replicas/test_replica_control.py.
    import grpc

    from quickdraft.client import AsyncCompletionClient, RetryPolicy
    from quickdraft.server.frontend import Auth
    from quickdraft.server.replicas.ingress import front_end

    cfg = load_config(env={}, overrides={"replicas.count": "2", "server.port": "0"})
    svc = RoutedService(cfg, None, Telemetry("test"))
    server = front_end(cfg, svc, Auth.from_config(cfg))
    port = await server.start()
    try:
        async with AsyncCompletionClient(f"127.0.0.1:{port}", retry=RetryPolicy(max_attempts=1)) as c:
            state = await c.controller_state()
            assert not state.enabled and len(state.replicas) == 0
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.pin_speculation("p3")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and svc.pin.pinned is None
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.pin_speculation("p3 sideways")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.report_outcomes([pb.Outcome(request_id="abcd-1", kind=pb.OUTCOME_KIND_SHOWN)], request_id_prefix="abcd")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # not UNIMPLEMENTED: the LSP bridge keeps reporting
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.outcome_stats()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


def test_each_replica_shows_on_the_front_ends_metrics():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from quickdraft.server.replicas.ingress import ReplicaMetrics

    reader = InMemoryMetricReader()
    statuses = [{"replica_id": "r-a", "serving": True, "open_streams": 3, "predicted_ttft_ms": 120.0, "speculative_config": "parallel K=5",
                 "prefix_cache_queried_tokens": 1000, "prefix_cache_hit_tokens": 400, "node": "n1"},
                {"replica_id": "r-b", "serving": False, "open_streams": 0, "predicted_ttft_ms": 0.0, "node": "n2"}]
    ReplicaMetrics(Telemetry("test", metric_reader=reader), lambda: statuses)

    def points(name):
        data = reader.get_metrics_data()
        out = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        out.update({p.attributes["quickdraft.replica"]: p.value for p in m.data.data_points})
        return out

    assert points("quickdraft.replica.predicted_ttft") == {"r-a": pytest.approx(0.12), "r-b": 0.0}
    assert points("quickdraft.replica.open_streams") == {"r-a": 3, "r-b": 0}
    assert points("quickdraft.replica.serving") == {"r-a": 1, "r-b": 0}
    assert points("quickdraft.replica.prefix_cache.hit_tokens") == {"r-a": 400, "r-b": 0}
    statuses[0]["open_streams"] = 5  # read at each collection, from the last poll
    assert points("quickdraft.replica.open_streams")["r-a"] == 5
