"""The server's own cost: TTFT and TPOT through gRPC against calling the same
vLLM AsyncLLM in-process, same prompts, same engine, same process start.

    python -m quickdraft.bench.grpc_overhead [--requests 60] [--max-tokens 48]

One engine (embedded preset, parallel drafting K=5) serves both paths; requests
alternate between them, one at a time, so machine noise hits both alike. The
in-process path gets pre-tokenized prompts; the gRPC path includes everything
the server does (parse, validate, render, tokenize, admission, metrics, stream
relay) and the client's own gRPC stack. Reported: p50 TTFT difference in ms
and the TPOT ratio. Targets (issue "serve"): +2 ms TTFT at p50, +3 % TPOT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from quickdraft.bench.speculation import load_prompts


@dataclass
class Measured:
    """One request timed at the caller: TTFT, TPOT over the tokens after the
    first, tokens, and (in-process only) vLLM's per-request acceptance
    histogram (``histogram[j]`` = verify steps that accepted j drafts)."""

    ttft_s: float
    tpot_s: float | None
    tokens: int
    histogram: list[int] | None = None


async def direct(engine, ids: list[int], sampling, rid: str) -> Measured:
    """One request straight into the engine (``Engine.generate``), no server in between."""
    t0 = time.perf_counter()
    first = last = None
    n = 0
    histogram = None
    async for out in engine.generate(rid, ids, sampling):
        c = out.outputs[0]
        if c.token_ids:
            now = time.perf_counter()
            first = first or now
            last = now
            n += len(c.token_ids)
        if c.finish_reason is not None and getattr(c, "spec_decode_metrics", None) is not None:
            histogram = list(c.spec_decode_metrics.histogram)
    tpot = (last - first) / (n - 1) if n > 1 else None
    return Measured((first or time.perf_counter()) - t0, tpot, n, histogram)


def via_grpc(client, req) -> Measured:
    """One request through the gRPC server, with the sync client (its own thread, as an editor's process would be)."""
    t0 = time.perf_counter()
    first = last = None
    stream = client.complete(req)
    for _ in stream:
        now = time.perf_counter()
        first = first or now
        last = now
    n = stream.final.completion_tokens
    # Text deltas arrive per engine step, like the direct path's outputs.
    tpot = (last - first) / (n - 1) if n > 1 and first is not None else None
    return Measured((first or time.perf_counter()) - t0, tpot, n)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=60, help="per path")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=Path("bench/results/grpc_overhead"))
    args = ap.parse_args(argv)

    from quickdraft.client import CompletionClient
    from quickdraft.server.config import load_config
    from quickdraft.server.grpc_server import QuickdraftServer
    from quickdraft.server.requests import Sampling, tokenize
    from quickdraft.v1 import completion_pb2 as pb

    cfg = load_config(env={}, overrides={"server.port": 0, "telemetry.metrics_port": 0})
    cfg.validate()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result(900)  # noqa: E731
    server = QuickdraftServer(cfg)
    run(server.start())
    run(server.wait_ready(900))
    engine = server.engines.engine

    prompts = load_prompts(max(1, args.requests // 2))
    reqs = [pb.CompleteRequest(prefix=p["prefix"], max_tokens=args.max_tokens, **({"suffix": p["suffix"]} if p["suffix"] is not None else {})) for p in prompts]
    token_ids = [tokenize(engine.tokenizer, r, cfg.preset.prompt_format) for r in reqs]
    sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0, top_p=1.0, stop=[], seed=None).to_vllm(engine.stop_token_ids)

    results = {"direct": {"ttft": [], "tpot": []}, "grpc": {"ttft": [], "tpot": []}}
    with CompletionClient(f"127.0.0.1:{server.port}", timeout=120) as client:
        run(direct(engine, token_ids[0], sampling, "warm"))
        via_grpc(client, reqs[0])
        for i in range(args.requests):
            j = i % len(reqs)
            # Alternate which path goes first, so neither always follows the other.
            order = ("direct", "grpc") if i % 2 == 0 else ("grpc", "direct")
            for path in order:
                m = run(direct(engine, token_ids[j], sampling, f"d{i}")) if path == "direct" else via_grpc(client, reqs[j])
                results[path]["ttft"].append(m.ttft_s)
                if m.tpot_s is not None and m.tokens >= 4:
                    results[path]["tpot"].append(m.tpot_s)
    run(server.shutdown(1))

    d, g = results["direct"], results["grpc"]
    ttft_p50_delta_ms = 1000 * (statistics.median(g["ttft"]) - statistics.median(d["ttft"]))
    # Token-weighted means are too sensitive to a few long requests: compare medians.
    tpot_ratio = statistics.median(g["tpot"]) / statistics.median(d["tpot"])
    report = {
        "command": "python -m quickdraft.bench.grpc_overhead " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "requests_per_path": args.requests,
        "ttft_ms": {p: {"p50": 1000 * statistics.median(v["ttft"]), "p90": 1000 * percentile(v["ttft"], 0.9)} for p, v in results.items()},
        "tpot_ms": {p: {"p50": 1000 * statistics.median(v["tpot"]), "p90": 1000 * percentile(v["tpot"], 0.9)} for p, v in results.items()},
        "ttft_p50_added_ms": ttft_p50_delta_ms,
        "tpot_p50_ratio": tpot_ratio,
        "targets": {"ttft_p50_added_ms": 2.0, "tpot_p50_ratio": 1.03},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpc_overhead.json").write_text(json.dumps(report, indent=1))
    md = "\n".join(
        [
            "| path | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms |",
            "|---|---|---|---|---|",
            *(f"| {p} | {report['ttft_ms'][p]['p50']:.2f} | {report['ttft_ms'][p]['p90']:.2f} | {report['tpot_ms'][p]['p50']:.2f} | {report['tpot_ms'][p]['p90']:.2f} |" for p in ("direct", "grpc")),
            "",
            f"gRPC adds {ttft_p50_delta_ms:+.2f} ms to TTFT at p50 (target <= 2 ms); TPOT ratio gRPC/direct at p50 = {tpot_ratio:.3f} (target <= 1.03).",
        ]
    )
    (args.out / "grpc_overhead.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
