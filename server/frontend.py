"""What the gRPC and the HTTP front ends share: the bearer token and its
check, the client identity that per-client limits count, and the names each
protocol gives the service's outcomes.

One copy of each, so that a client is the same client on both protocols (one
editor's streams share one quota) and a refusal has the same meaning.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.service import FINISH_REASONS
from quickdraft.wire import bearer

# HTTP status of each gRPC status name the service answers with.
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}
# Finish reasons by enum value, named as vLLM and OpenAI name them.
FINISH_REASON_NAMES: dict[int, str] = {v: k for k, v in FINISH_REASONS.items()}


def http_status(code: str) -> int:
    return HTTP_STATUS.get(code, 500)


def read_auth_token(cfg: QuickdraftConfig) -> str | None:
    """The bearer token clients must send (security.auth_token_file, else the
    security.auth_token_env variable); None: no auth."""
    sec = cfg.security
    if sec.auth_token_file:
        return Path(sec.auth_token_file).expanduser().read_text().strip()
    token = os.environ.get(sec.auth_token_env, "").strip()
    return token or None


class Auth:
    """The bearer-token check of both front ends, and the client identity it implies."""

    def __init__(self, token: str | None):
        self._expected = bearer(token).encode() if token else None

    @classmethod
    def from_config(cls, cfg: QuickdraftConfig) -> "Auth":
        return cls(read_auth_token(cfg))

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, authorization: str) -> bool:
        """Whether the authorization header (or metadata) passes; constant time."""
        if self._expected is None:
            return True
        return hmac.compare_digest(authorization.encode(), self._expected)

    def client_identity(self, authorization: str, peer: str) -> str:
        """Per-client limits key: the token's hash, else the peer's host.

        The token counts only when the server checks tokens: otherwise any client
        could send a fresh made-up token per call and escape its per-client limit.
        """
        if self._expected is not None and authorization:
            return "token:" + hashlib.sha256(authorization.encode()).hexdigest()[:16]
        return peer


def grpc_peer_host(peer: str | None) -> str:
    """gRPC's peer without its port, "ipv4:127.0.0.1:53622" -> "ipv4:127.0.0.1",
    so one editor's many connections count once."""
    return (peer or "unknown").rsplit(":", 1)[0]


def http_peer_host(host: str | None) -> str:
    """An HTTP client's host written as gRPC writes peers, "::1" -> "ipv6:[::1]"."""
    if not host:
        return "unknown"
    return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"
