"""What the controller learns from: one record per finished request, and
optional engine-level snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

from ..speculative import SpecConfig

LatencyClass = Literal["inline", "chat", "batch"]
LATENCY_CLASSES: tuple[LatencyClass, ...] = ("inline", "chat", "batch")


@dataclass(frozen=True)
class Observation:
    """One finished request, as the server measured it.

    Speculative counters follow vLLM's per-request ``SpecDecodingStats``
    (the ``SpeculativeStats`` message of the proto). Give either
    ``accepted_per_position`` or ``accepted_histogram``; with neither, the
    request only informs the step-time and TTFT models.
    """

    latency_class: LatencyClass
    """Which TTFT SLO the request is held to."""
    ttft_s: float
    """Arrival to first token, seconds."""
    tpot_s: float
    """Mean time between output tokens after the first, seconds."""
    output_tokens: int
    """Tokens generated (the first included)."""
    batch_size: float
    """Running requests while it decoded (a mean over its life is fine)."""
    config: SpecConfig
    """The per-step setting it ran under: with a per-batch-size K schedule,
    the mode and the K in effect, e.g. ``engine.at(batch_size)``; the counters
    below give the K actually drafted."""
    num_drafts: int = 0
    """Verification steps that checked drafts."""
    num_draft_tokens: int = 0
    """Draft tokens proposed over those steps."""
    accepted_per_position: Sequence[int] = ()
    """``[i]`` = steps whose draft at position ``i+1`` was accepted (vLLM's
    ``num_accepted_tokens_per_pos``, which counts accepted prefixes)."""
    draft_tokens_per_position: Sequence[int] = ()
    """Optional ``[i]`` = steps that drafted position ``i+1`` (vLLM's
    ``num_draft_tokens_per_pos``); needed for exact acceptance when K varied
    within the request (per-batch-size schedules)."""
    accepted_histogram: Sequence[int] = ()
    """Alternative to ``accepted_per_position``: ``[n]`` = steps that accepted
    exactly ``n`` drafts."""
    prompt_tokens: int = 0
    """Prompt length (informational; TTFT residuals absorb it)."""
    ttft_batch_size: float | None = None
    """Running requests when its first token came out, which is the load its
    TTFT met (None: ``batch_size``). At a load change the two can differ: a
    request that ends at its first token just as seven others arrive can
    report the batch from before them, behind the TTFT of a full batch."""

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.tpot_s < 0:
            raise ValueError(
                f"Observation TTFT/TPOT must be >= 0 seconds (got ttft_s={self.ttft_s}, "
                f"tpot_s={self.tpot_s}); pass seconds, not milliseconds or negatives"
            )
        if self.output_tokens < 0 or self.num_drafts < 0 or self.num_draft_tokens < 0:
            raise ValueError("Observation counts must be >= 0")
        if self.batch_size < 0:
            raise ValueError("Observation.batch_size must be >= 0 (running requests)")
        if self.latency_class not in LATENCY_CLASSES:
            raise ValueError(
                f"latency_class {self.latency_class!r} unknown; use one of {LATENCY_CLASSES}"
            )

    @classmethod
    def from_speculative_stats(
        cls,
        stats,
        *,
        latency_class: LatencyClass,
        ttft_s: float,
        tpot_s: float,
        output_tokens: int,
        batch_size: float,
        prompt_tokens: int = 0,
        ttft_batch_size: float | None = None,
    ) -> "Observation":
        """From the proto's ``SpeculativeStats`` (or anything with its fields:
        enabled, parallel_drafting, num_speculative_tokens, num_drafts,
        num_draft_tokens, accepted_per_position)."""
        enabled = bool(getattr(stats, "enabled", False)) and int(stats.num_speculative_tokens) > 0
        config = SpecConfig(bool(stats.parallel_drafting), int(stats.num_speculative_tokens)) if enabled \
            else SpecConfig.off()
        return cls(
            latency_class=latency_class, ttft_s=ttft_s, tpot_s=tpot_s, output_tokens=output_tokens,
            batch_size=batch_size, config=config,
            num_drafts=int(stats.num_drafts) if enabled else 0,
            num_draft_tokens=int(stats.num_draft_tokens) if enabled else 0,
            accepted_per_position=tuple(int(v) for v in stats.accepted_per_position) if enabled else (),
            prompt_tokens=prompt_tokens, ttft_batch_size=ttft_batch_size,
        )

    def to_dict(self) -> dict:
        """JSON-ready (``controller.observations_file``; ``from_dict`` reads it back)."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["config"] = {"parallel": self.config.parallel, "k": self.config.k}
        for f in ("accepted_per_position", "draft_tokens_per_position", "accepted_histogram"):
            d[f] = list(d[f])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Observation":
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        fields["config"] = SpecConfig(**d["config"])
        for f in ("accepted_per_position", "draft_tokens_per_position", "accepted_histogram"):
            fields[f] = tuple(fields.get(f, ()))
        return cls(**fields)

    # -- derived --------------------------------------------------------------
    def accepted_prefix_counts(self) -> list[int]:
        """``accepted_per_position``, derived from the histogram when needed."""
        if self.accepted_per_position:
            return [int(v) for v in self.accepted_per_position]
        if self.accepted_histogram:
            h = list(self.accepted_histogram)
            # steps that accepted more than i drafts accepted position i+1
            return [sum(h[i + 1 :]) for i in range(len(h) - 1)]
        return []

    @property
    def drafts(self) -> int:
        if self.num_drafts:
            return self.num_drafts
        return sum(self.accepted_histogram) if self.accepted_histogram else 0

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.accepted_prefix_counts())

    @property
    def mean_k(self) -> float:
        """K actually drafted per step (differs from ``config.k`` under a schedule)."""
        d = self.drafts
        if d and self.num_draft_tokens:
            return self.num_draft_tokens / d
        return float(self.config.k)

    @property
    def acceptance_length(self) -> float:
        """Tokens per verification step, bonus token included."""
        d = self.drafts
        return 1.0 + self.num_accepted_tokens / d if d else 1.0

    @property
    def step_time_s(self) -> float:
        """Seconds per engine step for this request: TPOT x tokens per step."""
        return self.tpot_s * self.acceptance_length


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine-level gauges, sampled by the server (e.g. every second)."""

    running: int
    """Requests being decoded (vLLM ``num_running_reqs``)."""
    waiting: int = 0
    """Requests queued for admission (vLLM ``num_waiting_reqs``)."""
    kv_cache_usage: float = 0.0
    """Fraction of KV-cache blocks in use, 0..1 (vLLM ``kv_cache_usage``)."""
    preemptions: int = 0
    """Preemptions since the previous snapshot (memory pressure signal)."""
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.running < 0 or self.waiting < 0:
            raise ValueError("EngineSnapshot running/waiting must be >= 0")
        if not 0.0 <= self.kv_cache_usage <= 1.0 + 1e-9:
            raise ValueError(
                f"EngineSnapshot.kv_cache_usage={self.kv_cache_usage} must be a fraction "
                "0..1 (divide a percentage by 100)"
            )
