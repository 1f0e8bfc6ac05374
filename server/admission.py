"""Admission control: how many completion streams may be open, in all and per
client, and a fair share of the server for each client when it fills up."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from quickdraft.server.errors import RequestError

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Client:
    """One caller as admission counts it: ``key`` is what per-client limits
    count (a user id, else the peer host); ``user`` the tokens-file user id
    (safe to log and to use as a metric label, never a token); ``max_streams``
    that user's own stream limit (None: ``limits.max_streams_per_client``);
    ``admin`` whether it may operate the server (PinSpeculation)."""

    key: str
    user: str = ANONYMOUS
    max_streams: int | None = None
    admin: bool = False


class Admission:
    """Counts open streams. Single event loop: no locks needed.

    Past half of ``max_streams`` a client already holding its fair share (the
    open streams divided evenly between the clients holding streams, the
    newcomer included) is refused, so that one busy client cannot fill the
    server before the others get a stream.
    """

    def __init__(self, max_streams: int, max_per_client: int):
        self.max_streams = max_streams
        self.max_per_client = max_per_client
        self.open = 0
        self.per_client: Counter[str] = Counter()
        self.accepting = True

    def fair_share(self, client: str) -> int:
        holders = len(self.per_client) + (0 if client in self.per_client else 1)
        return max(1, self.max_streams // holders)

    @contextmanager
    def admit(self, client: Client | str) -> Iterator[None]:
        c = client if isinstance(client, Client) else Client(client)
        key = c.key
        limit = c.max_streams if c.max_streams is not None else self.max_per_client
        if not self.accepting:
            raise RequestError("UNAVAILABLE", "server is shutting down; retry on another instance")
        if self.open >= self.max_streams:
            raise RequestError("RESOURCE_EXHAUSTED", f"max_concurrent_streams ({self.max_streams}) reached; retry shortly")
        held = self.per_client[key]
        if held >= limit:
            what = f"this user's max_streams ({limit})" if c.max_streams is not None else f"max_streams_per_client ({limit})"
            raise RequestError("RESOURCE_EXHAUSTED", f"{what} reached for this client; cancel older requests first")
        if self.open * 2 >= self.max_streams and held >= self.fair_share(key):
            raise RequestError("RESOURCE_EXHAUSTED", f"the server is busy and this client holds its fair share ({held} of "
                                                     f"max_concurrent_streams = {self.max_streams}); cancel older requests first")
        self.open += 1
        self.per_client[key] += 1
        try:
            yield
        finally:
            self.open -= 1
            self.per_client[key] -= 1
            if not self.per_client[key]:
                del self.per_client[key]
