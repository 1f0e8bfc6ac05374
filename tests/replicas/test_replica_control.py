"""Pins, outcome reports, outcome stats and controller state through the
replicas' front end (server/replicas/ingress.py), over real QuickdraftReplica
objects (server/replicas/replica.py) with fake engines, called in this
process by a stand-in for Ray's DeploymentHandle. No Ray needed."""

from __future__ import annotations

import asyncio
from typing import Callable

import grpc
import pytest

from quickdraft.client import AsyncCompletionClient, RetryPolicy
from quickdraft.server import engine_manager as em
from quickdraft.server.admission import Client
from quickdraft.server.config import load_config
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import Auth
from quickdraft.server.replicas.ingress import RoutedService, front_end
from quickdraft.server.replicas.replica import QuickdraftReplica
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import Telemetry
from quickdraft.v1 import completion_pb2 as pb
from tests.test_service import FakeEngine

# Ray's graceful shutdown awaits a replica's async __del__; here shutdown() is awaited instead.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'QuickdraftReplica.__del__' was never awaited:RuntimeWarning")

P3 = SpecConfig(True, 3)
ALICE = Client("alice", user="alice")


class Broadcast:
    def __init__(self, calls):
        self.calls = calls

    async def results_async(self, return_exceptions: bool = False):
        return list(await asyncio.gather(*self.calls, return_exceptions=return_exceptions))


class Stream:
    """A streaming handle call: the replica's generator, cancellable."""

    def __init__(self, gen):
        self.gen = gen

    def __aiter__(self):
        return self.gen

    def cancel(self):
        asyncio.ensure_future(self.gen.aclose())


class Method:
    def __init__(self, handle: "Replicas", name: str):
        self.handle = handle
        self.name = name

    def remote(self, *args, **kwargs):
        # As SessionRouter: the replica named by `replica` while it runs, else the policy's choice.
        replica = self.handle.replicas.get(kwargs.get("replica", "")) or self.handle.pick(kwargs)
        self.handle.calls.append((self.name, replica.replica_id))
        result = getattr(replica, self.name)(*args, **kwargs)
        return Stream(result) if self.name == "complete" else result


class Replicas:
    """Stands in for the DeploymentHandle over in-process replicas."""

    def __init__(self, replicas: list[QuickdraftReplica]):
        self.replicas = {r.replica_id: r for r in replicas}
        self.pick: Callable[[dict], QuickdraftReplica] = lambda kwargs: next(iter(self.replicas.values()))
        self.calls: list[tuple[str, str]] = []

    def options(self, **_):
        return self

    def broadcast(self, method: str, *args, **kwargs) -> Broadcast:
        return Broadcast([getattr(r, method)(*args, **kwargs) for r in self.replicas.values()])

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)


def config(tmp_path):
    return load_config(env={}, overrides={
        "replicas.count": "2", "server.port": "0", "telemetry.metrics_port": "0", "http.enabled": "false",
        "controller.enabled": "true", "controller.profile_dir": str(tmp_path), "controller.decide_every_s": "3600"})


async def start_replica(cfg, replica_id: str) -> QuickdraftReplica:
    async def factory(cfg, spec, live=False):
        return FakeEngine(spec, live=live)

    replica = QuickdraftReplica.__new__(QuickdraftReplica)  # Ray awaits the async __init__ itself
    await QuickdraftReplica.__init__(replica, cfg, engine_factory=factory)
    replica.replica_id = replica_id
    return replica


@pytest.fixture()
async def routed(tmp_path):
    cfg = config(tmp_path)
    replicas = [await start_replica(cfg, rid) for rid in ("r-a", "r-b")]
    handle = Replicas(replicas)
    svc = RoutedService(cfg, handle, Telemetry("test"))
    await svc.refresh()
    yield svc, handle, cfg
    for r in handle.replicas.values():
        await r.server.shutdown(0)


def pins(handle: Replicas) -> dict[str, SpecConfig | None]:
    return {rid: r.server.pin.pinned for rid, r in handle.replicas.items()}


