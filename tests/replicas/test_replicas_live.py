"""Two real replicas of the embedded model behind the front end, on a local Ray.

Opt-in (QUICKDRAFT_REPLICAS_TEST=1, `make test-replicas`): Ray and two CPU
engines take minutes on two cores, over CI's budget.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

pytest.importorskip("ray.serve")
pytestmark = [pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("QUICKDRAFT_REPLICAS_TEST") != "1", reason="set QUICKDRAFT_REPLICAS_TEST=1 (starts Ray and two engines)")]

from quickdraft.client import CompletionClient  # noqa: E402
from quickdraft.server.replicas.routing import home_order  # noqa: E402
from tests.integration.conftest import LoopThread, embedded_config  # noqa: E402

TOKEN = "replica-test-token-0123456789abcdef"
LONG = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    from quickdraft.server.replicas.ingress import ReplicaServer

    token_file = tmp_path_factory.mktemp("tok") / "token"
    token_file.write_text(TOKEN)
    cfg = embedded_config(security__auth_token_file=str(token_file))  # HTTP too, on a free port
    cfg.replicas.count = 2
    cfg.replicas.app_name = f"qd-test-{os.getpid()}"
    cfg.replicas.cpus_per_replica = 0.5
    loop = LoopThread()
    t0 = time.perf_counter()
    server = ReplicaServer(cfg)
    loop.run(server.start(), timeout=900)
    print(f"\nreplicas up in {time.perf_counter() - t0:.1f} s")
    yield server, loop
    loop.run(server.shutdown(2.0), timeout=120)
    loop.stop()
    import ray

    ray.shutdown()


def statuses(server, loop) -> list[dict]:
    loop.run(server.service.refresh(), timeout=60)
    return server.service.statuses


def wait_for(pred, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.25)
    return False


def client(server, token=TOKEN):
    return CompletionClient(f"127.0.0.1:{server.port}", token=token, timeout=120)


def test_auth_through_the_ingress(replicated):
    server, _ = replicated
    with client(server, token=None) as c, pytest.raises(grpc.RpcError) as err:
        c.complete_text(prefix="def f(x):\n    return ", max_tokens=4)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with client(server) as c:
        assert c.complete_text(prefix="def f(x):\n    return ", max_tokens=4).final.completion_tokens > 0


def test_a_session_stays_on_its_replica(replicated):
    server, loop = replicated
    ids = [s["replica_id"] for s in statuses(server, loop)]
    assert len(ids) == 2 and all(ids)
    # Two sessions whose homes differ.
    sessions = [f"user{i}/repo" for i in range(50)]
    a = next(s for s in sessions if home_order(s, ids)[0] == ids[0])
    b = next(s for s in sessions if home_order(s, ids)[0] == ids[1])
    for session, home in ((a, ids[0]), (b, ids[1])):
        before = {s["replica_id"]: s["prefix_cache_queried_tokens"] for s in statuses(server, loop)}
        with client(server) as c:
            for i in range(3):
                c.complete_text(prefix=f"# {session} {i}\ndef add(a, b):\n    return ", max_tokens=4, session=session)
        time.sleep(1.5)  # a replica's counters reach the status poll
        after = {s["replica_id"]: s["prefix_cache_queried_tokens"] for s in statuses(server, loop)}
        grew = [rid for rid in ids if after[rid] > before[rid]]
        assert grew == [home], (session, before, after)


def test_cancel_through_the_ingress_frees_the_replica(replicated):
    server, loop = replicated

    def cancelled() -> int:
        return sum(s.get("finishes", {}).get("cancelled", 0) for s in statuses(server, loop))

    before = cancelled()
    with client(server) as c:
        stream = c.complete(prefix=LONG, max_tokens=400, session="cancel/repo")
        assert next(iter(stream))
        stream.cancel()
    # The replica's request ended as cancelled (aborted in the engine), not by running to its end.
    assert wait_for(lambda: cancelled() == before + 1, 20), statuses(server, loop)
    assert wait_for(lambda: sum(s["open_streams"] for s in statuses(server, loop)) == 0, 20), statuses(server, loop)


def test_an_http_completion_goes_to_its_sessions_replica(replicated):
    import httpx

    server, loop = replicated
    ids = [s["replica_id"] for s in statuses(server, loop)]
    session = next(f"http{i}/repo" for i in range(100) if home_order(f"http{i}/repo", ids)[0] == ids[1])
    url = f"http://127.0.0.1:{server.http.port}"
    assert httpx.get(f"{url}/health").json() == {"status": "serving"}
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    before = {s["replica_id"]: s["prefix_cache_queried_tokens"] for s in statuses(server, loop)}
    r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120,
                   json={"prompt": "def add(a, b):\n    return ", "max_tokens": 4, "session": session})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0, r.text
    time.sleep(1.5)  # a replica's counters reach the status poll
    after = {s["replica_id"]: s["prefix_cache_queried_tokens"] for s in statuses(server, loop)}
    assert [rid for rid in ids if after[rid] > before[rid]] == [ids[1]], (before, after)


def test_a_pin_reaches_both_replicas_outcomes_reach_the_one_that_served_and_each_replica_shows_its_ttft(replicated):
    from quickdraft.server.speculative import SpecConfig
    from quickdraft.v1 import completion_pb2 as pb

    server, loop = replicated
    ids = [s["replica_id"] for s in statuses(server, loop)]
    # One session homed on each replica: a report sent anywhere but where its request ran is unknown there.
    homed = [next(f"visible{i}/repo" for i in range(100) if home_order(f"visible{i}/repo", ids)[0] == rid) for rid in ids]
    with client(server) as c:
        # The setting one replica runs: a live switch at most, no engine rebuilt on two cores.
        label = c.controller_state().replicas[0].state.active.label or c.server_info().speculative.label
        reply = c.pin_speculation(label)
        assert reply.pinned and reply.applied in ("unchanged", "live"), reply
        assert [r.state.pinned for r in c.controller_state().replicas] == [SpecConfig.parse(label).label()] * 2
        assert c.pin_speculation("").applied == "released"
        assert [r.state.pinned for r in c.controller_state().replicas] == ["", ""]

        for i in range(6):  # three inline TTFTs on each: its measured figure
            c.complete_text(prefix=f"# visible {i}\ndef add(a, b):\n    return ", max_tokens=4, session=homed[i % 2],
                            request_id=f"live-{i}")
        shown = [pb.Outcome(request_id=f"live-{i}", kind=pb.OUTCOME_KIND_SHOWN) for i in range(6)]
        got = c.report_outcomes(shown + [pb.Outcome(request_id="live-none", kind=pb.OUTCOME_KIND_SHOWN)], request_id_prefix="live")
        assert (got.recorded, got.unknown_request_ids) == (6, 1), got
        assert c.outcome_stats().total.shown >= 6
        time.sleep(1.5)  # the front end polls the replicas every second
        replicas = c.server_info().replicas
    assert len(replicas) == 2 and all(r.state == "serving" for r in replicas)
    assert any(r.ttft_source == "measured" and r.predicted_ttft_ms > 0 for r in replicas), replicas


def test_killed_replica_in_flight_streams_unavailable_and_waiting_requests_not_lost(replicated):
    import threading

    server, loop = replicated
    sts = statuses(server, loop)
    ids = [s["replica_id"] for s in sts]
    victim = sts[0]
    session = next(f"kill{i}/repo" for i in range(100) if home_order(f"kill{i}/repo", ids)[0] == victim["replica_id"])
    codes: list = []

    def streaming():
        with client(server) as c:
            stream = c.complete(prefix=LONG, max_tokens=400, session=session)
            try:
                for i, _ in enumerate(stream):
                    if i == 0:
                        started.set()
                codes.append("finished")
            except grpc.RpcError as e:
                codes.append(e.code())

    started = threading.Event()
    t = threading.Thread(target=streaming)
    t.start()
    assert started.wait(120)
    os.kill(victim["pid"], signal.SIGKILL)
    # Requests sent right after the kill, before any text: none may be lost.
    with client(server) as c:
        finals = [c.complete_text(prefix=f"x = {i}\n", max_tokens=4, session=session).final for i in range(4)]
    t.join(120)
    print(f"\nafter the kill: {server.service.retried} attempts moved to another replica before streaming")
    assert codes == [grpc.StatusCode.UNAVAILABLE], codes
    assert all(f.completion_tokens > 0 for f in finals)
