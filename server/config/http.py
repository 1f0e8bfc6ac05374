"""[http]: the OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from quickdraft.server.config.errors import ConfigError


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
    trusted_proxies: list[str] = field(default_factory=list)
    """Reverse proxies (IP addresses or networks, "10.0.0.0/8") whose
    X-Forwarded-For and X-Forwarded-Proto headers are believed: a request from
    one of them counts as the client the header names, for
    limits.max_streams_per_client and logs. Empty: the headers are ignored and a
    client is its connection's address. List only proxies that overwrite the
    header; anyone else listed can pose as any client."""


def trusted_proxy_networks(http: HttpConfig) -> list[str]:
    """http.trusted_proxies checked and normalized ("10.0.0.1" -> "10.0.0.1/32")."""
    out = []
    for i, entry in enumerate(http.trusted_proxies):
        try:
            out.append(str(ipaddress.ip_network(entry.strip(), strict=False)))
        except ValueError:
            raise ConfigError(f"http.trusted_proxies[{i}] = {entry!r}: not an IP address or network; list proxy addresses such as \"10.0.0.5\" or \"10.0.0.0/8\"") from None
    return out
