"""Per-request metrics with replicas: the front end records them from the
stream it relays (``RoutedService._record``), as the series the
single-process service records (server/service.py), since the replicas
export none. Compared here with what the serving replica's own
CompletionService records for the same request, over real QuickdraftReplica
objects with fake engines (tests/replicas/test_replica_control.py). No Ray.
Also: the replicas' front end reloads the tokens file on SIGHUP."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from quickdraft.server.admission import Client
from quickdraft.server.config import load_config
from quickdraft.server.errors import RequestError
from quickdraft.server.replicas.ingress import ReplicaServer, RoutedService
from quickdraft.server.telemetry import Telemetry
from quickdraft.v1 import completion_pb2 as pb
from tests.replicas.test_replica_control import Replicas, config, start_replica
from tests.test_hardening import tokens_file
from tests.test_service import FakeEngine

pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'QuickdraftReplica.__del__' was never awaited:RuntimeWarning")

ALICE = Client("alice", user="alice")
PER_REQUEST = ("gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token", "gen_ai.server.request.duration",
               "gen_ai.client.token.usage", "quickdraft.requests", "quickdraft.tokens.wasted", "quickdraft.speculative.drafts",
               "quickdraft.speculative.accepted_tokens")


def series(reader: InMemoryMetricReader, name: str) -> dict:
    """{attributes: (count, sum) of a histogram, or a counter's value}."""
    data = reader.get_metrics_data()
    out = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        key = tuple(sorted(p.attributes.items()))
                        out[key] = (p.count, p.sum) if hasattr(p, "count") else p.value
    return out


@pytest.fixture()
async def routed(tmp_path):
    """The front end and the replica that serves (r-a), each with its own in-memory reader:
    the replica's is what the single-process service records."""
    cfg = config(tmp_path)
    replicas = [await start_replica(cfg, rid) for rid in ("r-a", "r-b")]
    handle = Replicas(replicas)  # picks r-a
    front, single = InMemoryMetricReader(), InMemoryMetricReader()
    replicas[0].server.service.telemetry = Telemetry(cfg.preset.name, metric_reader=single)
    svc = RoutedService(cfg, handle, Telemetry(cfg.preset.name, metric_reader=front))
    await svc.refresh()
    yield svc, replicas[0], front, single
    for r in handle.replicas.values():
        await r.server.shutdown(0)


async def test_a_routed_completion_records_the_single_process_series(routed):
    svc, replica, front, single = routed
    assert not any(series(front, n) for n in PER_REQUEST)
    req = pb.CompleteRequest(prefix="def f", language_id="python", latency_class=pb.LATENCY_CLASS_CHAT)
    msgs = [m async for m in svc.complete(req, ALICE)]
    assert msgs[-1].final.completion_tokens == 6  # FakeEngine: 1 + 3 + 2 tokens
    for name in PER_REQUEST:
        want, got = series(single, name), series(front, name)
        assert got.keys() == want.keys(), name  # same series: names and attributes
        for key, value in want.items():
            if name == "gen_ai.server.request.duration":
                assert got[key][0] == value[0]  # measured on each side's own clock
            else:
                assert got[key] == pytest.approx(value), (name, key)
    (key, n), = series(front, "quickdraft.requests").items()
    attrs = dict(key)
    assert n == 1 and attrs["quickdraft.finish"] == "length" and attrs["enduser.id"] == "alice"
    assert attrs["quickdraft.latency_class"] == "chat" and attrs["quickdraft.speculative.config"] == replica.server.engines.engine.spec.label()
    assert series(front, "gen_ai.server.time_to_first_token")  # recorded, not only matched when empty


async def test_a_cancelled_routed_completion_counts_as_cancelled(routed):
    svc, replica, front, single = routed
    engine: FakeEngine = replica.server.engines.engine
    engine.steps, engine.delay = [("a", 1)] * 500, 0.01
    seen = 0

    async def consume():
        nonlocal seen
        async for m in svc.complete(pb.CompleteRequest(prefix="x"), ALICE):
            seen += len(m.text)

    task = asyncio.create_task(consume())
    while seen < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # the replica records once its generator closes
        if series(single, "quickdraft.requests"):
            break
        await asyncio.sleep(0.01)
    requests = series(front, "quickdraft.requests")
    assert requests == series(single, "quickdraft.requests")
    assert [dict(k)["quickdraft.finish"] for k in requests] == ["cancelled"]
    ttft = series(front, "gen_ai.server.time_to_first_token")
    assert ttft.keys() == series(single, "gen_ai.server.time_to_first_token").keys() and [c for c, _ in ttft.values()] == [1]
    # No token figures: the replica relays none before its final message (docs/scaling.md).
    assert not series(front, "gen_ai.client.token.usage")


async def test_a_refusal_counts_only_as_a_refusal(routed):
    svc, replica, front, single = routed
    with pytest.raises(RequestError) as err:
        [m async for m in svc.complete(pb.CompleteRequest(prefix="x", latency_class=77), ALICE)]
    assert err.value.code == "INVALID_ARGUMENT"
    assert not series(front, "quickdraft.requests") and not series(single, "quickdraft.requests")
    assert [dict(k)["rpc.grpc.status_code"] for k in series(front, "quickdraft.requests.rejected")] == ["INVALID_ARGUMENT"]


def test_sighup_reloads_the_tokens_file_of_the_replicas_front_end(tmp_path):
    from quickdraft.server.auth import TokensFile

    path, _ = tokens_file(tmp_path, alice={})
    cfg = load_config(env={}, overrides={"replicas.count": "2", "server.port": "0", "telemetry.metrics_port": "0",
                                         "security.auth_tokens_file": str(path)})
    server = ReplicaServer(cfg)
    tf = TokensFile.read(path)
    carol = tf.add("carol")
    tf.write(path)

    async def run() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        server._install_signals()
        try:
            before = server.auth.allows(f"Bearer {carol}")
            # Without a handler SIGHUP would end the test run: fail instead.
            assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN, None)
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(100):
                await asyncio.sleep(0.02)
                if server.auth.allows(f"Bearer {carol}"):
                    break
            return before, server.auth.allows(f"Bearer {carol}")
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    try:
        assert asyncio.run(run()) == (False, True)
    finally:
        server.telemetry.shutdown()
