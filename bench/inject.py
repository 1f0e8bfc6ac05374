"""Deliberate slowdowns, to show that the gate catches them.

``relay_cost(seconds_per_token)`` makes the server's stream relay
(``CompletionService._stream``) spend that long per token it passes on,
blocking its event loop the way per-token work in Python would (a needless
re-encode, a per-token log line, a lock). It wraps ``service.Timing.add``,
which the relay calls once per engine output with the output's token count,
for the duration of the ``with`` block, in this process only: the gate
starts its server in-process, so ``python -m quickdraft.bench.gate
--inject-relay-ms-per-token 20`` must fail. Nothing in the server knows about it.

Why blocking and per token, not an ``asyncio.sleep`` per message: vLLM
merges the outputs a slow consumer has not taken yet (DELTA outputs), so a
fixed delay per message shorter than an engine step only shifts every message
by the same amount (TTFT grows by it, TPOT does not). Per-token work is what
costs throughput: once the relay needs longer per token than the engine, the
relay sets the pace.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator


@contextlib.contextmanager
def relay_cost(seconds_per_token: float) -> Iterator[None]:
    from quickdraft.server import service

    if seconds_per_token <= 0:
        yield
        return
    original = service.Timing.add

    def add(self, n: int, now: float) -> None:
        if n > 0:
            time.sleep(n * seconds_per_token)  # blocks the server's loop, as CPU work in the relay would
        original(self, n, now)

    service.Timing.add = add
    try:
        yield
    finally:
        service.Timing.add = original
