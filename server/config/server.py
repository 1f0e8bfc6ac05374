"""[server]: the gRPC listener and process behaviour."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerConfig:
    """The gRPC listener and process behaviour."""

    host: str = "127.0.0.1"
    """Address to bind. Anything but loopback needs `allow_remote = true`."""
    port: int = 50051
    """gRPC port; 0 picks a free one (printed at start)."""
    allow_remote: bool = False
    """Must be true to bind a non-loopback address: say so on purpose."""
    grace_period_s: float = 10.0
    """On SIGTERM: how long in-flight streams may finish before the exit."""
    max_message_bytes: int = 4 * 1024 * 1024
    """Largest gRPC message accepted or sent."""
    reflection: bool = True
    """gRPC server reflection, so generic tools (grpcurl) can call the API."""
    retire_timeout_s: float = 600.0
    """After a switch to a new engine, how long the old one may finish the
    streams it still holds before it is stopped (they then end with
    UNAVAILABLE). Long enough for any completion; it bounds a stream whose
    client stopped reading."""
    engine_restart: bool = True
    """Restart the engine automatically when it dies."""
    log_level: str = "INFO"
    """Python logging level of the server: DEBUG, INFO, WARNING, ERROR."""
