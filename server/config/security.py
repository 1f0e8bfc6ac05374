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
    """File holding one bearer token all clients share ("authorization: Bearer ...").
    It names no one: clients are still counted by peer address. For a team, use
    `auth_tokens_file`."""
    auth_tokens_file: str | None = None
    """TOML file of users and their tokens' SHA-256 digests, with optional
    per-user `max_streams` (`quickdraft token add USER` writes it). Each user is
    counted and named on its own in limits, logs and metrics. Reloaded on
    SIGHUP. Excludes `auth_token_file` and the token variable."""
    auth_token_env: str = "QUICKDRAFT_AUTH_TOKEN"
    """Environment variable holding the shared token, when neither file is given.
    Never a flag: flags show in `ps`."""
    health_requires_auth: bool = False
    """False lets load balancers call grpc.health.v1 Check without a token.
    Watch (a long-lived stream) always needs the token when auth is on."""
    allow_insecure_remote: bool = False
    """Serve a non-loopback address without TLS or without auth (e.g. behind a
    TLS-terminating proxy on a private network). Off: such a bind is refused.
    On: every start logs a warning."""
