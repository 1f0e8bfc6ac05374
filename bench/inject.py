"""Deliberate slowdowns, to show that the gate catches them.

``relay_delay(seconds)`` makes the server's stream relay
(``CompletionService._stream``) sleep before passing on each message, as a
regression in the per-token path would (an extra copy, a blocking call, a
lock). It patches the class for the duration of the ``with`` block, in this
process only: the gate starts its server in-process, so
``python -m quickdraft.bench.gate --inject-relay-delay-ms 5`` must fail on
the gRPC TPOT ratio. Nothing in the server knows about it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Iterator


@contextlib.contextmanager
def relay_delay(seconds: float) -> Iterator[None]:
    from quickdraft.server.service import CompletionService

    if seconds <= 0:
        yield
        return
    original = CompletionService._stream

    async def slowed(self, *args, **kwargs):
        async with contextlib.aclosing(original(self, *args, **kwargs)) as stream:
            async for msg in stream:
                await asyncio.sleep(seconds)
                yield msg

    CompletionService._stream = slowed
    try:
        yield
    finally:
        CompletionService._stream = original
