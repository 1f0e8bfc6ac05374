"""[security]: TLS and authentication."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SecurityConfig:
    """Transport security and authentication (off by default; loopback only)."""

    tls_cert_file: str | None = None
    """PEM certificate chain; with `tls_key_file` turns on TLS."""
    tls_key_file: str | None = None
    """PEM private key of `tls_cert_file`."""
    tls_client_ca_file: str | None = None
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""
    auth_token_file: str | None = None
    """File holding the bearer token clients must send ("authorization: Bearer ...")."""
    auth_token_env: str = "QUICKDRAFT_AUTH_TOKEN"
    """Environment variable holding the token, when no file is given. Never a
    flag: flags show in `ps`."""
    health_requires_auth: bool = False
    """False lets load balancers probe grpc.health.v1 without a token."""
