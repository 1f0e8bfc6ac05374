"""[replicas]: several engines behind one front end, on Ray Serve (docs/scaling.md)."""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.server.config.errors import ConfigError

# replicas.routing: session affinity (the default) or round-robin (server/replicas/routing.py).
ROUTING_MODES = ("session", "round_robin")


@dataclass
class ReplicasConfig:
    """Engine replicas behind this process's gRPC (and HTTP) front end, routed by session
    (`quickdraft serve --replicas N`, docs/scaling.md). Off by default: one
    engine in this process, no Ray."""

    count: int = 0
    """Engine replicas, each with its own engine and controller, run as a Ray
    Serve deployment; this process keeps the gRPC and HTTP front ends (auth,
    health, TLS) and routes each request by its session. 0: one engine in this
    process, no Ray (the default)."""
    ray_address: str = ""
    """Ray cluster to run the replicas on: "auto" (the cluster this machine
    joined with `ray start`), or "HOST:6379". Empty: start a Ray instance on
    this machine for this process alone."""
    cpus_per_replica: float = 1.0
    """CPUs Ray reserves for each replica (its engine's scheduling, not a
    limit on threads)."""
    gpus_per_replica: float = 0.0
    """GPUs Ray reserves for each replica; Ray shows the replica only those.
    0: engine.tensor_parallel_size when the engine runs on CUDA, none on CPU."""
    routing: str = "session"
    """How a request picks its replica: "session" (a session's requests go to
    its home replica, where its prefix cache is, unless that one is
    saturated: docs/scaling.md) or "round_robin" (every replica in turn,
    sessions and load ignored: the baseline session routing is measured
    against, `quickdraft bench replicas`)."""
    spill_ttft_ms: float = 0.0
    """A replica with streams open whose inline TTFT (its median over the last
    minute, else its controller's prediction) is above this is saturated: its
    sessions' requests go to the least loaded other replica while it stays so.
    0: the controller's inline TTFT limit (controller.slo.ttft_s.inline)."""
    stats_period_s: float = 1.0
    """How often each replica reports its load (open streams, predicted TTFT)
    to the router, seconds."""
    max_attempts: int = 3
    """Replicas tried for one request that has not streamed yet, when a
    replica is gone or answers UNAVAILABLE (engine restarting, draining).
    A stream that already sent text is never moved: it ends with UNAVAILABLE."""
    start_timeout_s: float = 900.0
    """How long the replicas may take to start their engines before the
    server gives up, seconds."""
    app_name: str = "quickdraft"
    """Ray Serve application name: two servers on one Ray cluster need two names."""

    def validate(self) -> None:
        if self.routing not in ROUTING_MODES:
            raise ConfigError(f"replicas.routing = {self.routing!r}: use one of {', '.join(repr(m) for m in ROUTING_MODES)}")
        if self.count < 0:
            raise ConfigError(f"replicas.count = {self.count}: use 0 (one engine, no Ray) or the number of replicas")
        for name in ("cpus_per_replica", "gpus_per_replica", "spill_ttft_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"replicas.{name} = {getattr(self, name)}: must be >= 0")
        if self.stats_period_s <= 0:
            raise ConfigError(f"replicas.stats_period_s = {self.stats_period_s}: must be > 0 seconds")
        if self.max_attempts < 1:
            raise ConfigError(f"replicas.max_attempts = {self.max_attempts}: must be >= 1")
        if self.start_timeout_s <= 0:
            raise ConfigError(f"replicas.start_timeout_s = {self.start_timeout_s}: must be > 0 seconds")
        if not self.app_name.strip():
            raise ConfigError("replicas.app_name is empty: name the Ray Serve application, e.g. \"quickdraft\"")
