"""Live speculative switching on one engine: what a switch costs, and whether
a live engine runs each setting as fast as an engine built for it.

    quickdraft bench live-switch [--config TOML] [--set section.field=value ...]
        [--configs "off,parallel K=1,...,autoregressive K=7"] [--concurrency 1,8]
        [--requests 16] [--max-tokens 64] [--switches 300] [--static "parallel K=5,off"] [--json OUT]

1. One live engine (speculation.live_switching, K up to speculation.max_k)
   serves every setting in ``--configs`` it can run, switched live, in
   interleaved rounds (round r runs every setting once), at each concurrency:
   TPOT (decode time over decode tokens) and TTFT per setting.
2. Switch latency under load: ``--switches`` switches, cycling through the
   settings, while ``max(concurrency)`` streams decode; each is the engine-core
   round trip of one switch, put beside the step time (TPOT) of the same load.
3. Each ``--static`` setting then gets an engine built for it alone (a plain
   engine for ``off``: no drafter), as ``vllm serve`` would run it, at the same
   concurrency levels: the live/static TPOT ratio says what live switching costs.
4. ``--after-switch A,B,...``: streams decode without pause while the engine
   switches to the next of those settings every ``--after-switch-period``
   seconds; TPOT in bins of time since the switch, per transition, over the
   last bin's: what the steps right after a switch cost (the requests in
   flight when drafting resumes after ``off`` draft from holes in the
   drafter's KV cache, for one).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quickdraft.server.config import QuickdraftConfig, load_config
from quickdraft.server.engine import Engine, hardware_description, vllm_version
from quickdraft.server.speculative import SpecConfig, default_candidates

DATA = Path(__file__).resolve().parent / "data" / "heldout_prompts.jsonl"
DEFAULT_CONFIGS = ",".join(c.label() for c in default_candidates())


@dataclass
class Level:
    """One setting at one concurrency."""

    label: str
    concurrency: int
    engine: str  # "live" or "static"
    decode_seconds: float = 0.0
    decode_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)

    @property
    def tpot_ms(self) -> float:
        return 1e3 * self.decode_seconds / max(1, self.decode_tokens)


def prompt_ids(engine: Engine, n: int, prompt_tokens: int = 400) -> list[list[int]]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:n]]
    tok = engine.tokenizer
    return [tok(r["prefix"][-3000:])["input_ids"][-prompt_tokens:] for r in rows]


async def outputs(engine: Engine, ids: list[int], rid: str, max_tokens: int):
    """(arrival time, tokens) of each output of one greedy request."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    async for out in engine.generate(rid, ids, sampling):
        yield time.perf_counter(), len(out.outputs[0].token_ids)


