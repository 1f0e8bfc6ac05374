"""The load generator: closed loop at a fixed concurrency, or open loop with
Poisson arrivals, against a completion target; bounded in count and in time.

Targets speak one protocol each and return the same ``Result`` per request:

- ``GrpcTarget``: quickdraft's gRPC ``Complete`` stream (the raw stub, no
  client retries: a retried request would hide a failure and double its latency).
- ``OpenAITarget``: OpenAI-compatible ``/v1/completions`` streaming over HTTP
  (upstream ``vllm serve``, or ``quickdraft serve --http``); the FIM prompt is
  rendered client-side when the peer does not know quickdraft's format.

All timings are taken on the client, at the moment a message arrives: the
latency a user's editor sees, including the network stack and the server's
relay. TPOT of one request is (last token time - first token time) / (tokens - 1).
Loopback only: this is a load generator, never pointed at someone else's host.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

from quickdraft.bench.workload import Planned, Workload

REQUEST_TIMEOUT_S = 120.0


@dataclass
class Result:
    """One request as the client saw it."""

    index: int
    kind: str
    latency_class: str
    planned_cancel: bool
    outcome: str = "failed"  # ok | cancelled | failed
    error: str = ""
    start_s: float = 0.0  # since the run started
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int = 0
    decode_s: float | None = None  # last token - first token
    server_ttft_s: float | None = None
    server_tpot_s: float | None = None
    drafts: int = 0
    accepted: int = 0
    finish: str = ""

    @property
    def tpot_s(self) -> float | None:
        if self.decode_s is None or self.tokens < 2:
            return None
        return self.decode_s / (self.tokens - 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "tpot_s": self.tpot_s}


class Target(Protocol):
    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, p: Planned, run_start: float) -> Result: ...


def check_loopback(address: str) -> None:
    """Refuse anything but this machine (host:port or http://host:port/...)."""
    from urllib.parse import urlsplit

    from quickdraft.server.config.validation import is_loopback

    host = urlsplit(address).hostname if "://" in address else address.rsplit(":", 1)[0].strip("[]")
    if not host or not is_loopback(host):
        raise ValueError(f"{address}: the load generator only targets loopback addresses (127.0.0.1, ::1, localhost)")


async def _with_cancel(coro_fn: Callable[[], "asyncio.Future"], cancel_after: float | None) -> bool:
    """Run ``coro_fn()``; cancel it after ``cancel_after`` seconds. True if it was cancelled."""
    task = asyncio.ensure_future(coro_fn())
    if cancel_after is None:
        await task
        return False
    done, _ = await asyncio.wait({task}, timeout=cancel_after)
    if done:
        task.result()  # raise what it raised
        return False
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False  # it finished in the same instant


class GrpcTarget:
    """quickdraft's gRPC API."""

    def __init__(self, address: str, token: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S):
        check_loopback(address)
        self.address = address
        self.name = f"grpc://{address}"
        self.token = token
        self.timeout_s = timeout_s
        self._channel = None
        self._stub = None
        self._metadata = None

    async def open(self) -> None:
        import grpc.aio

        from quickdraft.client.request import call_metadata, channel_options
        from quickdraft.v1.completion_pb2_grpc import CompletionStub

        self._channel = grpc.aio.insecure_channel(self.address, options=channel_options())
        self._stub = CompletionStub(self._channel)
        self._metadata = call_metadata(self.token)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    def request(self, p: Planned):
        from quickdraft.v1 import completion_pb2 as pb

        t = p.task
        req = pb.CompleteRequest(
            request_id=f"bench-{p.index}",
            prefix=t.prefix,
            file_path=t.path,
            max_tokens=t.max_tokens,
            stop=list(t.stop),
            temperature=0.0,
            latency_class=pb.LATENCY_CLASS_CHAT if p.latency_class == "chat" else pb.LATENCY_CLASS_INLINE,
        )
        if t.suffix is not None:
            req.suffix = t.suffix
        return req

    async def send(self, p: Planned, run_start: float) -> Result:
        import grpc
        import grpc.aio

        res = Result(index=p.index, kind=p.task.kind, latency_class=p.latency_class, planned_cancel=p.cancel_after_s is not None)
        t0 = time.perf_counter()
        res.start_s = t0 - run_start
        first = last = None
        final = None
        call = self._stub.Complete(self.request(p), timeout=self.timeout_s, metadata=self._metadata)

        async def consume():
            nonlocal first, last, final
            async for msg in call:
                now = time.perf_counter()
                if msg.text:
                    first = first or now
                    last = now
                if msg.HasField("final"):
                    final = msg.final

        try:
            cancelled = await _with_cancel(consume, p.cancel_after_s)
            if cancelled:
                call.cancel()
                res.outcome = "cancelled"
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and p.cancel_after_s is not None and time.perf_counter() - t0 >= p.cancel_after_s:
                res.outcome = "cancelled"  # our own cancel, surfacing as the RPC's status
                return res
            res.error = f"{e.code().name}: {e.details()}"
            return res
        except asyncio.CancelledError:
            call.cancel()
            raise
        end = time.perf_counter()
        if res.outcome == "cancelled":
            return res
        if final is None:
            res.error = "stream ended without a final message"
            return res
        res.outcome = "ok"
        res.e2e_s = end - t0
        res.ttft_s = None if first is None else first - t0
        res.tokens = final.completion_tokens
        res.decode_s = None if first is None else last - first
        res.server_ttft_s = final.ttft_ms / 1000 if final.completion_tokens else None
        res.server_tpot_s = final.tpot_ms / 1000 if final.completion_tokens >= 2 else None
        res.drafts = final.speculative.num_drafts
        res.accepted = final.speculative.num_accepted_tokens
        res.finish = {1: "stop", 2: "length", 3: "aborted"}.get(final.finish_reason, "")
        return res


class OpenAITarget:
    """An OpenAI-compatible ``/v1/completions`` endpoint, streamed (server-sent events).

    ``render_fim``: send the FIM prompt rendered by quickdraft.prompt_format
    (for upstream ``vllm serve``, which does not know our format); otherwise
    send ``prompt`` + ``suffix`` and let the server render it.
    """

    def __init__(self, base_url: str, model: str, render_fim: bool = True, stop_token_ids: list[int] | None = None, timeout_s: float = REQUEST_TIMEOUT_S):
        check_loopback(base_url)
        self.base_url = base_url.rstrip("/")
        self.name = f"openai {self.base_url}"
        self.model = model
        self.render_fim = render_fim
        self.stop_token_ids = stop_token_ids or []
        self.timeout_s = timeout_s
        self._session = None

    async def open(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def body(self, p: Planned) -> dict:
        from quickdraft.prompt_format import CodeContext, render

        t = p.task
        body: dict = {"model": self.model, "max_tokens": t.max_tokens, "temperature": 0.0, "stream": True,
                      "stream_options": {"include_usage": True}}
        if t.stop:
            body["stop"] = list(t.stop)
        if self.render_fim:
            body["prompt"] = render(CodeContext(prefix=t.prefix, suffix=t.suffix))
            # vLLM extensions: the same stop tokens quickdraft's server adds, and no control tokens in the text.
            body["stop_token_ids"] = self.stop_token_ids
            body["skip_special_tokens"] = True
        else:
            body["prompt"] = t.prefix
            if t.suffix is not None:
                body["suffix"] = t.suffix
        return body

    async def send(self, p: Planned, run_start: float) -> Result:
        import aiohttp

        res = Result(index=p.index, kind=p.task.kind, latency_class=p.latency_class, planned_cancel=p.cancel_after_s is not None)
        t0 = time.perf_counter()
        res.start_s = t0 - run_start
        first = last = None
        usage = None
        done = False

        async def consume():
            nonlocal first, last, usage, done
            async with self._session.post(f"{self.base_url}/v1/completions", json=self.body(p)) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    now = time.perf_counter()
                    for choice in chunk.get("choices") or []:
                        if choice.get("text"):
                            first = first or now
                            last = now
                        if choice.get("finish_reason"):
                            res.finish = choice["finish_reason"]
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    spec = (chunk.get("quickdraft") or {}).get("speculative")
                    if spec:  # quickdraft's own HTTP API reports the request's acceptance; vLLM's does not
                        res.drafts = int(spec.get("num_drafts", 0))
                        res.accepted = int(spec.get("num_accepted_tokens", 0))

        try:
            cancelled = await _with_cancel(consume, p.cancel_after_s)
        except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError, json.JSONDecodeError) as e:
            res.error = f"{type(e).__name__}: {e}"[:300]
            return res
        end = time.perf_counter()
        if cancelled:
            res.outcome = "cancelled"
            return res
        if not done:
            res.error = "stream ended without [DONE]"
            return res
        res.outcome = "ok"
        res.e2e_s = end - t0
        res.ttft_s = None if first is None else first - t0
        res.tokens = int(usage["completion_tokens"]) if usage else 0
        res.decode_s = None if first is None else last - first
        return res


@dataclass
class RunSpec:
    """How one load-generator run is driven."""

    mode: str = "closed"  # closed | open
    concurrency: int = 1  # closed loop: requests in flight
    rate_per_s: float = 1.0  # open loop: mean arrival rate
    max_requests: int = 64
    duration_s: float = 120.0  # stop sending after this; in-flight requests finish
    warmup_requests: int = 2  # sent one at a time first, not recorded
    max_in_flight: int = 256  # open loop: arrivals beyond this are dropped (counted)
    offset: int = 0  # first workload index, so rounds can continue the sequence
    seed: int = 0

    def validate(self) -> None:
        if self.mode not in ("closed", "open"):
            raise ValueError(f"mode {self.mode!r}: closed or open")
        if not 1 <= self.concurrency <= 256:
            raise ValueError(f"concurrency {self.concurrency}: must be within 1..256")
        if self.mode == "open" and not (0 < self.rate_per_s <= 1000):
            raise ValueError(f"rate {self.rate_per_s}/s: must be within (0, 1000]")
        if not 1 <= self.max_requests <= 1_000_000:
            raise ValueError(f"max_requests {self.max_requests}: must be within 1..1000000")
        if not 0 < self.duration_s <= 3600:
            raise ValueError(f"duration {self.duration_s} s: must be within (0, 3600]")


@dataclass
class RunOutcome:
    spec: RunSpec
    results: list[Result]
    wall_s: float
    dropped: int = 0
    warmup_failures: int = 0


def _finish(in_flight: set, record: Callable[[Result], None]) -> Callable[[asyncio.Task], None]:
    def done(t: asyncio.Task) -> None:
        in_flight.discard(t)
        if not t.cancelled():
            record(t.result())  # send_safely never raises but for cancellation

    return done


async def run_load(target: Target, workload: Workload, spec: RunSpec, progress: Callable[[Result], None] | None = None) -> RunOutcome:
    """Drive ``target`` with ``workload`` as ``spec`` says; the target must be open."""
    spec.validate()
    warm_fail = 0
    for i in range(spec.warmup_requests):
        p = workload.planned(-1 - i)  # the last tasks: measured requests start at the first
        # Warm-up requests are never cancelled: they exist to pay one-time costs.
        r = await send_safely(target, Planned(p.index, p.task, p.latency_class, None), time.perf_counter())
        warm_fail += r.outcome != "ok"
    start = time.perf_counter()
    stop_at = start + spec.duration_s
    results: list[Result] = []
    dropped = 0

    def record(r: Result) -> None:
        results.append(r)
        if progress is not None:
            progress(r)

    if spec.mode == "closed":
        next_index = spec.offset
        end_index = spec.offset + spec.max_requests

        async def worker() -> None:
            nonlocal next_index
            while next_index < end_index and time.perf_counter() < stop_at:
                i = next_index
                next_index += 1
                record(await send_safely(target, workload.planned(i), start))

        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
    else:
        rng = random.Random(spec.seed)
        in_flight: set[asyncio.Task] = set()
        t_next = start
        for i in range(spec.offset, spec.offset + spec.max_requests):
            t_next += rng.expovariate(spec.rate_per_s)
            if t_next >= stop_at:
                break
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
            if len(in_flight) >= spec.max_in_flight:
                dropped += 1
                continue
            task = asyncio.create_task(send_safely(target, workload.planned(i), start))
            task.add_done_callback(_finish(in_flight, record))
            in_flight.add(task)
        if in_flight:
            await asyncio.gather(*list(in_flight), return_exceptions=True)
    wall = time.perf_counter() - start
    return RunOutcome(spec=spec, results=sorted(results, key=lambda r: r.index), wall_s=wall, dropped=dropped, warmup_failures=warm_fail)


async def send_safely(target: Target, p: Planned, run_start: float) -> Result:
    """``target.send``, with any unexpected error turned into a failed result
    (a load generator must count a failure, not die of it)."""
    try:
        return await target.send(p, run_start)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001
        return Result(index=p.index, kind=p.task.kind, latency_class=p.latency_class, planned_cancel=p.cancel_after_s is not None,
                      error=f"{type(e).__name__}: {e}"[:300], start_s=time.perf_counter() - run_start)
