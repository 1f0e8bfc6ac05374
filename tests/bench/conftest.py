"""A real quickdraft server (gRPC + HTTP) over a fake engine, for the load
generator's and the gate's tests: everything but vLLM is real."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from quickdraft.bench.gate import LoopThread
from quickdraft.bench.servers import free_port
from tests.bench.fakes import factory


@dataclass
class FakeServer:
    server: object
    loop: LoopThread
    http_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def engine(self):
        return self.server.engines.engine


@pytest.fixture(scope="module")
def fake_quickdraft():
    from quickdraft.server.config import load_config
    from quickdraft.server.app import QuickdraftServer

    cfg = load_config(env={}, overrides={"server.port": 0, "telemetry.metrics_port": 0, "http.enabled": True, "http.port": free_port()})
    cfg.validate()
    loop = LoopThread()

    async def boot():
        # 10 ms steps, 3 tokens per step (parallel K=5 accepting 2): a request of 24 tokens takes ~85 ms.
        server = QuickdraftServer(cfg, engine_factory=factory(step_s=0.01))
        await server.start()
        await server.wait_ready(60)
        return server

    server = loop.run(boot())
    yield FakeServer(server, loop, cfg.http.port)
    loop.run(server.shutdown(1.0))
    loop.stop()
