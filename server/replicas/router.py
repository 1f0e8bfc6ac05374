"""Ray Serve's side of the routing: a RequestRouter that ranks replicas with
the policy of server/replicas/routing.py.

Ray Serve runs it inside the front end's DeploymentHandle. It reads the
session key from the call's ``session`` keyword argument and each replica's
load from the stats the replica reports (``QuickdraftReplica.record_routing_stats``,
every ``replicas.stats_period_s``). Ray then sends the request to the first
replica of the first rank whose queue is below its ``max_ongoing_requests``,
and drops dead replicas from the candidates.
"""

from __future__ import annotations

from typing import List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from quickdraft.server.replicas.routing import ReplicaLoad, rank_replicas


class SessionRouter(RequestRouter):
    """Session affinity with load-aware spill-over (routing.rank_replicas)."""

    def initialize_state(self, spill_ttft_ms: float = 0.0, **kwargs) -> None:
        # Called by Ray with RequestRouterConfig.request_router_kwargs.
        self.spill_ttft_ms = spill_ttft_ms

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        session = ""
        if pending_request is not None:
            session = str((pending_request.kwargs or {}).get("session") or "")
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = [ReplicaLoad.from_stats(rid, r.routing_stats) for rid, r in by_id.items()]
        ranks = rank_replicas(session, loads, getattr(self, "spill_ttft_ms", 0.0))
        return [[by_id[rid] for rid in rank] for rank in ranks]
