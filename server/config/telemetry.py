"""[telemetry]: metrics, traces and logs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TelemetryConfig:
    """Metrics, traces and logs."""

    metrics_port: int = 9464
    """Prometheus scrape endpoint (/metrics, our metrics and vLLM's); 0 turns it off."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics endpoint binds; non-loopback needs server.allow_remote."""
    otlp_endpoint: str | None = None
    """OTLP/gRPC collector for traces (e.g. http://127.0.0.1:4317); None: no export."""
    log_source_code: bool = False
    """Opt in to source code in logs and spans. Off: only sizes and hashes."""
    never_shown_grace_s: float = 30.0
    """How long a finished request of a client that reports outcomes may wait
    for its suggestion to be reported shown before its output tokens count as
    never-shown waste (docs/metrics.md). Benchmarks lower it to read the
    waste of each phase soon after it."""
