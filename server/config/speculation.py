"""[speculation]: the speculative-decoding setup the server starts with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeculationConfig:
    """Speculative decoding: the drafter proposes K tokens, the target verifies them in one step."""

    enabled: bool = True
    """False serves the target alone."""
    num_speculative_tokens: int | None = None
    """K: tokens drafted per verification step. None: the preset's (5 for the
    embedded and Qwen3-Coder presets)."""
    parallel_drafting: bool | None = None
    """True: P-EAGLE, all K drafts in one drafter pass (vLLM >= 0.16).
    False: EAGLE-3, K sequential drafter passes. None: the preset's."""
    per_batch_size: list[tuple[int, int, int]] | None = None
    """Optional K schedule by batch size: [(min_batch, max_batch, K), ...],
    inclusive; vLLM picks K each step from the number of scheduled requests."""
    rejection_sample_method: str = "standard"
    """"standard", or "synthetic" (accept at set rates; for timing studies
    with random weights; not supported by vLLM's CPU sampler)."""
    synthetic_acceptance_rates: list[float] | None = None
    """Per-position unconditional acceptance rates for "synthetic" (position
    1 first, non-increasing); the first K are used. Applies to autoregressive
    drafting, and to parallel drafting unless the next field is set."""
    synthetic_acceptance_rates_parallel: list[float] | None = None
    """As above, for parallel drafting (P-EAGLE accepts a little less per
    position than EAGLE-3). None: `synthetic_acceptance_rates`."""
    live_switching: bool = True
    """Build engines that change K, the K schedule and the drafting mode
    between two engine steps (server/vllm_live.py, vLLM 0.24.0 and 0.32.0),
    instead of rebuilding the engine for each change. A change of drafter
    (a preset with a separate EAGLE-3 head), a K above `max_k`, or speculation
    off on a plain engine still needs another engine."""
    max_k: int = 7
    """Largest K a live engine can run without a rebuild (its vLLM
    `num_speculative_tokens`). Larger costs a little memory per request."""
    live_decode_graphs: bool = True
    """On CUDA, capture full CUDA graphs for decode steps at every K from 0
    to `max_k` when a live engine starts (vLLM captures them only at
    `max_k`; other K then run piecewise graphs, about 2x slower per step at
    one stream on an H200). Costs start-up seconds and a little GPU memory,
    both logged. No effect on the CPU build, which has no graphs."""
    skip_drafter_when_off: bool = True
    """On a live engine, speculation off (K=0 at every batch size) skips the
    drafter's pass. vLLM runs it even at K=0 so that the drafter's KV cache
    stays valid for when K returns; skipped, the requests running across an
    off period draft worse after it (never differently: the target verifies
    every draft), and prefix-cache blocks computed while off are not reused
    once drafting resumes. false: vLLM's K=0, which on the CPU build costs
    1.4-1.7x a plain engine's step."""
    off_engine: str = "auto"
    """How speculation off is served while live switching is on: "live"
    (K=0 on the speculative engine: instant, but each step still runs the
    drafter's first pass), "plain" (an engine without a drafter: a rebuild or
    a standby engine), or "auto" ("live" where a second engine does not fit
    beside the first, i.e. on a GPU with engine.gpu_memory_utilization above
    0.5; "plain" elsewhere)."""
