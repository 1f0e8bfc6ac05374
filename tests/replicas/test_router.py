"""SessionRouter (server/replicas/router.py), Ray's side of the policy, with
fake replicas: which setting picks which policy, stale stats, a request's turn."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")

from quickdraft.server.replicas.router import SessionRouter  # noqa: E402
from quickdraft.server.replicas.routing import home_order  # noqa: E402

IDS = ["r-a", "r-b"]


def replica(rid: str, **stats) -> SimpleNamespace:
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=rid), routing_stats=stats)


def router(**kwargs) -> SessionRouter:
    r = SessionRouter.__new__(SessionRouter)  # Ray's own state is not needed to rank
    r.initialize_state(**kwargs)
    return r


def choose(r: SessionRouter, replicas, session: str = "", pending=None) -> list[list[str]]:
    pending = pending or SimpleNamespace(kwargs={"session": session})
    ranks = asyncio.run(r.choose_replicas(replicas, pending))
    return [[x.replica_id.unique_id for x in rank] for rank in ranks]


def test_session_routing_sends_a_session_home_and_skips_a_full_home():
    s = "alice/repo"
    h, other = home_order(s, IDS)
    now = time.time()
    idle = [replica(rid, open_streams=0, max_streams=4, reported_at=now) for rid in IDS]
    r = router(routing="session")
    assert [choose(r, idle, s)[0] for _ in range(3)] == [[h]] * 3
    full = [replica(h, open_streams=4, max_streams=4, reported_at=now), replica(other, open_streams=0, max_streams=4, reported_at=now)]
    assert choose(r, full, s)[0] == [other]


def test_stale_stats_are_ignored_after_stale_periods():
    s = "alice/repo"
    h, other = home_order(s, IDS)
    old = time.time() - 30.0
    full_long_ago = [replica(h, open_streams=4, max_streams=4, reported_at=old), replica(other, reported_at=time.time())]
    assert choose(router(routing="session", stats_period_s=1.0), full_long_ago, s)[0] == [h]
    assert choose(router(routing="session", stats_period_s=10.0), full_long_ago, s)[0] == [other]  # 30 s < 5 periods


def test_round_robin_ignores_the_session_and_a_request_keeps_its_turn():
    r = router(routing="round_robin")
    reps = [replica(rid) for rid in IDS]
    firsts = [choose(r, reps, "alice/repo")[0][0] for _ in range(4)]
    assert firsts == ["r-a", "r-b", "r-a", "r-b"]
    pending = SimpleNamespace(kwargs={"session": "alice/repo"})
    # Ray asks again for a request it could not place (every queue full): same turn.
    assert choose(r, reps, pending=pending)[0] == choose(r, reps, pending=pending)[0] == ["r-a"]
    assert choose(r, reps, "alice/repo")[0] == ["r-b"]
