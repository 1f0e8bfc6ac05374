"""Does leaving an off that skipped the drafter's pass slow what follows?

    .venv/bin/python bench/experiments/resume_after_skip.py [--rounds 2]   (about 3 minutes a round on 2 cores)

With ``speculation.skip_drafter_when_off`` the drafter's KV is not written
while off, and the engine moves to a new prefix-cache salt when drafting
resumes (server/engine.py, ``Engine.draft_epoch``). One live engine per
setting, on the embedded model with its P-EAGLE head, driven below the
service: A, parallel K=5 at 1 stream; B, off at 8 streams; C, parallel K=5
at 1 stream again. Printed per step: token-weighted TPOT and median TTFT in
10-s bins, then C / A for each setting. The settings alternate within a
round, so a drift of the machine shows in both. The answer is in
docs/vllm-notes.md ("A K=0 step costs more than a plain engine's step").
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from quickdraft.bench.workload import load_prompts
from quickdraft.server.config import load_config
from quickdraft.server.speculative import SpecConfig

STEPS = (("A: p5, 1 stream", SpecConfig(True, 5), 1, 30.0),
         ("B: off, 8 streams", SpecConfig.off(), 8, 30.0),
         ("C: p5, 1 stream", SpecConfig(True, 5), 1, 40.0))
BIN_S = 10.0


def run(skip: bool, prompts: list[dict]) -> dict[str, list[tuple[float, float, float, int]]]:
    """(start s, TTFT ms, decode ms, decode tokens) of every request, per step."""
    from vllm import SamplingParams

    from quickdraft.server.engine import Engine

    cfg = load_config(env={})
    cfg.model.drafter = cfg.drafter_path(True)  # one head for every setting: all of them live
    cfg.speculation.skip_drafter_when_off = skip
    cfg.validate()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def call(coro, timeout: float = 900.0):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    engine = call(Engine.start(cfg, SpecConfig(True, 5), live=True))
    ids = [engine.tokenizer(p["prefix"])["input_ids"] for p in prompts]
    sampling = SamplingParams(max_tokens=48, temperature=0.0)
    rows: dict[str, list] = {}
    counter = iter(range(10**9))

    async def one(label: str, t_step: float) -> None:
        i = next(counter)
        t0 = time.perf_counter()
        first, n = None, 0
        async for out in engine.generate(f"req-{i}", ids[i % len(ids)], sampling):
            first = first or time.perf_counter()
            n = len(out.outputs[0].token_ids)
        end = time.perf_counter()
        if first is not None and n > 1:
            rows[label].append((t0 - t_step, (first - t0) * 1e3, (end - first) * 1e3, n - 1))

    async def step(label: str, spec: SpecConfig, streams: int, seconds: float) -> None:
        await engine.switch(spec)
        rows[label] = []
        t_step = time.perf_counter()
        stop = t_step + seconds

        async def stream() -> None:
            while time.perf_counter() < stop:
                await one(label, t_step)

        await asyncio.gather(*(stream() for _ in range(streams)))

    try:
        call(step("warm-up", SpecConfig(True, 5), 1, 5.0))
        for label, spec, streams, seconds in STEPS:
            call(step(label, spec, streams, seconds))
    finally:
        engine.shutdown()
        loop.call_soon_threadsafe(loop.stop)
    return rows


def tpot(rows: list[tuple[float, float, float, int]]) -> float:
    return sum(r[2] for r in rows) / max(1, sum(r[3] for r in rows))


def report(skip: bool, rows: dict[str, list]) -> float:
    for label, *_ in STEPS:
        rs = rows[label]
        bins = sorted({int(r[0] // BIN_S) for r in rs})
        cells = []
        for b in bins:
            x = [r for r in rs if int(r[0] // BIN_S) == b]
            cells.append(f"{b * BIN_S:.0f}s {tpot(x):.2f}/{statistics.median(r[1] for r in x):.0f}")
        print(f"skip={skip!s:5} {label:18s} TPOT {tpot(rs):.2f} ms, TTFT p50 {statistics.median(r[1] for r in rs):.0f} ms"
              f" | bins TPOT/TTFT: {'  '.join(cells)}", flush=True)
    ratio = tpot(rows[STEPS[2][0]]) / tpot(rows[STEPS[0][0]])
    print(f"skip={skip!s:5} C / A TPOT {ratio:.3f}", flush=True)
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    prompts = load_prompts(200)
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for skip in ((True, False) if r % 2 == 0 else (False, True)):
            ratios[skip].append(report(skip, run(skip, prompts)))
    for skip, xs in ratios.items():
        print(f"skip={skip!s:5} C / A over {len(xs)} round(s): " + ", ".join(f"{x:.3f}" for x in xs))


if __name__ == "__main__":
    main()
