"""Admission control: how many completion streams may be open, in all and per client."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Iterator

from quickdraft.server.errors import RequestError


class Admission:
    """Counts open streams. Single event loop: no locks needed."""

    def __init__(self, max_streams: int, max_per_client: int):
        self.max_streams = max_streams
        self.max_per_client = max_per_client
        self.open = 0
        self.per_client: Counter[str] = Counter()
        self.accepting = True

    @contextmanager
    def admit(self, client: str) -> Iterator[None]:
        if not self.accepting:
            raise RequestError("UNAVAILABLE", "server is shutting down; retry on another instance")
        if self.open >= self.max_streams:
            raise RequestError("RESOURCE_EXHAUSTED", f"max_concurrent_streams ({self.max_streams}) reached; retry shortly")
        if self.per_client[client] >= self.max_per_client:
            raise RequestError("RESOURCE_EXHAUSTED", f"max_streams_per_client ({self.max_per_client}) reached for this client; cancel older requests first")
        self.open += 1
        self.per_client[client] += 1
        try:
            yield
        finally:
            self.open -= 1
            self.per_client[client] -= 1
            if not self.per_client[client]:
                del self.per_client[client]
