"""[engine]: how vLLM runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineConfig:
    """How vLLM runs: device, parallelism, memory, batching."""

    device: str = "auto"
    """auto (a GPU when torch sees one, else the CPU build), cuda, or cpu."""
    tensor_parallel_size: int = 1
    """GPUs per model replica (vLLM tensor parallelism)."""
    data_parallel_size: int = 1
    """Model replicas inside one engine (vLLM data parallelism; vLLM then
    turns dynamic speculation off). For independent replicas, each with its
    own controller, on one machine or many, use `replicas.count`
    (docs/scaling.md)."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory vLLM may take (GPU only), in (0, 1]."""
    cpu_kv_cache_gib: int = 1
    """KV cache size on CPU, in whole GiB (sets VLLM_CPU_KVCACHE_SPACE, which
    vLLM reads as an integer)."""
    cpu_malloc_mmap_threshold_bytes: int = 0
    """glibc's mmap threshold for the CPU engine's processes (sets
    MALLOC_MMAP_THRESHOLD_ before vLLM spawns them): blocks at least this large
    get their own mapping and go back to the system when freed. A fixed value
    stops glibc from raising the threshold each time the worker frees a large
    tensor, which lets its memory grow with the variety of prompt lengths.
    1048576 (1 MiB) keeps it flat but costs speed: TTFT 1.2-1.3x at 1 stream,
    throughput 0.83x at 16 on a 2-core machine (RELIABILITY.md, Load).
    0: leave glibc's dynamic threshold (or an operator's own
    MALLOC_MMAP_THRESHOLD_) alone. At most 32 MiB, glibc's cap."""
    max_num_seqs: int = 16
    """Requests the engine batches at once; more wait in its queue. Also the
    largest batch the controller plans K schedules for."""
    enforce_eager: bool | None = None
    """None: eager on CPU, CUDA graphs on GPU (as in production)."""
    seed: int = 0
    """Engine seed (sampled requests without their own seed)."""
    extra_args: dict[str, Any] = field(default_factory=dict)
    """Passed to vLLM's AsyncEngineArgs unchanged (e.g.
    {"enable_prefix_caching": true})."""


def detect_device() -> str:
    """What engine.device = "auto" means on this machine."""
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda"
    except ImportError:
        pass
    return "cpu"
