"""A fixed pure-Python reference workload, timed next to each micro-benchmark.

Absolute times mean nothing across CI machines (and little on one shared,
busy machine). A micro-benchmark's figure is therefore its time divided by
this workload's time, measured in the same test, right before and after it:
both move with the CPU's speed and with how busy it is, and the ratio stays.

The workload does what the hot paths do in pure Python -- string slicing and
joining, dict look-ups, small allocations, sorting, function calls -- on
fixed data, and nothing else (no I/O, no native libraries, no randomness),
so a change in quickdraft can never change it. Never edit it without
re-measuring bench/baselines/micro.json: every baseline ratio is relative to it.
"""

from __future__ import annotations

import time
from typing import Callable

# Fixed inputs, built once at import.
_WORDS = [f"{'get set load save parse render build emit'.split()[i % 8]}_{i % 97}_{'abcdefghij'[i % 10] * (1 + i % 5)}" for i in range(2000)]
_LINES = [f"    value_{i} = compute(item_{i % 13}, limit={i % 7})  # step {i}\n" for i in range(400)]


def reference_workload() -> int:
    """About a millisecond of interpreter work on a current CPU; returns a checksum."""
    counts: dict[str, int] = {}
    for w in _WORDS:
        key = w.split("_", 1)[0]
        counts[key] = counts.get(key, 0) + len(w)
    ranked = sorted(_WORDS, key=lambda w: (len(w), w[::-1]))
    text = "".join(_LINES)
    pieces = [ln.strip().partition("=")[0] for ln in text.splitlines()]
    window = text[-1500:].rsplit("\n", 3)[0]
    return sum(counts.values()) + len(ranked[0]) + len(pieces) + len(window)


CHECKSUM = reference_workload()


def best_of(fn: Callable[[], object], repeat: int = 7, number: int = 3) -> float:
    """Minimum over ``repeat`` runs of the mean time of ``number`` calls (seconds).

    The minimum, because on a shared machine noise only ever adds time.
    """
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def reference_seconds(repeat: int = 7) -> float:
    return best_of(reference_workload, repeat=repeat)
