"""Ray Serve's side of the routing: a RequestRouter that ranks replicas with
the policy of server/replicas/routing.py.

Ray Serve runs it inside the front end's DeploymentHandle. It reads the
session key from the call's ``session`` keyword argument and each replica's
load from the stats the replica reports (``QuickdraftReplica.record_routing_stats``,
every ``replicas.stats_period_s``). A call with a ``replica`` keyword argument
goes to that replica while it runs. Ray then sends the request to the first
replica of the first rank whose queue is below its ``max_ongoing_requests``,
and drops dead replicas from the candidates.
"""

from __future__ import annotations

import itertools
from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from quickdraft.server.replicas.routing import (ROUND_ROBIN, SESSION, STALE_PERIODS, ReplicaLoad, rank_replicas,
                                                round_robin_ranks)


class SessionRouter(RequestRouter):
    """Session affinity with load-aware spill-over (routing.rank_replicas), or
    plain round-robin (routing.round_robin_ranks) with ``replicas.routing =
    "round_robin"``."""

    def initialize_state(self, spill_ttft_ms: float = 0.0, routing: str = SESSION, stats_period_s: float = 1.0,
                         **kwargs) -> None:
        # Called by Ray with RequestRouterConfig.request_router_kwargs.
        self.spill_ttft_ms = spill_ttft_ms
        self.routing = routing
        self.max_stats_age_s = STALE_PERIODS * stats_period_s
        self._turns = itertools.count()
        self._last: tuple[object, int] | None = None

    def _turn(self, pending_request: Optional[PendingRequest]) -> int:
        # Ray calls choose_replicas again for the same request while every
        # replica's queue is full: the request keeps its turn.
        if pending_request is not None and self._last is not None and self._last[0] is pending_request:
            return self._last[1]
        turn = next(self._turns)
        self._last = (pending_request, turn)
        return turn

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        kwargs = (pending_request.kwargs or {}) if pending_request is not None else {}
        # A call for one replica (an outcome report: its book is there). One
        # gone goes where any call goes: no replica knows its requests now.
        target = by_id.get(str(kwargs.get("replica") or ""))
        if target is not None:
            return [[target]]
        loads = [ReplicaLoad.from_stats(rid, r.routing_stats, self.max_stats_age_s) for rid, r in by_id.items()]
        if self.routing == ROUND_ROBIN:
            ranks = round_robin_ranks(self._turn(pending_request), loads)
        else:
            ranks = rank_replicas(str(kwargs.get("session") or ""), loads, self.spill_ttft_ms)
        return [[by_id[rid] for rid in rank] for rank in ranks]
