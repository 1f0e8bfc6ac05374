"""The HTTP API in replica mode: real HTTP requests over loopback to the front
end's HTTP server (``ingress.http_front_end``) over ``RoutedService``, with two
real QuickdraftReplica objects on fake engines behind a stand-in for Ray's
DeploymentHandle that routes by session and streams as Ray does. No Ray."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from quickdraft.server.config import load_config
from quickdraft.server.frontend import Auth
from quickdraft.server.openai.api_router import build_app
from quickdraft.server.openai.serving import OpenAIServing
from quickdraft.server.replicas.ingress import RoutedService, http_front_end
from quickdraft.server.replicas.routing import ReplicaLoad, home_order, rank_replicas
from quickdraft.server.telemetry import Telemetry
from tests.replicas.test_replica_control import Replicas, start_replica
from tests.test_http_adapter import tokens_file, until

pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'QuickdraftReplica.__del__' was never awaited:RuntimeWarning")

IDS = ["r-a", "r-b"]
JSON = {"Content-Type": "application/json"}


class RayStream:
    """A streaming handle call as Ray's behaves: the replica's generator runs
    in a task of its own, so cancelling the task that reads the stream does
    not reach the replica; only ``cancel()`` does."""

    _END = object()

    def __init__(self, gen):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.task = asyncio.create_task(self._run(gen))

    async def _run(self, gen) -> None:
        try:
            async for item in gen:
                self.queue.put_nowait(item)
        finally:
            self.queue.put_nowait(self._END)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is self._END:
            raise StopAsyncIteration
        return item

    def cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()


class SessionHandle(Replicas):
    """The handle, ``complete`` sent where SessionRouter sends it among idle
    replicas (``routing.rank_replicas``: the session's home)."""

    def __init__(self, replicas):
        super().__init__(replicas)
        self.routed: list[tuple[str, str]] = []  # (session key, replica id) of each completion
        self.streams: list[RayStream] = []

    def __getattr__(self, name: str):
        if name == "complete":
            return SimpleNamespace(remote=self._complete)
        return super().__getattr__(name)

    def _complete(self, payload, client, headers, session=""):
        rid = rank_replicas(session, [ReplicaLoad(r) for r in self.replicas])[0][0]
        self.routed.append((session, rid))
        stream = RayStream(self.replicas[rid].complete(payload, client, headers, session=session))
        self.streams.append(stream)
        return stream


@pytest.fixture()
async def front(tmp_path):
    path, tokens = tokens_file(tmp_path, alice=None, bob=None)
    cfg = load_config(env={}, overrides={"replicas.count": "2", "server.port": "0", "telemetry.metrics_port": "0",
                                         "http.enabled": "true", "http.port": "0", "security.auth_tokens_file": path,
                                         "server.grace_period_s": "0"})
    handle = SessionHandle([await start_replica(cfg, rid) for rid in IDS])
    svc = RoutedService(cfg, handle, Telemetry("test"))
    await svc.refresh()
    auth = Auth.from_config(cfg)
    http = http_front_end(cfg, svc, auth)
    port = await http.start()
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30)
    yield SimpleNamespace(cfg=cfg, svc=svc, handle=handle, http=http, client=client, auth=auth,
                          headers={u: {**JSON, "Authorization": f"Bearer {t}"} for u, t in tokens.items()})
    await client.aclose()
    await http.stop()
    for r in handle.replicas.values():
        await r.server.shutdown(0)


def homed(replica_id: str) -> str:
    return next(s for s in (f"s{i}/repo" for i in range(100)) if home_order(s, IDS)[0] == replica_id)


def served(f) -> dict[str, int]:
    return {rid: sum(r.finishes.values()) for rid, r in f.handle.replicas.items()}


async def test_a_session_goes_to_its_replica_and_without_one_the_user_is_the_session(front):
    f = front
    for session in (homed("r-a"), homed("r-b"), homed("r-a")):
        r = await f.client.post("/v1/completions", headers=f.headers["alice"],
                                json={"prompt": "x = ", "max_tokens": 4, "session": session})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "def f():", r.text
    r = await f.client.post("/v1/chat/completions", headers=f.headers["alice"],
                            json={"messages": [{"role": "user", "content": "hi"}], "session": homed("r-b")})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "def f():", r.text
    assert f.handle.routed == [(homed("r-a"), "r-a"), (homed("r-b"), "r-b"), (homed("r-a"), "r-a"), (homed("r-b"), "r-b")]
    assert served(f) == {"r-a": 2, "r-b": 2}

    # No session: as a gRPC request with neither session nor repo_name, the user's key.
    for user in ("alice", "bob"):
        r = await f.client.post("/v1/completions", headers=f.headers[user], json={"prompt": "x = ", "max_tokens": 4})
        assert r.status_code == 200, r.text
    assert [s for s, _ in f.handle.routed[-2:]] == ["user:alice/", "user:bob/"]


