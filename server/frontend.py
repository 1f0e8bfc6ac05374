"""What the gRPC and the HTTP front ends share: the bearer-token check and the
client it identifies (``server/auth.py``), peer names, and the names each
protocol gives the service's outcomes.

One copy of each, so that a client is the same client on both protocols (one
editor's streams share one quota) and a refusal has the same meaning.
"""

from __future__ import annotations

from quickdraft.server.auth import Auth, Client, read_auth_token
from quickdraft.server.service import FINISH_REASONS

__all__ = ["Auth", "Client", "FINISH_REASON_NAMES", "HTTP_STATUS", "grpc_peer_host", "http_peer_host", "http_status", "read_auth_token"]

# HTTP status of each gRPC status name the service answers with.
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
# Finish reasons by enum value, named as vLLM and OpenAI name them.
FINISH_REASON_NAMES: dict[int, str] = {v: k for k, v in FINISH_REASONS.items()}


def http_status(code: str) -> int:
    return HTTP_STATUS.get(code, 500)


def grpc_peer_host(peer: str | None) -> str:
    """gRPC's peer without its port, "ipv4:127.0.0.1:53622" -> "ipv4:127.0.0.1",
    so one editor's many connections count once."""
    return (peer or "unknown").rsplit(":", 1)[0]


def http_peer_host(host: str | None) -> str:
    """An HTTP client's host written as gRPC writes peers, "::1" -> "ipv6:[::1]"."""
    if not host:
        return "unknown"
    return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"