async def one_request(engine: Engine, ids: list[int], rid: str, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, decode s, decode tokens) of one greedy request."""
    t0 = time.perf_counter()
    first = last = None
    n = 0
    async for now, tokens in outputs(engine, ids, rid, max_tokens):
        if first is None:
            first = now
        last = now
        n += tokens
    assert first is not None and last is not None
    return first - t0, last - first, max(0, n - 1)


async def run_level(engine: Engine, level: Level, prompts: list[list[int]], requests: int, max_tokens: int, tag: str) -> None:
    """``requests`` requests, ``level.concurrency`` at a time (closed loop)."""
    queue = list(range(requests))

    async def stream(s: int) -> None:
        while queue:
            i = queue.pop()
            ttft, dec, n = await one_request(engine, prompts[i % len(prompts)], f"{tag}-{s}-{i}", max_tokens)
            level.ttft_s.append(ttft)
            level.decode_seconds += dec
            level.decode_tokens += n

    await asyncio.gather(*(stream(s) for s in range(level.concurrency)))


async def switch_latency(engine: Engine, configs: list[SpecConfig], prompts: list[list[int]], concurrency: int,
                         switches: int, max_tokens: int) -> dict:
    """Round trips of ``switches`` live switches made while ``concurrency`` streams decode."""
    done = asyncio.Event()
    decode = Level("mixed", concurrency, "live")

    async def stream(s: int) -> None:
        i = 0
        while not done.is_set():
            ttft, dec, n = await one_request(engine, prompts[(s + i) % len(prompts)], f"sw-{s}-{i}", max_tokens)
            decode.decode_seconds += dec
            decode.decode_tokens += n
            i += 1

    streams = [asyncio.create_task(stream(s)) for s in range(concurrency)]
    await asyncio.sleep(1.0)
    lat_ms = []
    steps = []  # engine steps that ended between asking and the engine core's answer
    for i in range(switches):
        s0 = engine.snapshot.steps
        t0 = time.perf_counter()
        await engine.switch(configs[i % len(configs)])
        lat_ms.append((time.perf_counter() - t0) * 1e3)
        steps.append(engine.snapshot.steps - s0)
        await asyncio.sleep(0.005)
    done.set()
    await asyncio.gather(*streams)
    lat_ms.sort()
    return {
        "switches": len(lat_ms),
        "p50_ms": round(lat_ms[len(lat_ms) // 2], 3),
        "p99_ms": round(lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))], 3),
        "max_ms": round(lat_ms[-1], 3),
        "step_ms_meanwhile": round(decode.tpot_ms, 3),
        "steps_elapsed": {str(n): steps.count(n) for n in sorted(set(steps))},
        "concurrency": concurrency,
    }


AFTER_SWITCH_BINS_S = (0.1, 0.25, 0.5)
"""Upper edges of the bins of time since a switch; the last bin runs to the next switch."""


async def after_switch(engine: Engine, cycle: list[SpecConfig], prompts: list[list[int]], concurrency: int,
                       period_s: float, switches: int, max_tokens: int) -> dict:
    """TPOT by time since a live switch, per transition, while ``concurrency``
    streams decode without pause and the engine moves along ``cycle`` every ``period_s``."""
    if period_s <= AFTER_SWITCH_BINS_S[-1]:
        raise SystemExit(f"--after-switch-period {period_s}: use more than {AFTER_SWITCH_BINS_S[-1]} s, the last bin's start")
    done = asyncio.Event()
    gaps: list[tuple[float, int, float]] = []  # (arrival, tokens, time since the stream's previous output)

    async def stream(s: int) -> None:
        i = 0
        while not done.is_set():
            last = None
            async for now, tokens in outputs(engine, prompts[(s + i) % len(prompts)], f"as-{s}-{i}", max_tokens):
                if last is not None:
                    gaps.append((now, tokens, now - last))
                last = now
            i += 1

    streams = [asyncio.create_task(stream(s)) for s in range(concurrency)]
    await engine.switch(cycle[-1])
    await asyncio.sleep(1.0)
    marks: list[tuple[float, str]] = []  # (when the switch returned, "A -> B")
    for i in range(switches):
        before, spec = cycle[(i - 1) % len(cycle)], cycle[i % len(cycle)]
        await engine.switch(spec)
        marks.append((time.perf_counter(), f"{before.label()} -> {spec.label()}"))
        await asyncio.sleep(period_s)
    end = time.perf_counter()
    done.set()
    await asyncio.gather(*streams)
    return {"concurrency": concurrency, "period_s": period_s, "switches": switches} | bin_after_switch(gaps, marks, end, period_s)


def bin_after_switch(gaps: list[tuple[float, int, float]], marks: list[tuple[float, str]], end: float, period_s: float) -> dict:
    """TPOT per transition in bins of time since its switch: ``gaps`` are
    (arrival, tokens, time since the stream's previous output), ``marks``
    (switch time, "A -> B") in time order; outputs before the first switch or
    after ``end`` are left out. Each bin's TPOT is also given over the last bin's."""
    edges = (*AFTER_SWITCH_BINS_S, period_s)
    times = [m[0] for m in marks]
    sums: dict[str, list[list[float]]] = {}
    for t, tokens, gap in gaps:
        j = bisect.bisect_right(times, t) - 1
        if j < 0 or t > end:
            continue
        since = t - times[j]
        b = next((k for k, e in enumerate(edges) if since < e), len(edges) - 1)
        cell = sums.setdefault(marks[j][1], [[0.0, 0] for _ in edges])[b]
        cell[0] += gap
        cell[1] += tokens
    by = {}
    for key, cells in sums.items():
        tpot = [1e3 * g / n if n else None for g, n in cells]
        steady = tpot[-1]
        by[key] = {"tpot_ms": [None if x is None else round(x, 3) for x in tpot], "tokens": [n for _, n in cells],
                   "vs_steady": [None if x is None or not steady else round(x / steady, 3) for x in tpot]}
    return {"bins_s": [f"{lo}-{hi}" for lo, hi in zip((0.0, *edges[:-1]), edges)], "by_transition": by}


async def measure(cfg: QuickdraftConfig, args: argparse.Namespace) -> dict:
    wanted = [SpecConfig.parse(t) for t in args.configs.split(",") if t.strip()]
    levels = [int(c) for c in args.concurrency.split(",")]
    result: dict = {"hardware": hardware_description(), "vllm": vllm_version(), "target": cfg.target_path(),
                    "max_tokens": args.max_tokens, "requests": args.requests, "levels": []}
    start = wanted[0] if wanted[0].enabled else next((c for c in wanted if c.enabled), cfg.spec_config())
    t0 = time.monotonic()
    engine = await Engine.start(cfg, start, live=True)
    result["live_build_s"] = round(time.monotonic() - t0, 1)
    result["live_engine"] = engine.describe()
    result["decode_graphs"] = engine.decode_graphs  # full CUDA graphs for the K below max K (CUDA)
    runnable = [c for c in wanted if engine.can_switch_to(c)]
    result["skipped"] = [c.label() for c in wanted if c not in runnable]
    prompts = prompt_ids(engine, 64)
    try:
        for c in levels:
            by_label = {s.label(): Level(s.label(), c, "live") for s in runnable}
            for spec in runnable:  # warm-up: each setting's shapes once, unrecorded
                await engine.switch(spec)
                await run_level(engine, Level("warm", c, "live"), prompts, c, args.max_tokens, f"w{c}")
            for r in range(args.rounds):
                for spec in runnable:
                    await engine.switch(spec)
                    await run_level(engine, by_label[spec.label()], prompts, args.requests, args.max_tokens, f"r{r}c{c}")
                print(f"live c={c} round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{lv.label} {lv.tpot_ms:.2f}" for lv in by_label.values()), flush=True)
            result["levels"] += [asdict(lv) | {"tpot_ms": round(lv.tpot_ms, 3)} for lv in by_label.values() if lv.decode_tokens]
        if args.switches:
            result["switch_latency"] = await switch_latency(engine, runnable, prompts, max(levels), args.switches, args.max_tokens)
            print("switch latency:", result["switch_latency"], flush=True)
        if args.after_switch:
            cycle = [SpecConfig.parse(t) for t in args.after_switch.split(",") if t.strip()]
            if refused := [c.label() for c in cycle if not engine.can_switch_to(c)]:
                raise SystemExit(f"--after-switch: this live engine cannot run {', '.join(refused)}")
            result["after_switch"] = []
            for c in levels:
                res = await after_switch(engine, cycle, prompts, c, args.after_switch_period, args.after_switch_count,
                                         args.after_switch_tokens)
                result["after_switch"].append(res)
                print(f"after a switch, c={c}:", json.dumps(res["by_transition"]), flush=True)
    finally:
        await asyncio.to_thread(engine.shutdown)
    for text in [t for t in args.static.split(",") if t.strip()]:
        spec = SpecConfig.parse(text)
        t0 = time.monotonic()
        static = await Engine.start(cfg, spec, live=False)
        build_s = round(time.monotonic() - t0, 1)
        try:
            for c in levels:
                await run_level(static, Level("warm", c, "static"), prompts, c, args.max_tokens, f"sw{c}")
                lv = Level(spec.label(), c, "static")
                for r in range(args.rounds):
                    await run_level(static, lv, prompts, args.requests, args.max_tokens, f"s{r}c{c}")
                result["levels"].append(asdict(lv) | {"tpot_ms": round(lv.tpot_ms, 3), "build_s": build_s})
                print(f"static {spec.label()} c={c}: {lv.tpot_ms:.2f} ms", flush=True)
        finally:
            await asyncio.to_thread(static.shutdown)
    return result


def table(result: dict) -> str:
    rows = {}
    for lv in result["levels"]:
        rows.setdefault((lv["label"], lv["engine"]), {})[lv["concurrency"]] = lv
    levels = sorted({lv["concurrency"] for lv in result["levels"]})
    live = {(lbl, c): v for (lbl, eng), by_c in rows.items() if eng == "live" for c, v in by_c.items()}
    lines = ["| setting | engine | " + " | ".join(f"TPOT ms c={c} | TTFT p50 ms c={c}" for c in levels) + " | live / static TPOT |",
             "|---|---|" + "---:|---:|" * len(levels) + "---|"]
    for (label, eng), by_c in rows.items():
        cells = []
        for c in levels:
            lv = by_c.get(c)
            cells += ["-", "-"] if lv is None else [f"{lv['tpot_ms']:.2f}", f"{1e3 * statistics.median(lv['ttft_s']):.0f}"]
        ratio = ""
        if eng == "static":
            ratio = ", ".join(f"c={c}: {live[(label, c)]['tpot_ms'] / by_c[c]['tpot_ms']:.3f}" for c in levels
                              if (label, c) in live and c in by_c)
        lines.append(f"| {label} | {eng} | " + " | ".join(cells) + f" | {ratio} |")
    sw = result.get("switch_latency")
    if sw:
        lines.append("")
        lines.append(f"Switch latency under {sw['concurrency']} streams, {sw['switches']} switches: p50 {sw['p50_ms']} ms, "
                     f"p99 {sw['p99_ms']} ms, max {sw['max_ms']} ms; TPOT meanwhile {sw['step_ms_meanwhile']} ms; "
                     f"engine steps that ended while a switch was on its way (count of switches): {sw['steps_elapsed']}.")
    for res in result.get("after_switch", []):
        lines += ["", f"After a switch, {res['concurrency']} streams, {res['switches']} switches every {res['period_s']} s: "
                  "TPOT ms by seconds since the switch (over the last bin's)", "",
                  "| transition | " + " | ".join(res["bins_s"]) + " |", "|---|" + "---:|" * len(res["bins_s"])]
        for key, v in res["by_transition"].items():
            cells = ["-" if t is None else f"{t:.2f} ({r:.2f}x)" if r is not None else f"{t:.2f}"
                     for t, r in zip(v["tpot_ms"], v["vs_steady"])]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="server config TOML")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="settings to run live, comma-separated")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=16, help="requests per setting, level and round")
    p.add_argument("--rounds", type=int, default=2, help="0: part 1 only warms each setting up")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--switches", type=int, default=300)
    p.add_argument("--static", default="parallel K=5,off", help="settings to also run on engines built for them alone")
    p.add_argument("--after-switch", default="", metavar="A,B,...",
                   help="settings to cycle through while streams decode, to measure TPOT by time since a switch")
    p.add_argument("--after-switch-period", type=float, default=1.0, help="seconds between those switches")
    p.add_argument("--after-switch-count", type=int, default=40, help="switches per concurrency level")
    p.add_argument("--after-switch-tokens", type=int, default=256, help="max tokens of the decoding streams' requests")
    p.add_argument("--json", help="write the results here")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(path=args.config, overrides=dict(s.split("=", 1) for s in args.set))
    result = asyncio.run(measure(cfg, args))
    text = table(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result | {"table": text}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="quickdraft bench live-switch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
