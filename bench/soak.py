"""Bounded soak on loopback: N concurrent completion streams for a fixed time.

    python -m quickdraft.bench.soak [--server 127.0.0.1:50051 --server-pid PID]
                                    [--concurrency 16] [--seconds 180] [--warmup-seconds 30]
                                    [--cancel-share 0.1] [--out soak.json]

Without --server it starts ``quickdraft serve`` (embedded model) as a child
process on a free loopback port and stops it with SIGTERM at the end (its exit
code is reported). Loopback only: other hosts are refused. Bounded in time
(--seconds, at most one hour) and in count (--max-requests); it stops by itself.

Workers send held-out code (bench/data/heldout_prompts.jsonl) as FIM or plain
prefix requests, back to back. A share of requests (--cancel-share) is
cancelled by the client within milliseconds of starting, as editors do; those
are counted as cancellations. Every other request that does not end with a
final message is a failure (target: 0).

Reported (and written as JSON): requests, completions, cancellations,
failures by status; RSS of the server process and of its engine processes
sampled every few seconds, with the growth after warm-up (last minute's mean
minus the first post-warm-up minute's mean) and the least-squares slope;
TTFT (client-measured, and server-measured from the final message) and TPOT
(server-measured) percentiles p50/p95/p99 over all samples after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from quickdraft.bench.servers import free_port
from quickdraft.bench.workload import load_prompts

MAX_SECONDS = 3600


def percentiles(xs: list[float]) -> dict:
    """p50/p95/p99 (nearest rank, from all samples), mean, max, n."""
    if not xs:
        return {"n": 0}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]

    return {"n": len(s), "p50": round(q(50), 2), "p95": round(q(95), 2), "p99": round(q(99), 2), "mean": round(sum(s) / len(s), 2), "max": round(s[-1], 2)}


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return None if den == 0 else 60 * sum((t - mt) * (v - mv) for t, v in points) / den


def rss_mb(pid: int | None) -> tuple[float | None, float | None, dict]:
    """(server process RSS, RSS of its engine processes (children named VLLM::*), RSS by engine process name), MB."""
    if pid is None:
        return None, None, {}
    import psutil

    try:
        p = psutil.Process(pid)
        by_name: dict[str, float] = {}
        for c in p.children(recursive=True):
            try:
                name = c.name()
                if name.startswith("VLLM"):
                    by_name[name] = round(by_name.get(name, 0.0) + c.memory_info().rss / 2**20, 1)
            except psutil.Error:
                pass
        return p.memory_info().rss / 2**20, sum(by_name.values()), by_name
    except psutil.Error:
        return None, None, {}


def start_server(port: int, log_path: Path, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "quickdraft", "serve", "--port", str(port), "--metrics-port", "0", *extra], stdout=log, stderr=subprocess.STDOUT, env=env)


async def wait_serving(address: str, timeout: float, proc: subprocess.Popen | None) -> None:
    from quickdraft.bench.servers import wait_address_serving

    def alive() -> None:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"soak: the server exited with {proc.returncode} while starting")

    if not await wait_address_serving(address, timeout, alive):
        raise SystemExit(f"soak: {address} not serving after {timeout:.0f} s")


class Soak:
    def __init__(self, args, address: str, server_pid: int | None):
        self.args = args
        self.address = address
        self.server_pid = server_pid
        self.prompts = load_prompts(200, prefix_chars=1200, suffix_chars=400)
        self.rng = random.Random(args.seed)
        self.outcomes: Counter = Counter()
        self.failures: Counter = Counter()
        self.ttft_client_ms: list[float] = []
        self.ttft_server_ms: list[float] = []
        self.tpot_server_ms: list[float] = []
        self.e2e_ms: list[float] = []
        self.tokens = 0
        self.rss: list[dict] = []
        self.started = 0.0
        self.requests = 0

    def measuring(self) -> bool:
        return time.monotonic() - self.started >= self.args.warmup_seconds

    async def worker(self, stub, metadata, stop_at: float, wid: int) -> None:
        import grpc
        import grpc.aio

        from quickdraft.v1 import completion_pb2 as pb

        while time.monotonic() < stop_at and self.requests < self.args.max_requests:
            self.requests += 1
            p = self.prompts[self.rng.randrange(len(self.prompts))]
            req = pb.CompleteRequest(prefix=p["prefix"], max_tokens=self.args.max_tokens, request_id=f"soak-{wid}-{self.requests}")
            if p["suffix"] is not None:
                req.suffix = p["suffix"]
            cancel = self.rng.random() < self.args.cancel_share
            measure = self.measuring()
            t0 = time.perf_counter()
            call = stub.Complete(req, timeout=self.args.request_timeout, metadata=metadata)
            first = None
            final = None
            try:
                if cancel:
                    await asyncio.sleep(self.rng.uniform(0, 0.02))
                    call.cancel()
                async for msg in call:
                    if msg.text and first is None:
                        first = time.perf_counter()
                    if msg.HasField("final"):
                        final = msg.final
                if final is None and not cancel:
                    self.failures["stream ended without a final message"] += 1
                    self.outcomes["failed"] += 1
                    continue
            except asyncio.CancelledError:
                if not cancel:
                    raise
            except grpc.aio.AioRpcError as e:
                if not (cancel and e.code() == grpc.StatusCode.CANCELLED):
                    self.failures[f"{e.code().name}: {e.details()}"] += 1
                    self.outcomes["failed"] += 1
                    continue
            if cancel and final is None:
                self.outcomes["cancelled"] += 1
                continue
            self.outcomes["completed"] += 1
            self.tokens += final.completion_tokens
            if measure:
                if first is not None:
                    self.ttft_client_ms.append((first - t0) * 1000)
                self.ttft_server_ms.append(final.ttft_ms)
                if final.completion_tokens >= 2:
                    self.tpot_server_ms.append(final.tpot_ms)
                self.e2e_ms.append((time.perf_counter() - t0) * 1000)

    async def sampler(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            self.sample()
            await asyncio.sleep(self.args.sample_every)

    async def run(self) -> dict:
        import grpc.aio

        from quickdraft.client.request import call_metadata, channel_options
        from quickdraft.v1.completion_pb2_grpc import CompletionStub

        token = Path(self.args.token_file).read_text().strip() if self.args.token_file else os.environ.get("QUICKDRAFT_AUTH_TOKEN")
        metadata = call_metadata(token)
        self.started = time.monotonic()
        stop_at = self.started + self.args.seconds
        async with grpc.aio.insecure_channel(self.address, options=channel_options()) as ch:
            stub = CompletionStub(ch)
            sampler = asyncio.create_task(self.sampler(stop_at))
            await asyncio.gather(*(self.worker(stub, metadata, stop_at, i) for i in range(self.args.concurrency)))
            sampler.cancel()
        elapsed = time.monotonic() - self.started
        self.sample()
        return self.summary(elapsed)

    def sample(self) -> None:
        server, engine, by_name = rss_mb(self.server_pid)
        self.rss.append({"t": round(time.monotonic() - self.started, 1), "server_mb": server and round(server, 1), "engine_mb": engine and round(engine, 1),
                         "engine_by_process_mb": by_name, "completed": self.outcomes["completed"]})

    def memory(self, key: str) -> dict:
        pts = [(r["t"], r[key]) for r in self.rss if r[key] is not None and r["t"] >= self.args.warmup_seconds]
        if len(pts) < 2:
            return {}
        window = min(60.0, (pts[-1][0] - pts[0][0]) / 3)
        first = [v for t, v in pts if t <= pts[0][0] + window]
        last = [v for t, v in pts if t >= pts[-1][0] - window]
        return {
            "after_warmup_mb": round(first[0], 1), "end_mb": round(pts[-1][1], 1),
            "growth_mb": round(sum(last) / len(last) - sum(first) / len(first), 1), "window_s": round(window, 1),
            "slope_mb_per_min": None if slope_per_min(pts) is None else round(slope_per_min(pts), 2),
            # the second half alone: near 0 when growth was a cache filling up, not a leak
            "late_slope_mb_per_min": None if slope_per_min(pts[len(pts) // 2 :]) is None else round(slope_per_min(pts[len(pts) // 2 :]), 2),
            "max_mb": round(max(v for _, v in pts), 1),
        }

    def summary(self, elapsed: float) -> dict:
        done = self.outcomes["completed"]
        return {
            "address": self.address, "concurrency": self.args.concurrency, "seconds": round(elapsed, 1), "warmup_seconds": self.args.warmup_seconds,
            "max_tokens": self.args.max_tokens, "cancel_share": self.args.cancel_share,
            "requests": sum(self.outcomes.values()), "completed": done, "cancelled": self.outcomes["cancelled"], "failed": self.outcomes["failed"],
            "failures": dict(self.failures), "completion_tokens": self.tokens,
            "throughput_tokens_per_s": round(self.tokens / elapsed, 1), "completions_per_s": round(done / elapsed, 2),
            "ttft_client_ms": percentiles(self.ttft_client_ms), "ttft_server_ms": percentiles(self.ttft_server_ms),
            "tpot_server_ms": percentiles(self.tpot_server_ms), "e2e_client_ms": percentiles(self.e2e_ms),
            "rss_server": self.memory("server_mb"), "rss_engine": self.memory("engine_mb"), "rss_samples": self.rss,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quickdraft.bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", help="HOST:PORT of a running server (loopback only); default: start one")
    ap.add_argument("--server-pid", type=int, help="its process id, for memory figures (known when self-started)")
    ap.add_argument("--token-file", help="bearer token file (default: $QUICKDRAFT_AUTH_TOKEN)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--warmup-seconds", type=float, default=30)
    ap.add_argument("--max-requests", type=int, default=200_000)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--cancel-share", type=float, default=0.1)
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--sample-every", type=float, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for the self-started `quickdraft serve` (repeatable)")
    ap.add_argument("--out", default="soak.json")
    args = ap.parse_args(argv)
    if not 0 < args.seconds <= MAX_SECONDS:
        ap.error(f"--seconds must be in (0, {MAX_SECONDS}]")
    if not 1 <= args.concurrency <= 256:
        ap.error("--concurrency must be in 1..256")
    if not 0 <= args.cancel_share <= 1:
        ap.error("--cancel-share must be in [0, 1]")

    from quickdraft.server.config.validation import is_loopback

    proc = None
    if args.server:
        host = args.server.rsplit(":", 1)[0].strip("[]")
        if not is_loopback(host):
            ap.error(f"--server {args.server}: loopback only (this is a load generator)")
        address, pid = args.server, args.server_pid
    else:
        port = free_port()
        log_path = Path(args.out).with_suffix(".server.log")
        proc = start_server(port, log_path, args.serve_arg)
        address, pid = f"127.0.0.1:{port}", proc.pid
        print(f"soak: started quickdraft serve on {address} (pid {pid}, log {log_path})", flush=True)
    exit_code = None
    try:
        asyncio.run(wait_serving(address, 600, proc))
        print(f"soak: {args.concurrency} streams for {args.seconds:.0f} s against {address} (warm-up {args.warmup_seconds:.0f} s)", flush=True)
        result = asyncio.run(Soak(args, address, pid).run())
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                exit_code = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                exit_code = "killed after 120 s"
    from quickdraft.server.engine import hardware_description

    result["server_exit_code_after_sigterm"] = exit_code
    result["machine"] = f"{hardware_description()}, load average at end {os.getloadavg()[0]:.1f}"
    Path(args.out).write_text(json.dumps(result, indent=2))
    brief = {k: v for k, v in result.items() if k != "rss_samples"}
    print(json.dumps(brief, indent=2))
    print(f"soak: wrote {args.out}")
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
