"""Prompt tokenization off the event loop, shared fairly between clients.

A long prompt takes the tokenizer hundreds of milliseconds (about 0.35 s per
million characters for the embedded model's tokenizer on one core), and on
the event loop that time stalls every other stream's tokens. Prompts above
``INLINE_CHARS`` run on a small thread pool instead: the Rust tokenizer
releases the GIL, so they run beside the loop and beside each other.

Fairness: each client has at most one tokenization running; the rest of its
prompts wait in its own queue, and a freed thread goes to the next client in
turn (round robin). A client sending prompts back to back therefore holds
at most one thread, and another client's prompt waits for at most one
prompt already running, never for the first client's queue.

Share: one thread kept busy by one client still takes a core from the engine
(on a 2-core machine, half of it). So each client may also use at most
``share`` of one thread's time, measured over a decaying window of
``WINDOW_S``; past it, its next long prompt waits until its use has decayed
back under the share. A client sending a prompt now and then never waits; one
looping maximum-size prompts runs at the share's pace.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

# Below this many characters a prompt tokenizes in well under a millisecond:
# cheaper on the loop than the two thread hand-offs a pool job costs.
INLINE_CHARS = 4096

WINDOW_S = 10.0
"""Time constant of a client's decaying tokenizer-time account."""


class TokenizerPool:
    """``run(client, chars, fn)``: ``fn()`` on the loop when ``chars`` is small, else on the pool, fairly."""

    def __init__(self, threads: int, share: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.threads = max(1, threads)
        self.share = share
        """Most of one thread's time one client may use, averaged over WINDOW_S."""
        self.clock = clock
        self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="quickdraft-tokenize")
        self._running: set[str] = set()
        self._queues: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._spent: dict[str, tuple[float, float]] = {}
        """client -> (tokenizer seconds, decayed to this time)."""
        self.throttled = 0
        """Long prompts that waited for their client's share."""

    @property
    def busy(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def run(self, client: str, chars: int, fn: Callable[[], T]) -> T:
        if chars < INLINE_CHARS:
            return fn()
        wait = self.wait_s(client)
        if wait > 0:
            self.throttled += 1
            await asyncio.sleep(wait)
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        self._queues.setdefault(client, collections.deque()).append(turn)
        self._dispatch()
        try:
            await turn
        except asyncio.CancelledError:
            if not turn.done() or turn.cancelled():
                self._forget(client, turn)
                raise
            # Our turn came as we were cancelled: give the thread back.
            self._release(client)
            raise
        t0 = self.clock()
        try:
            return await loop.run_in_executor(self._executor, fn)
        finally:
            self._charge(client, self.clock() - t0)
            self._release(client)

    def spent_s(self, client: str) -> float:
        """``client``'s tokenizer seconds, decayed to now."""
        seconds, at = self._spent.get(client, (0.0, 0.0))
        return seconds * math.exp(-max(0.0, self.clock() - at) / WINDOW_S) if seconds else 0.0

    def wait_s(self, client: str) -> float:
        """How long ``client``'s next long prompt waits for its share."""
        allowed = self.share * WINDOW_S
        spent = self.spent_s(client)
        return WINDOW_S * math.log(spent / allowed) if spent > allowed > 0 else 0.0

    def _charge(self, client: str, seconds: float) -> None:
        self._spent[client] = (self.spent_s(client) + seconds, self.clock())
        if len(self._spent) > 4096:  # forget clients whose use has decayed away
            self._spent = {c: v for c, v in self._spent.items() if self.spent_s(c) > 1e-3}

    def _release(self, client: str) -> None:
        self._running.discard(client)
        if client in self._queues:
            self._queues.move_to_end(client)  # it just had a turn: the others first
        self._dispatch()

    def _forget(self, client: str, turn: asyncio.Future) -> None:
        q = self._queues.get(client)
        if q is not None and turn in q:
            q.remove(turn)
            if not q:
                del self._queues[client]

    def _dispatch(self) -> None:
        """Hand free threads to waiting clients, one each, in turn."""
        while len(self._running) < self.threads:
            client = next((c for c in self._queues if c not in self._running), None)
            if client is None:
                return
            q = self._queues[client]
            turn = q.popleft()
            if not q:
                del self._queues[client]
            if not turn.cancelled():
                self._running.add(client)
                turn.set_result(None)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
