"""Which replica serves a request: the routing policy, in plain Python (no Ray).

A session (user + repository) has a home replica, found by rendezvous
hashing over the replicas that exist: every router computes the same home
with no shared state, and when a replica goes away only its own sessions
move (each to the replica that ranks second for it); the others keep their
prefix caches. The home is left for the least loaded other replica while it
is saturated: its open streams at its limit, or its predicted inline TTFT
over the spill threshold. The answer is a list of ranks for Ray Serve's
RequestRouter (server/replicas/router.py): Ray tries the first rank, and the
next when every replica of a rank has a full queue.

A replica's stats carry the time it took them (``reported_at``); stats older
than ``STALE_PERIODS`` report periods count as unknown (serving, idle): a
replica that stopped reporting is not skipped for a load it may no longer
have, and its sessions still go home (Ray drops it once it is dead).

``replicas.routing = "round_robin"`` (``round_robin_ranks``) ignores sessions
and load: the baseline session routing is measured against.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from quickdraft.server.admission import Client
from quickdraft.server.config.replicas import ROUTING_MODES

# Stats older than this many report periods are not trusted for load (the
# replica may be gone or stuck); its sessions still go home. Ray asks every
# period (with jitter) and a busy replica answers late, hence several periods.
STALE_PERIODS = 5.0

SESSION, ROUND_ROBIN = ROUTING_MODES  # replicas.routing


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows of one replica (its last routing stats)."""

    replica_id: str
    open_streams: int = 0
    max_streams: int = 0
    """0: unknown (no stats yet)."""
    predicted_ttft_ms: float = 0.0
    """0: unknown."""
    serving: bool = True
    """False while its engine starts, restarts or drains."""

    @classmethod
    def from_stats(cls, replica_id: str, stats: Mapping[str, object] | None, max_age_s: float = 0.0,
                   now: float | None = None) -> "ReplicaLoad":
        """From a replica's ``routing_stats()`` dict. No stats (not reported
        yet), or stats whose ``reported_at`` (wall clock) is older than
        ``max_age_s`` (0: no limit), count as serving and idle."""
        s = stats or {}
        if max_age_s > 0 and s:
            reported_at = float(s.get("reported_at", 0.0) or 0.0)
            if (time.time() if now is None else now) - reported_at > max_age_s:
                s = {}
        return cls(replica_id, int(s.get("open_streams", 0) or 0), int(s.get("max_streams", 0) or 0),
                   float(s.get("predicted_ttft_ms", 0.0) or 0.0), bool(s.get("serving", True)))

    def saturated(self, spill_ttft_ms: float) -> bool:
        if self.max_streams and self.open_streams >= self.max_streams:
            return True
        # An idle replica serves at once whatever it predicts: otherwise one whose
        # prediction is over the threshold would get no request to measure and
        # correct it by, and its sessions would pile onto the others for good.
        return spill_ttft_ms > 0 and self.open_streams > 0 and self.predicted_ttft_ms > spill_ttft_ms

    def load(self) -> tuple[float, float]:
        """Ordering key, least loaded first: share of its stream limit in use, then predicted TTFT."""
        share = self.open_streams / self.max_streams if self.max_streams else 0.0
        return share, self.predicted_ttft_ms


def session_key(session: str, client: Client | str, repo_name: str) -> str:
    """The routing key of a request: the client's own ``session`` field when
    set, else the authenticated user (else the peer) and the repository."""
    if session:
        return session
    who = client.key if isinstance(client, Client) else client
    return f"{who}/{repo_name}"


def affinity(session: str, replica_id: str) -> bytes:
    """Rendezvous (highest random weight) score of a replica for a session."""
    return hashlib.blake2b(f"{session}\x00{replica_id}".encode(), digest_size=8).digest()


def home_order(session: str, replica_ids: Sequence[str]) -> list[str]:
    """Replica ids by preference for this session: its home first."""
    return sorted(replica_ids, key=lambda rid: affinity(session, rid), reverse=True)


def rank_replicas(session: str, replicas: Sequence[ReplicaLoad], spill_ttft_ms: float = 0.0) -> list[list[str]]:
    """Ranks of replica ids for one request, most preferred first.

    With a session: [home], then the other replicas that are not saturated
    (one rank: Ray picks the shortest queue among them), then the saturated
    ones, least loaded first, then those not serving (a last resort: they
    answer UNAVAILABLE, which the front end retries elsewhere). Without a
    session: every serving replica in one rank (least loaded wins).
    """
    serving = [r for r in replicas if r.serving]
    down = [r.replica_id for r in sorted(replicas, key=ReplicaLoad.load) if not r.serving]
    if not session:
        return [rank for rank in ([r.replica_id for r in serving], down) if rank]
    by_id = {r.replica_id: r for r in serving}
    order = [by_id[rid] for rid in home_order(session, list(by_id))]
    free = [r for r in order if not r.saturated(spill_ttft_ms)]
    busy = sorted((r for r in order if r.saturated(spill_ttft_ms)), key=ReplicaLoad.load)
    ranks: list[list[str]] = []
    rest = free
    if free and free[0] is order[0]:  # home is free: it alone first
        ranks.append([free[0].replica_id])
        rest = free[1:]
    if rest:
        ranks.append([r.replica_id for r in sorted(rest, key=ReplicaLoad.load)])
    ranks.extend([r.replica_id] for r in busy)
    if down:
        ranks.append(down)
    return ranks


def round_robin_ranks(turn: int, replicas: Sequence[ReplicaLoad]) -> list[list[str]]:
    """Round-robin ranks for the ``turn``-th request: the serving replicas in
    id order, the one whose turn it is first, the others (one rank: Ray picks
    the shortest queue) when its queue is full, then those not serving."""
    serving = sorted(r.replica_id for r in replicas if r.serving)
    down = sorted(r.replica_id for r in replicas if not r.serving)
    ranks: list[list[str]] = []
    if serving:
        first = serving[turn % len(serving)]
        ranks.append([first])
        rest = [rid for rid in serving if rid != first]
        if rest:
            ranks.append(rest)
    if down:
        ranks.append(down)
    return ranks
