"""The one speculative-decoding configuration type: :class:`SpecConfig`.

The controller decides in it, the engine runs it, reports name it. It says
how drafts are made (parallel P-EAGLE drafting: one drafter pass for all K
tokens; autoregressive EAGLE-3 drafting: K passes) and how many draft tokens
each engine step verifies, either one K for every step or K per number of
scheduled requests (vLLM's ``num_speculative_tokens_per_batch_size``).

``SpecConfig.to_vllm()`` is the only place that builds vLLM's
``speculative_config`` dict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

Mode = Literal["off", "autoregressive", "parallel"]
OFF: Mode = "off"
AUTOREGRESSIVE: Mode = "autoregressive"
PARALLEL: Mode = "parallel"
SPEC_MODES: tuple[Mode, Mode] = (AUTOREGRESSIVE, PARALLEL)
ALL_MODES: tuple[Mode, Mode, Mode] = (OFF, AUTOREGRESSIVE, PARALLEL)

#: Largest K anyone reasons about (vLLM has no hard limit; drafters are
#: trained for a handful of positions and acceptance beyond ~10 is noise).
MAX_K = 16

BatchRangeK = tuple[int, int, int]
"""``(min_batch, max_batch, K)``, both bounds inclusive, as vLLM takes it."""

_MODE_WORDS = {
    "autoregressive": False, "ar": False, "eagle3": False, "eagle": False,
    "parallel": True, "p": True, "p-eagle": True,
}


@dataclass(frozen=True, order=True)
class SpecConfig:
    """One speculative-decoding setting, for one step or one engine.

    Normalised so that equal settings compare equal: speculation off is
    ``k == 0`` with ``parallel`` False and no schedule; a schedule whose
    ranges all have the same K is stored as that plain K.
    """

    parallel: bool = False
    """Parallel drafting (P-EAGLE: one drafter pass drafts all K tokens)
    instead of autoregressive EAGLE-3 drafting (K drafter passes)."""
    k: int = 0
    """Draft tokens verified per step; with a schedule, its largest K (vLLM's
    ``num_speculative_tokens``). 0: speculation off."""
    per_batch_size: tuple[BatchRangeK, ...] = ()
    """K per number of scheduled requests, ``(min_batch, max_batch, K)``
    inclusive ranges, sorted, starting at batch 1; a gap or the tail after
    the last range carries the previous K forward (vLLM 0.24-0.32
    ``vllm/v1/spec_decode/dynamic/utils.py``). Empty: ``k`` at every size."""

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool):
            raise TypeError(f"SpecConfig.k must be an int, got {self.k!r}")
        if not 0 <= self.k <= MAX_K:
            raise ValueError(f"SpecConfig.k={self.k} is out of range; use 0 (speculation off) to {MAX_K}")
        ranges = _check_ranges(self.per_batch_size)
        if ranges:
            ks = {r[2] for r in ranges}
            if len(ks) == 1:
                ranges = ()  # one K everywhere: a plain K
            object.__setattr__(self, "k", max(ks))
        object.__setattr__(self, "per_batch_size", ranges)
        if self.k == 0:
            object.__setattr__(self, "parallel", False)
        else:
            object.__setattr__(self, "parallel", bool(self.parallel))

    # -- construction -------------------------------------------------------
    @classmethod
    def off(cls) -> "SpecConfig":
        return cls(False, 0)

    @classmethod
    def of(cls, mode: Mode, k: int) -> "SpecConfig":
        """From a mode name; ``of("off", anything)`` is off."""
        if mode == OFF:
            return cls.off()
        if mode not in SPEC_MODES:
            raise ValueError(f"unknown mode {mode!r}; use one of {ALL_MODES}")
        if k < 1:
            raise ValueError(f"mode {mode!r} needs k >= 1 (k=0 is speculation off)")
        return cls(mode == PARALLEL, k)

    @classmethod
    def scheduled(cls, parallel: bool, ranges: Iterable[Sequence[int]]) -> "SpecConfig":
        """K per batch size from ``(min_batch, max_batch, K)`` ranges (any order)."""
        rs = tuple(sorted((int(a), int(b), int(k)) for a, b, k in ranges))
        if not rs:
            raise ValueError("a schedule needs at least one (min_batch, max_batch, K) range")
        if max(r[2] for r in rs) == 0:
            return cls.off()
        return cls(parallel, max(r[2] for r in rs), rs)

    @classmethod
    def from_per_batch(cls, parallel: bool, ks: Sequence[int]) -> "SpecConfig":
        """``ks[b-1]`` = K at batch ``b``; the last K carries forward past ``len(ks)``."""
        if not ks:
            raise ValueError("from_per_batch needs K for at least batch size 1")
        ranges: list[BatchRangeK] = []
        start = 1
        for b in range(2, len(ks) + 2):
            if b > len(ks) or ks[b - 1] != ks[start - 1]:
                ranges.append((start, b - 1, int(ks[start - 1])))
                start = b
        return cls.scheduled(parallel, ranges)

    # -- queries ------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.k > 0

    @property
    def mode(self) -> Mode:
        if self.k == 0:
            return OFF
        return PARALLEL if self.parallel else AUTOREGRESSIVE

    @property
    def max_k(self) -> int:
        """Largest K at any batch size (the engine's ``num_speculative_tokens``)."""
        return self.k

    @property
    def is_uniform(self) -> bool:
        """The same K at every batch size."""
        return not self.per_batch_size

    def k_for(self, batch: float) -> int:
        """K for a step with ``batch`` scheduled requests (rounded)."""
        if not self.per_batch_size:
            return self.k
        b = max(1, int(round(batch)))
        k = self.per_batch_size[0][2]
        for lo, _hi, rk in self.per_batch_size:
            if lo > b:
                break
            k = rk  # inside the range, or carried forward through a gap or the tail
        return k

    def at(self, batch: float) -> "SpecConfig":
        """The plain setting a step with ``batch`` requests runs."""
        return SpecConfig(self.parallel, self.k_for(batch))

    def ranges(self, max_batch: int) -> tuple[BatchRangeK, ...]:
        """The schedule as ranges covering batch sizes 1..max_batch."""
        if self.per_batch_size:
            return self.per_batch_size
        return ((1, max(1, max_batch), self.k),)

    def dense(self, max_batch: int) -> list[int]:
        """K for batch sizes 0..max_batch (index = batch size; index 0 unused),
        the lookup table vLLM's scheduler reads."""
        return [0] + [self.k_for(b) for b in range(1, max(1, max_batch) + 1)]

    def capped(self, k_cap: int) -> "SpecConfig":
        """Every K limited to ``k_cap`` (off if that leaves nothing)."""
        if not self.per_batch_size:
            return SpecConfig(self.parallel, min(self.k, max(0, k_cap)))
        return SpecConfig.scheduled(self.parallel, [(lo, hi, min(k, max(0, k_cap))) for lo, hi, k in self.per_batch_size])._merged()

    def _merged(self) -> "SpecConfig":
        out: list[BatchRangeK] = []
        for lo, hi, k in self.per_batch_size:
            if out and out[-1][2] == k and out[-1][1] + 1 == lo:
                out[-1] = (out[-1][0], hi, k)
            else:
                out.append((lo, hi, k))
        return SpecConfig(self.parallel, self.k, tuple(out)) if out else self

    # -- to and from text, dicts and vLLM -------------------------------------
    def label(self) -> str:
        """``off``, ``parallel K=5`` or ``autoregressive 1-2:K3 3+:K1``."""
        if self.k == 0:
            return "off"
        if not self.per_batch_size:
            return f"{self.mode} K={self.k}"
        parts = []
        for i, (lo, hi, k) in enumerate(self.per_batch_size):
            last = i == len(self.per_batch_size) - 1
            span = f"{lo}+" if last else (f"{lo}" if lo == hi else f"{lo}-{hi}")
            parts.append(f"{span}:K{k}")
        return f"{self.mode} " + " ".join(parts)

    __str__ = label

    @classmethod
    def parse(cls, text: str) -> "SpecConfig":
        """Inverse of :meth:`label`; also takes ``ar``/``p``, ``k5`` and the
        short labels of the benchmarks (``p5``, ``ar3``)."""
        t = text.strip().lower()
        if t in ("off", "none", "k=0"):
            return cls.off()
        m = re.fullmatch(r"(autoregressive|ar|eagle3?|parallel|p|p-eagle)\s*(?:k\s*=?\s*)?(\d+)", t)
        if m:
            return cls(_MODE_WORDS[m.group(1)], int(m.group(2)))
        m = re.fullmatch(r"(autoregressive|ar|eagle3?|parallel|p|p-eagle)((?:\s+\d+(?:-\d+|\+)?:k\d+)+)", t)
        if m:
            ranges = []
            for part in m.group(2).split():
                span, k = part.split(":k")
                if span.endswith("+"):  # open-ended: label() writes it for the last range only
                    lo, hi = int(span[:-1]), 1 << 20
                elif "-" in span:
                    lo, hi = (int(x) for x in span.split("-"))
                else:
                    lo = hi = int(span)
                ranges.append((lo, hi, int(k)))
            return cls.scheduled(_MODE_WORDS[m.group(1)], ranges)
        raise ValueError(
            f"cannot parse speculative config {text!r}; write e.g. 'off', 'parallel K=5', "
            "'autoregressive K=3' or 'autoregressive 1-2:K3 3+:K1'"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"parallel": self.parallel, "k": self.k, "per_batch_size": [list(r) for r in self.per_batch_size]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpecConfig":
        if "ranges" in d:  # profiles saved before the one type: a schedule dict
            return cls.scheduled(bool(d["parallel"]), d["ranges"])
        return cls(bool(d.get("parallel", False)), int(d.get("k", 0)),
                   tuple(tuple(int(v) for v in r) for r in d.get("per_batch_size", ())))  # type: ignore[misc]

    def to_vllm(self, drafter: str | None, *, method: str = "eagle3", extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` for an engine built for this setting
        (None when speculation is off). A uniform K leaves
        ``num_speculative_tokens_per_batch_size`` out: with it vLLM turns on
        dynamic speculation, which changes its CUDA-graph plan."""
        if not self.enabled:
            return None
        if not drafter:
            raise ValueError(f"{self.label()} needs a drafter; set model.drafter (or model.parallel_drafter)")
        out: dict[str, Any] = {
            "method": method,
            "model": drafter,
            "num_speculative_tokens": self.k,
            "parallel_drafting": self.parallel,
        }
        if self.per_batch_size:
            out["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.per_batch_size]
        if extra:
            out.update(extra)
        return out


def default_candidates() -> tuple[SpecConfig, ...]:
    """Off, autoregressive K in {1,3,5,7}, parallel K in {1,3,5,7}."""
    ks = (1, 3, 5, 7)
    return (SpecConfig.off(),) + tuple(SpecConfig(False, k) for k in ks) + tuple(SpecConfig(True, k) for k in ks)


def _check_ranges(ranges: Iterable[Sequence[int]]) -> tuple[BatchRangeK, ...]:
    rs = tuple(tuple(int(v) for v in r) for r in ranges)
    prev_end = 0
    for r in rs:
        if len(r) != 3:
            raise ValueError(f"per_batch_size range {r!r} must be (min_batch, max_batch, K)")
        lo, hi, k = r
        if lo <= 0 or lo > hi:
            raise ValueError(f"per_batch_size range {r}: need 1 <= min_batch <= max_batch")
        if lo <= prev_end:
            raise ValueError(
                f"per_batch_size ranges must be sorted and non-overlapping; {r} starts at or before "
                f"the previous end {prev_end}"
            )
        if not 0 <= k <= MAX_K:
            raise ValueError(f"per_batch_size range {r}: K must be in 0..{MAX_K}")
        prev_end = hi
    if rs and rs[0][0] != 1:
        raise ValueError("the first per_batch_size range must start at batch 1 (vLLM rejects schedules "
                         "that leave small batches undefined)")
    return rs  # type: ignore[return-value]