async def test_auth_is_checked_at_the_front_end_and_outcomes_reach_the_replica_that_served(front):
    f = front
    r = await f.client.post("/v1/completions", headers=JSON, json={"prompt": "x = ", "max_tokens": 4})
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    r = await f.client.get("/v1/models", headers={"Authorization": "Bearer made-up"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert f.handle.routed == [], "a refused request reached a replica"
    r = await f.client.get("/health")  # open without a token unless security.health_requires_auth
    assert (r.status_code, r.json()) == (200, {"status": "serving"})

    r = await f.client.post("/v1/completions", headers={**f.headers["alice"], "X-Request-Id": "abcd-1"},
                            json={"prompt": "x = ", "max_tokens": 4, "session": homed("r-b")})
    assert r.status_code == 200
    report = {"request_id_prefix": "abcd", "outcomes": [{"request_id": "abcd-1", "kind": "shown"}]}
    r = await f.client.post("/v1/completions/outcomes", headers=f.headers["alice"], json=report)
    assert r.json() == {"recorded": 1, "unknown_request_ids": 0, "duplicates": 0}, r.text
    assert f.handle.replicas["r-b"].server.outcomes.stats().total.shown == 1
    r = await f.client.post("/v1/completions/outcomes", headers=f.headers["bob"], json=report)
    assert r.json()["unknown_request_ids"] == 1, "another user's report of alice's request"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_hangs_up_cancels_the_request_on_its_replica(front, stream):
    f = front
    engine = f.handle.replicas["r-a"].server.engines.engine
    engine.steps, engine.delay = [("a", 1)] * 5000, 0.02
    body = json.dumps({"prompt": "x = ", "max_tokens": 400, "stream": stream, "session": homed("r-a")}).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in f.headers["alice"].items())
    reader, writer = await asyncio.open_connection("127.0.0.1", f.http.port)
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    if stream:
        assert b"data: " in await asyncio.wait_for(reader.readuntil(b"data: "), 10)
    else:
        assert await until(lambda: engine.unfinished)
    writer.close()
    assert await until(lambda: engine.aborted), "the replica's engine request outlived its client"
    replica = f.handle.replicas["r-a"]
    assert f.handle.streams[-1].cancelled and replica.finishes == {"cancelled": 1}
    assert await until(lambda: replica.server.service.admission.open == 0 and f.svc.admission.open == 0)


async def test_refusals_have_the_single_process_shape(front):
    f = front
    # The same requests to the single-process HTTP API over one replica's own service.
    single = build_app(OpenAIServing(f.cfg, f.handle.replicas["r-a"].server.service, f.auth))
    requests = [
        # Refused on the replica: its field named as the parameter the client sent.
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000})),
        ("/v1/completions", json.dumps({"prompt": "x", "stop": ["a"] * 3, "temperature": 9})),
        # Refused at the front end.
        ("/v1/completions", '{"prompt": '),
        ("/v1/completions", json.dumps({"prompt": "x", "model": "other"})),
    ]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=single), base_url="http://single") as local:
        for path, body in requests:
            routed = await f.client.post(path, content=body, headers=f.headers["alice"])
            alone = await local.post(path, content=body, headers=f.headers["alice"])
            assert routed.status_code == alone.status_code >= 400 and routed.json() == alone.json(), (routed.text, alone.text)
    assert len(f.handle.routed) == 2, "the first two were refused by a replica"
    err = (await f.client.post(requests[0][0], content=requests[0][1], headers=f.headers["alice"])).json()["error"]
    assert err["param"] == "max_completion_tokens" and err["message"].startswith("max_completion_tokens: ")


async def test_health_follows_the_replicas_and_requests_wait_for_none(front):
    f = front
    f.svc.handle, f.svc.statuses = None, []  # as before the replicas run
    r = await f.client.get("/health")
    assert (r.status_code, r.json()) == (503, {"status": "starting"})
    r = await f.client.post("/v1/completions", headers=f.headers["alice"], json={"prompt": "x = "})
    assert r.status_code == 503 and r.json()["error"]["code"] == "UNAVAILABLE" and r.json()["error"]["type"] == "server_error"

    f.svc.handle = f.handle
    for replica in f.handle.replicas.values():
        replica.server.service.stop_accepting()
    await f.svc.refresh()
    assert (await f.client.get("/health")).json() == {"status": "draining"}, "no replica serves"
    f.handle.replicas["r-b"].server.service.admission.accepting = True
    await f.svc.refresh()
    assert (await f.client.get("/health")).status_code == 200, "one replica serves"
    f.svc.stop_accepting()
    r = await f.client.get("/health")
    assert (r.status_code, r.json()) == (503, {"status": "draining"})
