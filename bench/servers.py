"""Servers the benchmarks start and stop: ``quickdraft serve`` with config
overrides, and upstream ``vllm serve`` as the peer. Each runs as a child
process in its own session on a free loopback port, so the load generator's
event loop never shares a GIL with the server it measures, and stopping it
(SIGTERM to its process group, then SIGKILL) also stops vLLM's engine-core
process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

START_TIMEOUT_S = 900.0  # engine starts take 20-45 s on 2 idle cores, minutes on a busy machine


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(offline: bool = True) -> dict[str, str]:
    """A server's environment: on CPU a 1 GiB KV cache (an integer, vLLM insists);
    offline for the embedded model (nothing to download), not for hub presets
    (their first start downloads the weights)."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if offline:
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


@dataclass
class ServerProcess:
    """A started server: its address, process and log; ``stop()`` ends it."""

    label: str
    argv: list[str]
    log_path: Path
    port: int
    proc: subprocess.Popen | None = None
    start_s: float | None = None
    exit_code: int | str | None = None
    extra: dict = field(default_factory=dict)

    def launch(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()

    def ensure_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"{self.label}: server exited with {self.proc.returncode} while starting; log {self.log_path}:\n{tail}")

    def ready(self) -> None:
        self.start_s = time.monotonic() - self._t0

    def stop(self, timeout_s: float = 60.0) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            self.exit_code = None if p is None else p.returncode
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)  # our own session: the server and its engine core
        except ProcessLookupError:
            pass
        try:
            self.exit_code = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(30)
            self.exit_code = f"killed after {timeout_s:.0f} s"

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def quickdraft_server(label: str, overrides: dict[str, str], log_dir: Path, preset: str | None = None,
                      config: str | None = None) -> ServerProcess:
    """``quickdraft serve`` on a free port with ``--set`` overrides (over the TOML ``config``); metrics off."""
    port = free_port()
    argv = [sys.executable, "-m", "quickdraft", "serve", "--port", str(port), "--metrics-port", "0"]
    if config:
        argv += ["--config", config]
    if preset:
        argv += ["--preset", preset]
    for k, v in overrides.items():
        argv += ["--set", f"{k}={v}"]
    return ServerProcess(label=label, argv=argv, log_path=log_dir / f"{safe(label)}.server.log", port=port)


async def wait_address_serving(address: str, timeout_s: float, alive: Callable[[], None] = lambda: None) -> bool:
    """Wait until the gRPC health service at ``address`` says the completion service
    serves (its engine is up, not just the port); ``alive`` raises if the server died.
    False after ``timeout_s``."""
    import grpc.aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < end:
            alive()
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(service="quickdraft.v1.Completion"), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.5)
    return False


async def wait_grpc_serving(server: ServerProcess, timeout_s: float = START_TIMEOUT_S) -> None:
    if not await wait_address_serving(f"127.0.0.1:{server.port}", timeout_s, server.ensure_running):
        raise TimeoutError(f"{server.label}: not serving after {timeout_s:.0f} s (log {server.log_path})")
    server.ready()


def vllm_binary() -> list[str]:
    # Not .venv/bin/vllm: with the CPU build it cannot find its own version (bench/vllm_cli.py).
    return [sys.executable, "-m", "quickdraft.bench.vllm_cli"]


def vllm_peer(label: str, target: str, drafter: str, speculative: dict, log_dir: Path, *, served_name: str, max_model_len: int, max_num_seqs: int,
              cpu: bool = True, extra_args: list[str] | None = None) -> ServerProcess:
    """Upstream ``vllm serve`` with ``speculative`` (the drafter path is filled in).

    On the CPU build it needs float32, eager mode and a lowered memory share
    (docs/vllm-notes.md); the context window and batch size match quickdraft's
    engine so both serve the same model the same way.
    """
    port = free_port()
    spec = {**speculative, "model": drafter}
    argv = [*vllm_binary(), "serve", target, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name,
            "--speculative-config", json.dumps(spec), "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--seed", "0", "--disable-uvicorn-access-log"]
    if cpu:
        argv += ["--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.3"]
    argv += extra_args or []
    return ServerProcess(label=label, argv=argv, log_path=log_dir / f"{safe(label)}.server.log", port=port, extra={"speculative_config": spec})


async def wait_http_ready(server: ServerProcess, timeout_s: float = START_TIMEOUT_S) -> None:
    import aiohttp

    end = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as s:
        while time.monotonic() < end:
            server.ensure_running()
            try:
                async with s.get(f"http://127.0.0.1:{server.port}/v1/models") as r:
                    if r.status == 200:
                        server.ready()
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{server.label}: not ready after {timeout_s:.0f} s (log {server.log_path})")


async def scrape_spec_counters(port: int) -> dict[str, float]:
    """vLLM's speculative counters from a server's /metrics (for the peer's acceptance)."""
    import aiohttp

    wanted = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
    out = {"drafts": 0.0, "accepted": 0.0}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            try:
                out[wanted[name]] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
