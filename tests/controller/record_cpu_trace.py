"""Record a real trace for tests/controller/test_recorded_trace.py.

Runs vLLM 0.32 (CPU build) on the embedded target with both embedded
drafters, each speculative config at a few concurrencies, and writes one
JSON line per finished request (the fields of ``Observation``). Not a test;
run by hand (about 15 minutes on a 2-core box); each line also carries the
1-minute load average while it was recorded, since other work on the box
shows up in the timings:

    QD_RECORD_CORE=1 python tests/controller/record_cpu_trace.py [OUT.jsonl]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "quickdraft" / "models" / "embedded"
PROMPTS = ROOT / "bench" / "data" / "heldout_prompts.jsonl"
CONFIGS = ["off", "autoregressive K=1", "autoregressive K=3", "autoregressive K=5", "autoregressive K=7",
           "parallel K=1", "parallel K=3", "parallel K=5", "parallel K=7"]
CONCURRENCY = (1, 4)
REQUESTS = 16
MAX_TOKENS = 64


async def run_config(label: str, prompts: list[str], out) -> None:
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from quickdraft.server.speculative import SpecConfig

    cfg = SpecConfig.parse(label)
    kwargs = dict(model=str(MODELS / "target"), tokenizer=str(MODELS / "target"), dtype="float32",
                  max_model_len=2048, max_num_seqs=16, enforce_eager=True, seed=0,
                  gpu_memory_utilization=0.3, disable_log_stats=False, enable_log_requests=False)
    if cfg.enabled:
        drafter = MODELS / ("drafter-p-eagle" if cfg.parallel else "drafter-eagle3")
        kwargs["speculative_config"] = {"method": "eagle3", "model": str(drafter),
                                        "num_speculative_tokens": cfg.k, "parallel_drafting": cfg.parallel}
        kwargs["per_request_spec_decode_metrics"] = "summary"
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    tok = llm.get_tokenizer()
    try:
        sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        # warm-up, not recorded
        async for _ in llm.generate(TokensPrompt(prompt_token_ids=tok.encode(prompts[0])[-256:]), sampling, f"w-{label}"):
            pass
        for conc in CONCURRENCY:
            sem = asyncio.Semaphore(conc)
            running = 0

            async def one(i: int, text: str) -> dict:
                nonlocal running
                async with sem:
                    running += 1
                    batch_seen = []
                    ids = tok.encode(text)[-384:]
                    t0 = time.perf_counter()
                    first = last = None
                    tokens = 0
                    metrics = None
                    async for o in llm.generate(TokensPrompt(prompt_token_ids=ids), sampling, f"{label}-{conc}-{i}"):
                        now = time.perf_counter()
                        c = o.outputs[0]
                        tokens = len(c.token_ids)
                        batch_seen.append(running)
                        if first is None:
                            first = now
                        last = now
                        if c.finish_reason is not None:
                            metrics = getattr(c, "spec_decode_metrics", None)
                    running -= 1
                    hist = list(getattr(metrics, "histogram", []) or [])
                    return {
                        "config": label, "concurrency": conc, "latency_class": "inline",
                        "ttft_s": first - t0, "tpot_s": (last - first) / max(1, tokens - 1),
                        "output_tokens": tokens, "prompt_tokens": len(ids),
                        "batch_size": sum(batch_seen) / len(batch_seen),
                        "num_drafts": sum(hist), "num_draft_tokens": int(getattr(metrics, "num_draft_tokens", 0) or 0),
                        "accepted_histogram": hist,
                    }

            # the same prompts at every concurrency: acceptance depends on the
            # code being completed, and the load should not be confounded with it
            load_before = os.getloadavg()[0]
            rows = await asyncio.gather(*(one(i, prompts[i % len(prompts)]) for i in range(REQUESTS)))
            for r in rows:
                r["loadavg"] = round(max(load_before, os.getloadavg()[0]), 2)
                out.write(json.dumps(r) + "\n")
            out.flush()
            print(label, conc, "median tpot ms", sorted(r["tpot_s"] for r in rows)[len(rows) // 2] * 1e3, flush=True)
    finally:
        llm.shutdown()


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM binds its OpenMP threads to core 0 by default; other engines on a
    # shared box do too. QD_RECORD_CORE=1 moves this one to core 1.
    core = os.environ.get("QD_RECORD_CORE")
    if core:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = core
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data" / "cpu_embedded_trace.jsonl"
    prompts = [json.loads(line)["prefix"][-1500:] for line in PROMPTS.open()]
    with dest.open("w") as out:
        for label in CONFIGS:
            asyncio.run(run_config(label, prompts, out))


if __name__ == "__main__":
    main()
