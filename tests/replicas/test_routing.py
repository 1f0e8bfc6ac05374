"""The routing policy of server/replicas/routing.py, with plain objects (no Ray)."""

from __future__ import annotations

import pytest

from quickdraft.server.admission import Client
from quickdraft.server.config import ConfigError, load_config
from quickdraft.server.replicas.routing import (ROUND_ROBIN, ROUTING_MODES, SESSION, ReplicaLoad, home_order, rank_replicas,
                                                round_robin_ranks, session_key)

IDS = ["r-a", "r-b", "r-c"]
SESSIONS = [f"user{i}/repo{i % 7}" for i in range(300)]


def loads(**over) -> list[ReplicaLoad]:
    return [over.get(rid, ReplicaLoad(rid, 0, 8)) for rid in IDS]


def home(session: str, replicas: list[ReplicaLoad], spill: float = 0.0) -> str:
    ranks = rank_replicas(session, replicas, spill)
    assert len(ranks[0]) == 1, ranks
    return ranks[0][0]


def test_a_session_always_goes_home_and_sessions_spread():
    homes = {s: home(s, loads()) for s in SESSIONS}
    assert all(home(s, loads()) == homes[s] for s in SESSIONS)
    # Order of the candidates does not matter (every router agrees).
    assert all(home(s, list(reversed(loads()))) == homes[s] for s in SESSIONS)
    counts = {rid: list(homes.values()).count(rid) for rid in IDS}
    assert min(counts.values()) > 60, counts  # 300 sessions, 3 replicas: none starved


def test_saturated_home_spills_to_least_loaded_other_and_comes_back():
    s = SESSIONS[0]
    h = home(s, loads())
    others = [r for r in IDS if r != h]
    busy = {h: ReplicaLoad(h, 8, 8)}  # its stream limit reached
    lighter = {others[0]: ReplicaLoad(others[0], 5, 8), others[1]: ReplicaLoad(others[1], 1, 8)}
    ranks = rank_replicas(s, loads(**busy, **lighter))
    assert ranks[0] == [others[1], others[0]]  # free ones first, least loaded first
    assert ranks[-1] == [h]  # the full home only as a last resort
    assert home(s, loads()) == h  # once it has room again


def test_predicted_ttft_over_the_spill_threshold_counts_as_saturated():
    s = SESSIONS[1]
    h = home(s, loads())
    slow = {h: ReplicaLoad(h, 1, 8, predicted_ttft_ms=900.0)}
    assert h not in rank_replicas(s, loads(**slow), spill_ttft_ms=300.0)[0]
    assert home(s, loads(**slow), spill=0.0) == h  # 0: no TTFT threshold


def test_an_idle_replica_is_never_saturated_by_its_prediction():
    """Every replica predicting over the threshold while idle: each session still
    goes home (it used to pile onto the replica predicting least, for good)."""
    slow_idle = {rid: ReplicaLoad(rid, 0, 8, predicted_ttft_ms=900.0 + i) for i, rid in enumerate(IDS)}
    homes = {s: home(s, loads(**slow_idle), spill=300.0) for s in SESSIONS[:60]}
    assert homes == {s: home(s, loads()) for s in SESSIONS[:60]}
    assert len(set(homes.values())) == len(IDS)


def test_a_dead_replicas_sessions_move_and_only_theirs():
    before = {s: home(s, loads()) for s in SESSIONS}
    dead = "r-b"
    alive = [r for r in loads() if r.replica_id != dead]
    after = {s: home(s, alive) for s in SESSIONS}
    moved = [s for s in SESSIONS if before[s] != after[s]]
    assert moved and all(before[s] == dead for s in moved)
    assert all(after[s] != dead for s in SESSIONS)
    # Each moves to its second choice, so every router moves it to the same place.
    assert all(after[s] == home_order(s, IDS)[1] for s in moved)


