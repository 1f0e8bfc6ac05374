"""Latency statistics for the benchmarks: exact percentiles over all samples,
and a log-bucketed histogram that merges without losing its percentiles.

Why both: a benchmark run keeps every sample (a few thousand at most), so its
percentiles are exact. Histograms are what you keep when runs are merged (the
sweep's rounds, several load-generator processes): merging bucket counts and
reading the percentile off the merged counts is correct, while averaging the
per-run percentiles is not (the p99 of two runs is not the mean of their p99s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest
    ranks (numpy's default), NaN when there are no samples."""
    if not samples:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float], digits: int = 3) -> dict:
    """n, mean, p50, p95, p99 and max of ``samples`` (all samples, no averaging of percentiles)."""
    if not samples:
        return {"n": 0}
    r = lambda v: round(v, digits)  # noqa: E731
    return {
        "n": len(samples),
        "mean": r(sum(samples) / len(samples)),
        "p50": r(percentile(samples, 50)),
        "p95": r(percentile(samples, 95)),
        "p99": r(percentile(samples, 99)),
        "max": r(max(samples)),
    }


@dataclass
class LogHistogram:
    """Counts in logarithmic buckets: bucket i holds values in
    [lowest * growth**i, lowest * growth**(i+1)). With growth 1.02 a
    percentile read back is within 2 % of the exact one, at any scale from
    microseconds to minutes; values below ``lowest`` land in bucket 0."""

    lowest: float = 1e-3
    growth: float = 1.02
    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0

    def add(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"histogram value must be finite and >= 0, got {value}")
        i = 0 if value < self.lowest else int(math.log(value / self.lowest) / math.log(self.growth))
        self.counts[i] = self.counts.get(i, 0) + 1
        self.total += 1

    def extend(self, values: Iterable[float]) -> "LogHistogram":
        for v in values:
            self.add(v)
        return self

    def merge(self, other: "LogHistogram") -> "LogHistogram":
        if (other.lowest, other.growth) != (self.lowest, self.growth):
            raise ValueError("only histograms with the same buckets merge")
        out = LogHistogram(self.lowest, self.growth, dict(self.counts), self.total)
        for i, n in other.counts.items():
            out.counts[i] = out.counts.get(i, 0) + n
        out.total += other.total
        return out

    def percentile(self, q: float) -> float:
        """Geometric middle of the bucket holding the q-th percentile (nearest rank)."""
        if self.total == 0:
            return math.nan
        rank = max(1, math.ceil(q / 100.0 * self.total))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return self.lowest * self.growth ** (i + 0.5)
        raise AssertionError("unreachable: ranks exceed the total")

    def to_dict(self) -> dict:
        return {"lowest": self.lowest, "growth": self.growth, "counts": {str(k): v for k, v in sorted(self.counts.items())}}

    @classmethod
    def from_dict(cls, d: dict) -> "LogHistogram":
        counts = {int(k): int(v) for k, v in d["counts"].items()}
        return cls(float(d["lowest"]), float(d["growth"]), counts, sum(counts.values()))


def ratio(num: float, den: float) -> float:
    """num / den, NaN when either is missing or the denominator is zero."""
    if den is None or num is None or not math.isfinite(den) or den == 0 or not math.isfinite(num):
        return math.nan
    return num / den
