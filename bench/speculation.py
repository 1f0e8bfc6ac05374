"""Acceptance and TPOT of each speculative config on held-out code, batch 1.

    python -m quickdraft.bench.speculation [--prompts 24] [--max-tokens 64] [--out DIR]

For speculation off, autoregressive EAGLE-3 K in {1,3,5,7} and P-EAGLE K in
{1,3,5,7}: a real vLLM engine on this machine serves the same held-out
prompts (bench/data/heldout_prompts.jsonl: code from distributions held out of
training) one at a time, greedy. Reported per config: mean acceptance length
(tokens per target step, bonus included), acceptance per draft position
(share of verify steps whose draft at that position was accepted), and TPOT
as a ratio to no speculation measured in the same run. Configs run in
interleaved rounds so that machine noise spreads over all of them.

This regenerates the table in quickdraft/models/embedded/MODEL_CARD.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quickdraft.bench.workload import load_prompts
from quickdraft.server.engine import Engine, hardware_description, vllm_version
from quickdraft.server.speculative import SpecConfig, default_candidates

CONFIGS = list(default_candidates())


@dataclass
class ConfigResult:
    label: str
    parallel: bool
    k: int
    requests: int = 0
    tokens: int = 0
    decode_seconds: float = 0.0  # sum over requests of (last token - first token)
    decode_tokens: int = 0  # sum of (tokens - 1)
    ttft: list[float] = field(default_factory=list)
    drafts: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    engine_start_s: list[float] = field(default_factory=list)

    def add_request(self, t0: float, first: float | None, last: float | None, tokens: int) -> None:
        """One request's timing: sent at t0, first and last token times, tokens streamed."""
        self.requests += 1
        self.tokens += tokens
        if first is not None:
            self.ttft.append(first - t0)
        if tokens >= 2 and last is not None and first is not None:
            self.decode_seconds += last - first
            self.decode_tokens += tokens - 1

    @property
    def tpot_ms(self) -> float:
        return 1000 * self.decode_seconds / max(1, self.decode_tokens)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [n / self.drafts for n in self.accepted_per_position] if self.drafts else []


async def run_config(cfg, spec: SpecConfig, prompts: list[dict], max_tokens: int, res: ConfigResult) -> None:
    from quickdraft.server.preparation import Sampling
    from quickdraft.server.prompt_tokens import tokenize
    from quickdraft.v1 import completion_pb2 as pb

    engine = await Engine.start(cfg, spec)
    res.engine_start_s.append(engine.start_seconds)
    try:
        sampling = Sampling(max_tokens=max_tokens, temperature=0.0, top_p=1.0, stop=[], seed=None).to_vllm(engine.stop_token_ids)
        reqs = []
        for p in prompts:
            kw = {"suffix": p["suffix"]} if p["suffix"] is not None else {}
            reqs.append(tokenize(engine.prompt_tokens, pb.CompleteRequest(prefix=p["prefix"], **kw), cfg.preset.prompt_format))
        # Warm-up: first requests pay one-time costs.
        async for _ in engine.generate("warmup", reqs[0], sampling):
            pass
        for i, ids in enumerate(reqs):
            t0 = time.perf_counter()
            first = last = None
            n = 0
            metrics = None
            async for out in engine.generate(f"r{i}-{time.monotonic_ns()}", ids, sampling):
                c = out.outputs[0]
                now = time.perf_counter()
                if c.token_ids:
                    first = first or now
                    last = now
                    n += len(c.token_ids)
                if c.finish_reason is not None:
                    metrics = c.spec_decode_metrics
            res.add_request(t0, first, last, n)
            if metrics is not None:
                hist = list(metrics.histogram)
                res.drafts += sum(hist)
                res.accepted += sum(j * c for j, c in enumerate(hist))
                per = [sum(hist[p:]) for p in range(1, len(hist))]
                if len(res.accepted_per_position) < len(per):
                    res.accepted_per_position += [0] * (len(per) - len(res.accepted_per_position))
                for j, v in enumerate(per):
                    res.accepted_per_position[j] += v
    finally:
        engine.shutdown()


def table(results: list[ConfigResult]) -> str:
    base = next(r for r in results if r.k == 0)
    lines = [
        "| config | mean acceptance length | acceptance per position | TPOT ms | TPOT speed-up vs off | TTFT ms (median) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        per = " / ".join(f"{a:.0%}" for a in r.acceptance_per_position) or "-"
        mal = f"{r.mean_acceptance_length:.2f}" if r.k >= 0 else "-"
        ttft = f"{1000 * statistics.median(r.ttft):.0f}" if r.ttft else "-"
        lines.append(f"| {r.label} | {mal} | {per} | {r.tpot_ms:.2f} | {base.tpot_ms / r.tpot_ms:.2f}x | {ttft} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds over all configs")
    ap.add_argument("--configs", default="all", help="comma list of labels like off,ar3,p5 (default all)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/speculation"))
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config overrides, e.g. engine.extra_args={\"async_scheduling\": true}")
    ap.add_argument("--llama-cpp", type=Path, metavar="GGUF",
                    help="also llama.cpp on this GGUF, prefix-only prompts, in the same rounds (bench/llama_cpp.py)")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from quickdraft.server.config import load_config

    cfg = load_config(env={}, overrides=dict(item.split("=", 1) for item in args.set))
    cfg.validate()
    configs = CONFIGS
    if args.configs != "all":
        wanted = set(args.configs.split(","))
        configs = [m for m in CONFIGS if short(m) in wanted]
    prompts = load_prompts(args.prompts)
    results = {short(m): ConfigResult(label=m.label(), parallel=m.parallel, k=m.k) for m in configs}
    if args.llama_cpp:
        from quickdraft.bench import llama_cpp

        results[llama_cpp.LABEL] = ConfigResult(label=f"{llama_cpp.LABEL} ({args.llama_cpp.name}, prefix only)", parallel=False, k=-1)
    bar = tqdm(total=len(results) * args.rounds, desc="configs", unit="engine")
    t0 = time.time()
    for _ in range(args.rounds):
        for m in configs:
            asyncio.run(run_config(cfg, m, prompts, args.max_tokens, results[short(m)]))
            bar.update(1)
        if args.llama_cpp:
            llama_cpp.run(args.llama_cpp, prompts, args.max_tokens, results[llama_cpp.LABEL])
            bar.update(1)
    bar.close()
    ordered = [results[short(m)] for m in configs] + ([results[llama_cpp.LABEL]] if args.llama_cpp else [])
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "command": " ".join(["python -m quickdraft.bench.speculation", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": hardware_description(),
        "vllm": vllm_version(),
        "target": cfg.target_path(),
        "llama_cpp": llama_cpp.version() if args.llama_cpp else None,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "wall_s": round(time.time() - t0, 1),
        "results": [
            {
                **{k: v for k, v in asdict(r).items() if k != "ttft"},
                "tpot_ms": r.tpot_ms,
                "mean_acceptance_length": r.mean_acceptance_length,
                "acceptance_per_position": r.acceptance_per_position,
                "ttft_ms_median": 1000 * statistics.median(r.ttft) if r.ttft else None,
            }
            for r in ordered
        ],
    }
    (args.out / "speculation.json").write_text(json.dumps(report, indent=1))
    md = table(ordered)
    (args.out / "speculation.md").write_text(md + "\n")
    print(md)
    return 0


def short(m: SpecConfig) -> str:
    return "off" if not m.enabled else f"{'p' if m.parallel else 'ar'}{m.k}"


if __name__ == "__main__":
    sys.exit(main())