def test_a_replica_not_serving_is_a_last_resort():
    s = SESSIONS[2]
    h = home(s, loads())
    ranks = rank_replicas(s, loads(**{h: ReplicaLoad(h, 0, 8, serving=False)}))
    assert h not in ranks[0] and ranks[-1] == [h]


def test_without_a_session_every_serving_replica_is_one_rank():
    assert rank_replicas("", loads()) == [IDS]
    assert rank_replicas("s", []) == []


def test_session_key_from_the_field_else_user_and_repository():
    assert session_key("alice/qd", Client("k"), "other") == "alice/qd"
    assert session_key("", Client("alice", user="alice"), "qd") == "alice/qd"
    assert session_key("", "ipv4:10.0.0.1", "qd") == "ipv4:10.0.0.1/qd"


def test_stats_dict_and_missing_stats():
    r = ReplicaLoad.from_stats("x", {"open_streams": 3, "max_streams": 4, "predicted_ttft_ms": 12.5, "serving": False})
    assert (r.open_streams, r.max_streams, r.predicted_ttft_ms, r.serving) == (3, 4, 12.5, False)
    assert ReplicaLoad.from_stats("y", None) == ReplicaLoad("y")


@pytest.mark.parametrize("setting,value", [("replicas.count", "-1"), ("replicas.max_attempts", "0"),
                                           ("replicas.stats_period_s", "0"), ("replicas.spill_ttft_ms", "-5")])
def test_bad_replica_settings_are_refused_naming_the_setting(setting, value):
    cfg = load_config(env={}, overrides={setting: value})
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        cfg.replicas.validate()


def test_stale_stats_count_as_unknown():
    busy = {"open_streams": 8, "max_streams": 8, "predicted_ttft_ms": 900.0, "serving": False, "reported_at": 100.0}
    fresh = ReplicaLoad.from_stats("x", busy, max_age_s=5.0, now=104.0)
    assert (fresh.open_streams, fresh.serving) == (8, False)
    stale = ReplicaLoad.from_stats("x", busy, max_age_s=5.0, now=106.0)
    assert stale == ReplicaLoad("x")  # serving and idle, as before its first report
    assert ReplicaLoad.from_stats("x", busy, max_age_s=0.0, now=1e9).open_streams == 8  # 0: no limit


def test_a_home_whose_stats_went_stale_gets_its_sessions_back():
    s = SESSIONS[3]
    h = home(s, loads())
    stuck = {"open_streams": 8, "max_streams": 8, "reported_at": 0.0}  # full, long ago
    replicas = [ReplicaLoad.from_stats(rid, stuck if rid == h else {"open_streams": 0, "max_streams": 8, "reported_at": 99.0},
                                       max_age_s=5.0, now=100.0) for rid in IDS]
    assert home(s, replicas) == h


def test_round_robin_takes_every_serving_replica_in_turn_whatever_the_session():
    firsts = [round_robin_ranks(turn, loads())[0] for turn in range(6)]
    assert firsts == [[rid] for rid in IDS * 2]
    assert round_robin_ranks(0, loads())[1] == IDS[1:]  # the others when its queue is full
    down = loads(**{"r-b": ReplicaLoad("r-b", serving=False)})
    assert [round_robin_ranks(t, down)[0] for t in range(4)] == [["r-a"], ["r-c"], ["r-a"], ["r-c"]]
    assert round_robin_ranks(0, down)[-1] == ["r-b"]
    assert round_robin_ranks(0, []) == []


def test_routing_mode_setting():
    assert load_config(env={}, overrides={}).replicas.routing == SESSION
    assert ROUTING_MODES == (SESSION, ROUND_ROBIN)
    cfg = load_config(env={}, overrides={"replicas.routing": "round_robin"})
    cfg.replicas.validate()
    cfg = load_config(env={}, overrides={"replicas.routing": "random"})
    with pytest.raises(ConfigError, match=r"replicas\.routing"):
        cfg.replicas.validate()
