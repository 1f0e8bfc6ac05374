"""[http]: the OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HttpConfig:
    """OpenAI-compatible HTTP endpoint on the same engine (off by default)."""

    enabled: bool = False
    """Serve /v1/completions, /v1/chat/completions and /v1/models beside gRPC
    (`quickdraft serve --http`)."""
    host: str = "127.0.0.1"
    """Address to bind; non-loopback needs server.allow_remote."""
    port: int = 8000
    """Its own port; 0 picks a free one."""
    served_model_name: str | None = None
    """Model name in /v1/models. None: the preset's name."""
