"""Speculative configurations the controller chooses between.

A :class:`SpecConfig` is what one engine step runs: a drafting mode and K. A
:class:`KSchedule` is what one engine runs: the mode is fixed per engine, and
vLLM 0.32's ``num_speculative_tokens_per_batch_size`` picks K per step from the
number of scheduled requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

Mode = Literal["off", "autoregressive", "parallel"]
OFF: Mode = "off"
AUTOREGRESSIVE: Mode = "autoregressive"
PARALLEL: Mode = "parallel"
SPEC_MODES: tuple[Mode, Mode] = (AUTOREGRESSIVE, PARALLEL)
ALL_MODES: tuple[Mode, Mode, Mode] = (OFF, AUTOREGRESSIVE, PARALLEL)

#: Largest K the controller reasons about (vLLM has no hard limit; drafters
#: are trained for a handful of positions and acceptance beyond ~10 is noise).
MAX_K = 16


@dataclass(frozen=True, order=True)
class SpecConfig:
    """One speculative-decoding setting.

    ``k == 0`` means speculation off; ``parallel`` is then normalised to False
    so there is exactly one "off" value.
    """

    parallel: bool = False
    """Parallel drafting (P-EAGLE: one drafter pass drafts all K tokens)
    instead of autoregressive EAGLE-3 drafting (K drafter passes)."""
    k: int = 0
    """Draft tokens verified per step (vLLM's ``num_speculative_tokens``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool):
            raise TypeError(f"SpecConfig.k must be an int, got {self.k!r}")
        if not 0 <= self.k <= MAX_K:
            raise ValueError(
                f"SpecConfig.k={self.k} is out of range; use 0 (speculation off) "
                f"to {MAX_K}"
            )
        if self.k == 0 and self.parallel:
            object.__setattr__(self, "parallel", False)

    @classmethod
    def off(cls) -> "SpecConfig":
        return cls(False, 0)

    @classmethod
    def of(cls, mode: Mode, k: int) -> "SpecConfig":
        """Build from a mode name; ``of("off", anything)`` is off."""
        if mode == OFF:
            return cls.off()
        if mode not in SPEC_MODES:
            raise ValueError(f"unknown mode {mode!r}; use one of {ALL_MODES}")
        if k < 1:
            raise ValueError(f"mode {mode!r} needs k >= 1 (k=0 is speculation off)")
        return cls(mode == PARALLEL, k)

    @property
    def enabled(self) -> bool:
        return self.k > 0

    @property
    def mode(self) -> Mode:
        if self.k == 0:
            return OFF
        return PARALLEL if self.parallel else AUTOREGRESSIVE

    def label(self) -> str:
        """``"off"``, ``"parallel K=5"`` or ``"autoregressive K=3"``."""
        return "off" if self.k == 0 else f"{self.mode} K={self.k}"

    __str__ = label

    @classmethod
    def parse(cls, text: str) -> "SpecConfig":
        """Inverse of :meth:`label` (also accepts ``ar``/``p`` and ``k5``)."""
        t = text.strip().lower()
        if t in ("off", "none", "k=0"):
            return cls.off()
        m = re.fullmatch(r"(autoregressive|ar|eagle3?|parallel|p|p-eagle)\s*k\s*=?\s*(\d+)", t)
        if not m:
            raise ValueError(
                f"cannot parse speculative config {text!r}; write e.g. 'off', "
                "'parallel K=5' or 'autoregressive K=3'"
            )
        parallel = m.group(1) in ("parallel", "p", "p-eagle")
        return cls(parallel, int(m.group(2)))


def default_candidates() -> tuple[SpecConfig, ...]:
    """Off, autoregressive K in {1,3,5,7}, parallel K in {1,3,5,7}."""
    ks = (1, 3, 5, 7)
    return (
        (SpecConfig.off(),)
        + tuple(SpecConfig(False, k) for k in ks)
        + tuple(SpecConfig(True, k) for k in ks)
    )


BatchRangeK = tuple[int, int, int]
"""``(min_batch, max_batch, K)``, both bounds inclusive, as vLLM takes it."""


@dataclass(frozen=True)
class KSchedule:
    """K per number of scheduled requests, for one engine (one drafting mode).

    Semantics follow vLLM 0.32 (``vllm/v1/spec_decode/dynamic/utils.py``):
    ranges are sorted, non-overlapping, start at batch 1; a gap or the tail
    after the last range carries the previous K forward; K is clamped to the
    engine's ``num_speculative_tokens``, which should be :attr:`max_k`. K=0 in
    a range means no drafts for steps of that size (the drafter stays loaded).
    """

    parallel: bool
    """Drafting mode of the engine the schedule is for."""
    ranges: tuple[BatchRangeK, ...]
    """``(min_batch, max_batch, K)`` inclusive ranges."""

    def __post_init__(self) -> None:
        rs = tuple(tuple(int(v) for v in r) for r in self.ranges)
        object.__setattr__(self, "ranges", rs)
        if not rs:
            raise ValueError("KSchedule needs at least one (min_batch, max_batch, K) range")
        prev_end = 0
        for r in rs:
            if len(r) != 3:
                raise ValueError(f"KSchedule range {r!r} must be (min_batch, max_batch, K)")
            lo, hi, k = r
            if lo <= 0 or lo > hi:
                raise ValueError(f"KSchedule range {r}: need 1 <= min_batch <= max_batch")
            if lo <= prev_end:
                raise ValueError(
                    f"KSchedule ranges must be sorted and non-overlapping; {r} starts "
                    f"at or before the previous end {prev_end}"
                )
            if not 0 <= k <= MAX_K:
                raise ValueError(f"KSchedule range {r}: K must be in 0..{MAX_K}")
            prev_end = hi
        if rs[0][0] != 1:
            raise ValueError(
                "the first KSchedule range must start at batch 1 (vLLM rejects "
                "schedules that leave small batches undefined)"
            )
        if self.max_k == 0:
            raise ValueError(
                "a KSchedule with K=0 everywhere is speculation off; use no schedule "
                "and SpecConfig.off() instead"
            )

    # -- construction -------------------------------------------------------
    @classmethod
    def uniform(cls, config: SpecConfig, max_batch: int = 1) -> "KSchedule":
        """The same K at every batch size (a plain static engine)."""
        if not config.enabled:
            raise ValueError("speculation off has no K schedule; pass an enabled SpecConfig")
        return cls(config.parallel, ((1, max(1, max_batch), config.k),))

    @classmethod
    def from_per_batch(cls, parallel: bool, ks: Sequence[int]) -> "KSchedule":
        """Compress ``ks[b-1]`` = K at batch ``b`` into ranges; the last K
        carries forward past ``len(ks)``."""
        if not ks:
            raise ValueError("from_per_batch needs K for at least batch size 1")
        ranges: list[BatchRangeK] = []
        start = 1
        for b in range(2, len(ks) + 2):
            if b > len(ks) or ks[b - 1] != ks[start - 1]:
                ranges.append((start, b - 1, int(ks[start - 1])))
                start = b
        return cls(parallel, tuple(ranges))

    @classmethod
    def from_vllm(cls, parallel: bool, entries: Iterable[Sequence[int]]) -> "KSchedule":
        return cls(parallel, tuple(sorted((int(a), int(b), int(k)) for a, b, k in entries)))

    # -- queries ------------------------------------------------------------
    @property
    def max_k(self) -> int:
        """Largest K; the engine's ``num_speculative_tokens`` must be at least this."""
        return max(r[2] for r in self.ranges)

    @property
    def is_uniform(self) -> bool:
        return len({r[2] for r in self.ranges}) == 1

    def k_for(self, batch: float) -> int:
        """K vLLM schedules for a step with ``batch`` requests (rounded)."""
        b = max(1, int(round(batch)))
        k = self.ranges[0][2]
        for lo, hi, rk in self.ranges:
            if lo > b:
                break
            k = rk  # inside the range, or carried forward through a gap/tail
        return k

    def config_at(self, batch: float) -> SpecConfig:
        return SpecConfig(self.parallel, self.k_for(batch))

    def capped(self, k_cap: int) -> "KSchedule | None":
        """The schedule with every K limited to ``k_cap`` (None if that leaves
        speculation off everywhere)."""
        ks = [min(r[2], k_cap) for r in self.ranges]
        if max(ks) <= 0:
            return None
        return KSchedule(self.parallel, tuple((r[0], r[1], k) for r, k in zip(self.ranges, ks)))._merged()

    def _merged(self) -> "KSchedule":
        out: list[BatchRangeK] = []
        for lo, hi, k in self.ranges:
            if out and out[-1][2] == k and out[-1][1] + 1 == lo:
                out[-1] = (out[-1][0], hi, k)
            else:
                out.append((lo, hi, k))
        return KSchedule(self.parallel, tuple(out))

    def to_vllm(self) -> list[tuple[int, int, int]]:
        """Value for ``speculative_config["num_speculative_tokens_per_batch_size"]``."""
        return [tuple(r) for r in self.ranges]  # type: ignore[misc]

    def label(self) -> str:
        mode = PARALLEL if self.parallel else AUTOREGRESSIVE
        if self.is_uniform:
            return f"{mode} K={self.max_k}"
        parts = []
        for i, (lo, hi, k) in enumerate(self.ranges):
            last = i == len(self.ranges) - 1
            span = f"{lo}+" if last else (f"{lo}" if lo == hi else f"{lo}-{hi}")
            parts.append(f"{span}:K{k}")
        return f"{mode} " + " ".join(parts)

    __str__ = label

    def to_dict(self) -> dict:
        return {"parallel": self.parallel, "ranges": [list(r) for r in self.ranges]}

    @classmethod
    def from_dict(cls, d: dict) -> "KSchedule":
        return cls(bool(d["parallel"]), tuple(tuple(r) for r in d["ranges"]))  # type: ignore[arg-type]


def engine_speculative_config(
    config: SpecConfig,
    schedule: KSchedule | None,
    *,
    drafter: str,
    method: str = "eagle3",
) -> dict | None:
    """The ``speculative_config`` dict for ``vllm.LLM``/``AsyncEngineArgs``.

    None when speculation is off. A uniform (or absent) schedule is left out so
    vLLM does not switch to dynamic speculation (which forces piecewise CUDA
    graphs); otherwise ``num_speculative_tokens`` is the schedule's largest K.
    """
    if schedule is None:
        if not config.enabled:
            return None
        return {
            "method": method,
            "model": drafter,
            "num_speculative_tokens": config.k,
            "parallel_drafting": config.parallel,
        }
    if config.enabled and schedule.parallel != config.parallel:
        raise ValueError(
            f"schedule mode ({schedule.label()}) differs from config {config.label()}; "
            "one engine runs one drafting mode"
        )
    out = {
        "method": method,
        "model": drafter,
        "num_speculative_tokens": schedule.max_k,
        "parallel_drafting": schedule.parallel,
    }
    if not schedule.is_uniform:
        out["num_speculative_tokens_per_batch_size"] = schedule.to_vllm()
    return out
