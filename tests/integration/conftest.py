"""A real quickdraft server on the embedded model, shared by the integration tests.

The server runs in this process on its own event loop in a background thread
(vLLM's engine core is a child process), with gRPC on a free loopback port.
Engine starts cost 15-35 s on two cores, so one server serves the whole
session; tests that must change its engine switch it and switch it back.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import pytest

from quickdraft.server.config import QuickdraftConfig, load_config


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopThread:
    """An asyncio loop in a daemon thread; run(coro) blocks for its result."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="server-loop")
        self.thread.start()

    def run(self, coro, timeout: float | None = 600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class RunningServer:
    server: Any
    loop: LoopThread
    cfg: QuickdraftConfig
    spans: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def engine(self):
        return self.server.engines.engine

    def switch(self, mode, reason: str = "test") -> bool:
        return self.loop.run(self.server.engines.switch(mode, reason))


def embedded_config(**sections) -> QuickdraftConfig:
    cfg = load_config(env={})
    cfg.server.port = 0
    cfg.telemetry.metrics_port = free_port()
    try:  # the OpenAI-compatible endpoint shares the session's engine
        import quickdraft.server.openai.http_server  # noqa: F401

        cfg.http.enabled = True
        cfg.http.port = free_port()
    except ImportError:
        pass
    cfg.engine.max_num_seqs = 16
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    cfg.validate()
    return cfg


def start_server(cfg: QuickdraftConfig, span_exporter=None) -> RunningServer:
    from quickdraft.server.app import QuickdraftServer

    loop = LoopThread()

    async def boot():
        server = QuickdraftServer(cfg, span_exporter=span_exporter)
        await server.start()
        await server.wait_ready(600)
        return server

    server = loop.run(boot(), timeout=700)
    return RunningServer(server=server, loop=loop, cfg=cfg, spans=span_exporter)


def stop_server(rs: RunningServer) -> None:
    rs.loop.run(rs.server.shutdown(2.0), timeout=120)
    rs.loop.stop()


@pytest.fixture(scope="session")
def server():
    """The shared server: embedded model, parallel drafting K=5, HTTP API on."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    rs = start_server(embedded_config(), span_exporter=spans)
    yield rs
    stop_server(rs)


@pytest.fixture
def client(server):
    from quickdraft.client import CompletionClient

    with CompletionClient(server.address, timeout=120) as c:
        yield c