def specs(handle: Replicas) -> dict[str, SpecConfig]:
    return {rid: r.server.engines.engine.spec for rid, r in handle.replicas.items()}


async def test_a_pin_reaches_every_replica_through_the_front_end_and_so_does_its_release(routed):
    svc, handle, cfg = routed
    assert all(s.parallel and s != P3 for s in specs(handle).values())
    server = front_end(cfg, svc, Auth.from_config(cfg))
    port = await server.start()
    try:
        async with AsyncCompletionClient(f"127.0.0.1:{port}", retry=RetryPolicy(max_attempts=1)) as c:
            reply = await c.pin_speculation("p3")
            assert (reply.pinned, reply.applied, reply.config.label) == (True, "live", "parallel K=3")
            assert specs(handle) == {"r-a": P3, "r-b": P3} and pins(handle) == {"r-a": P3, "r-b": P3}
            state = await c.controller_state()
            assert [(r.replica_id, r.state.enabled, r.state.pinned) for r in state.replicas] == [
                ("r-a", True, "parallel K=3"), ("r-b", True, "parallel K=3")]
            assert state.enabled and state.pinned == "parallel K=3"  # a one-controller client reads the first replica's

            reply = await c.pin_speculation("")
            assert (reply.pinned, reply.applied) == (False, "released")
            assert pins(handle) == {"r-a": None, "r-b": None} and svc.pin.pinned is None
            assert [r.state.pinned for r in (await c.controller_state()).replicas] == ["", ""]
    finally:
        await server.stop(0)


async def test_a_pin_one_replica_refuses_fails_naming_it_and_why(routed):
    svc, handle, _ = routed
    handle.replicas["r-b"].server.engines.instant = lambda spec: False  # r-b would need another engine
    with pytest.raises(RequestError) as err:
        await svc.pin.set("p3")
    assert err.value.code == "FAILED_PRECONDITION"
    assert "applied on r-a (live)" in err.value.message and "not on r-b: FAILED_PRECONDITION" in err.value.message
    assert "allow_rebuild" in err.value.message  # r-b's own reason
    assert pins(handle) == {"r-a": P3, "r-b": None}
    # A bad label is refused before any replica sees it.
    handle.calls.clear()
    with pytest.raises(RequestError) as err:
        await svc.pin.set("p3 sideways")
    assert err.value.code == "INVALID_ARGUMENT" and pins(handle) == {"r-a": P3, "r-b": None}


async def test_a_replica_not_serving_then_or_started_later_gets_the_pin_on_a_later_poll(routed, tmp_path):
    svc, handle, cfg = routed
    rb = handle.replicas["r-b"]
    rb.server.engines.state = em.RESTARTING
    applied, _ = await svc.pin.set("p3")  # every serving replica took it: success
    assert applied == "live" and pins(handle) == {"r-a": P3, "r-b": None}
    assert svc.pin.behind() == []  # r-b does not serve: nothing to give it yet

    rb.server.engines.state = em.SERVING
    handle.replicas["r-c"] = await start_replica(cfg, "r-c")  # as Ray replacing a replica
    await svc.refresh()
    assert svc.pin.behind() == ["r-b", "r-c"]
    switches = handle.replicas["r-a"].server.engines.engine.switches
    svc.pin.poll()
    await asyncio.wait_for(svc.pin._task, 10)
    assert pins(handle) == {"r-a": P3, "r-b": P3, "r-c": P3} and set(specs(handle).values()) == {P3}
    assert handle.replicas["r-a"].server.engines.engine.switches == switches  # the one that had it is left alone
    await svc.refresh()
    assert svc.pin.behind() == []


