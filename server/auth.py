"""Who a caller is: the bearer-token check of both front ends, the per-user
tokens file, and the client key that per-client limits count.

Three modes, from ``[security]``:

- no token: every caller is let in and counted by its peer host;
- one shared token (``auth_token_file`` or ``$QUICKDRAFT_AUTH_TOKEN``): it
  proves membership, not identity, so callers are still counted by peer host;
- a tokens file (``auth_tokens_file``): one or more tokens per user, stored as
  SHA-256 digests; each user is counted on its own, with its own stream limit,
  and logs and metrics name the user id, never the token. Reloaded on SIGHUP.

The tokens file is TOML::

    [users.alice]
    token_sha256 = ["<64 hex digits>"]   # one per device or rotation
    max_streams = 8                      # optional; default limits.max_streams_per_client
    admin = true                         # optional; may call PinSpeculation

Tokens are random 256-bit strings (``quickdraft token add``), so an unsalted
SHA-256 is enough to keep them unusable if the file leaks, and a lookup by
digest reveals nothing about a token through timing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from quickdraft.server.admission import ANONYMOUS, Client
from quickdraft.server.config import ConfigError, QuickdraftConfig
from quickdraft.wire import bearer

log = logging.getLogger("quickdraft.auth")

USER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class User:
    name: str
    digests: tuple[str, ...]
    max_streams: int | None = None
    admin: bool = False


@dataclass
class TokensFile:
    """Users and their token digests, as read from ``security.auth_tokens_file``."""

    users: dict[str, User] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | Path) -> "TokensFile":
        p = Path(path).expanduser()
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"security.auth_tokens_file = {str(path)!r}: no such file (create it with `quickdraft token add USER`)") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"security.auth_tokens_file {str(path)!r} is not valid TOML: {e}") from None
        unknown = set(data) - {"users"}
        if unknown:
            raise ConfigError(f"security.auth_tokens_file {str(path)!r}: unknown top-level keys {sorted(unknown)}; only [users.NAME] tables")
        users: dict[str, User] = {}
        seen: dict[str, str] = {}
        for name, entry in (data.get("users") or {}).items():
            where = f"security.auth_tokens_file {str(path)!r}, [users.{name}]"
            if not USER_ID.match(name):
                raise ConfigError(f"{where}: a user id is 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit")
            if not isinstance(entry, dict) or set(entry) - {"token_sha256", "max_streams", "admin"}:
                raise ConfigError(f"{where}: use only token_sha256, max_streams and admin")
            digests = entry.get("token_sha256", [])
            digests = [digests] if isinstance(digests, str) else digests
            if not isinstance(digests, list) or not digests or not all(isinstance(d, str) and DIGEST.match(d) for d in digests):
                raise ConfigError(f"{where}: token_sha256 must be one or more SHA-256 hex digests (64 lowercase hex digits), never the token itself")
            for d in digests:
                if d in seen:
                    raise ConfigError(f"{where}: a token digest also belongs to user {seen[d]!r}; one token, one user")
                seen[d] = name
            limit = entry.get("max_streams")
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
                raise ConfigError(f"{where}: max_streams = {limit!r}; use a whole number of streams, 1 or more")
            admin = entry.get("admin", False)
            if not isinstance(admin, bool):
                raise ConfigError(f"{where}: admin = {admin!r}; use true or false")
            users[name] = User(name, tuple(digests), limit, admin)
        return cls(users)

    def write(self, path: str | Path) -> None:
        """Write the file readable by its owner only (it lists who may connect)."""
        lines = ["# quickdraft users: token digests (SHA-256), never tokens. Edit with `quickdraft token`.", ""]
        for u in self.users.values():
            lines.append(f'[users."{u.name}"]')  # quoted: '@' and '.' are not bare-key characters
            lines.append("token_sha256 = [" + ", ".join(f'"{d}"' for d in u.digests) + "]")
            if u.max_streams is not None:
                lines.append(f"max_streams = {u.max_streams}")
            if u.admin:
                lines.append("admin = true")
            lines.append("")
        p = Path(path).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines))
        os.replace(tmp, p)

    def add(self, name: str, max_streams: int | None = None, admin: bool | None = None) -> str:
        """A new token for user ``name`` (created if new); returns the token, which is not stored."""
        if not USER_ID.match(name):
            raise ConfigError(f"user id {name!r}: use 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit")
        token = "qd_" + secrets.token_urlsafe(32)
        old = self.users.get(name)
        digests = (*(old.digests if old else ()), digest(token))
        self.users[name] = User(name, digests, max_streams if max_streams is not None else (old.max_streams if old else None),
                                admin if admin is not None else (old.admin if old else False))
        return token


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_auth_token(cfg: QuickdraftConfig) -> str | None:
    """The shared bearer token (security.auth_token_file, else the
    security.auth_token_env variable); None: no shared token."""
    sec = cfg.security
    if sec.auth_token_file:
        return Path(sec.auth_token_file).expanduser().read_text().strip()
    token = os.environ.get(sec.auth_token_env, "").strip()
    return token or None


class Auth:
    """The bearer-token check of both front ends, and the client it identifies."""

    def __init__(self, token: str | None = None, tokens_file: str | Path | None = None):
        self._expected = bearer(token).encode() if token else None
        self._tokens_file = tokens_file
        self._users: dict[str, User] = {}  # by token digest
        if tokens_file is not None:
            self.reload()

    @classmethod
    def from_config(cls, cfg: QuickdraftConfig) -> "Auth":
        if cfg.security.auth_tokens_file:
            return cls(tokens_file=cfg.security.auth_tokens_file)
        return cls(read_auth_token(cfg))

    @property
    def enabled(self) -> bool:
        return self._expected is not None or self._tokens_file is not None

    @property
    def per_user(self) -> bool:
        return self._tokens_file is not None

    @property
    def users(self) -> int:
        return len({u.name for u in self._users.values()})

    def reload(self) -> bool:
        """Re-read the tokens file (SIGHUP). A broken file keeps the users
        already loaded (logged): a typo must not lock everyone out, nor let everyone in."""
        if self._tokens_file is None:
            return False
        try:
            users = TokensFile.read(self._tokens_file).users.values()
        except ConfigError as e:
            if not self._users:
                raise
            log.error("tokens file not reloaded, keeping %d users: %s", self.users, e)
            return False
        self._users = {d: u for u in users for d in u.digests}
        log.info("tokens file: %d users", self.users)
        return True

    def _user(self, authorization: str) -> User | None:
        if not authorization.startswith("Bearer "):
            return None
        return self._users.get(digest(authorization[len("Bearer "):]))

    def allows(self, authorization: str) -> bool:
        """Whether the authorization header (or metadata) passes; constant time for the shared token."""
        if self._tokens_file is not None:
            return self._user(authorization) is not None
        if self._expected is None:
            return True
        return hmac.compare_digest(authorization.encode(), self._expected)

    def client(self, authorization: str, peer: str) -> Client:
        """The caller as per-client limits count it: a tokens-file user by its
        id; anyone else by peer host. A shared token names no one, and a
        made-up token must not buy a fresh quota, so neither counts."""
        if self._tokens_file is not None:
            user = self._user(authorization)
            if user is not None:
                return Client("user:" + user.name, user.name, user.max_streams, user.admin)
            return Client(peer)
        # A shared token, or none: whoever gets in may operate the server, as before users existed.
        return Client(peer, admin=True)

    def client_identity(self, authorization: str, peer: str) -> str:
        """The per-client limits key (``client().key``)."""
        return self.client(authorization, peer).key