async def test_each_outcome_goes_to_the_replica_that_served_its_request_and_the_stats_add_up(routed):
    svc, handle, _ = routed
    handle.pick = lambda kwargs: handle.replicas["r-b"]
    named = [m async for m in svc.complete(pb.CompleteRequest(request_id="abcd-1", prefix="a"), ALICE)]
    handle.pick = lambda kwargs: handle.replicas["r-a"]
    made = [m async for m in svc.complete(pb.CompleteRequest(prefix="a"), ALICE)]
    made_id = made[-1].final.request_id
    assert named[-1].final.request_id == "abcd-1" and made_id

    # Routed any other way, the replica would not know the request and count it unknown.
    handle.pick = lambda kwargs: handle.replicas["r-b"]
    handle.calls.clear()
    reply = await svc.report_outcomes(pb.ReportOutcomesRequest(request_id_prefix="abcd", outcomes=[
        pb.Outcome(request_id="abcd-1", kind=pb.OUTCOME_KIND_REJECTED, shown_ms=300.0),
        pb.Outcome(request_id=made_id, kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=100.0, accepted_chars=2, suggestion_chars=4),
        pb.Outcome(request_id="abcd-unknown", kind=pb.OUTCOME_KIND_SHOWN)]), ALICE)
    assert (reply.recorded, reply.unknown_request_ids, reply.duplicates) == (2, 1, 0)
    # One call per replica that served; the unknown id goes where the router sends any call.
    assert sorted(handle.calls) == [("report_outcomes", "r-a"), ("report_outcomes", "r-b"), ("report_outcomes", "r-b")]
    books = {rid: r.server.outcomes.stats().total for rid, r in handle.replicas.items()}
    assert (books["r-a"].accepted, books["r-a"].rejected, books["r-b"].accepted, books["r-b"].rejected) == (1, 0, 0, 1)

    # Another user's report of the same id is not related to alice's request.
    reply = await svc.report_outcomes(pb.ReportOutcomesRequest(outcomes=[pb.Outcome(request_id="abcd-1", kind=pb.OUTCOME_KIND_SHOWN)]),
                                      Client("bob", user="bob"))
    assert (reply.recorded, reply.unknown_request_ids) == (0, 1)

    stats = await svc.outcome_stats()
    assert (stats.total.shown, stats.total.accepted, stats.total.rejected, stats.unknown_request_ids) == (2, 1, 1, 2)
    assert stats.total.acceptance_rate == pytest.approx(0.5) and stats.total.mean_shown_ms == pytest.approx(200.0)
    assert sum(g.shown for g in stats.groups) == 2


async def test_a_bad_outcome_is_refused_naming_its_place_in_the_callers_batch(routed):
    svc, handle, _ = routed
    [m async for m in svc.complete(pb.CompleteRequest(request_id="abcd-1", prefix="a"), ALICE)]
    handle.calls.clear()
    with pytest.raises(RequestError) as err:
        await svc.report_outcomes(pb.ReportOutcomesRequest(outcomes=[
            pb.Outcome(request_id="abcd-1", kind=pb.OUTCOME_KIND_SHOWN), pb.Outcome(request_id="other", kind=pb.OUTCOME_KIND_SHOWN),
            pb.Outcome(request_id="abcd-1", kind=pb.OUTCOME_KIND_REJECTED, shown_ms=-1.0)]), ALICE)
    assert err.value.code == "INVALID_ARGUMENT" and err.value.message.startswith("outcomes[2].shown_ms")
    assert handle.calls == []  # nothing counted anywhere


def test_the_router_sends_a_call_for_one_replica_there_while_it_runs():
    pytest.importorskip("ray.serve")
    from tests.replicas.test_router import choose, replica, router

    reps = [replica("r-a"), replica("r-b")]
    for routing in ("session", "round_robin"):
        r = router(routing=routing)
        assert choose(r, reps, pending=_pending(replica="r-b")) == [["r-b"]]
        # Gone: routed as any call (the outcomes are unknown wherever they go).
        assert sorted(sum(choose(r, reps, pending=_pending(replica="r-gone")), [])) == ["r-a", "r-b"]


def _pending(**kwargs):
    from types import SimpleNamespace

    return SimpleNamespace(kwargs=kwargs)
