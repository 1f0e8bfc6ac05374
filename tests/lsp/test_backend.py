"""Backend (gRPC channel, health, limits) and Completer against an in-process fake server."""

from __future__ import annotations

import asyncio

from quickdraft.client import build_request
from quickdraft.lsp_bridge.backend import DOWN, UP, Backend, BackendConfig
from quickdraft.lsp_bridge.completer import Completer
from quickdraft.lsp_bridge.context import Budget, ContextEngine
from quickdraft.lsp_bridge.settings import Settings
from quickdraft.lsp_bridge.workspace import Change, Workspace


class States:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self._changed = asyncio.Condition()

    def __call__(self, state, info) -> None:
        self.seen.append(state)
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, state: str) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: state in self.seen)


def _backend(address: str, states: States) -> Backend:
    return Backend(BackendConfig(address=address, initial_backoff_s=0.05, max_backoff_s=0.2), on_state=states)


async def test_limits_from_server_info(fake_server):
    states = States()
    backend = _backend(fake_server.address, states)
    assert backend.budget == Budget()  # defaults until the server answers
    backend.start()
    await states.wait_for(UP)
    assert backend.budget == Budget(tokens=1024, chars_per_token=4.0)
    await backend.close()


async def test_stopping_early_cancels_the_stream(fake_server):
    fake = fake_server.fake
    fake.deltas = ["first", " line\n", "second"]
    fake.hang_after_deltas = True
    backend = _backend(fake_server.address, States())
    received: list[str] = []
    answered = await backend.complete(build_request(prefix="x"), lambda t: received.append(t) or "\n" in t)
    assert answered and received == ["first", " line\n"]
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert fake.finished == 0
    await backend.close()


async def test_cancelling_the_caller_cancels_the_rpc(fake_server):
    fake = fake_server.fake
    fake.block = 1
    backend = _backend(fake_server.address, States())
    task = asyncio.ensure_future(backend.complete(build_request(prefix="x"), lambda t: False))
    await fake.wait_for(lambda: len(fake.requests) == 1)
    task.cancel()
    await fake.wait_for(lambda: fake.cancelled == 1)
    assert task.cancelled()
    await backend.close()


async def test_unreachable_then_back(fake_server):
    await fake_server.stop()
    states = States()
    backend = _backend(fake_server.address, states)
    assert not await backend.complete(build_request(prefix="x"), lambda t: False)
    assert backend.state == DOWN and not backend.available
    await fake_server.start()
    await states.wait_for(UP)
    assert await backend.complete(build_request(prefix="x"), lambda t: False)
    assert states.seen[:2] == [DOWN, UP]
    await backend.close()


# -- Completer ------------------------------------------------------------------


def _completer(address: str, **settings) -> tuple[Workspace, Completer]:
    ws = Workspace(["/r"])
    backend = _backend(address, States())
    return ws, Completer(ws, ContextEngine(ws), backend, Settings(debounce_ms=0).merged(settings))


async def test_same_position_twice_asks_once(fake_server):
    ws, completer = _completer(fake_server.address)
    ws.open("file:///r/a.py", "def f():\n    ", language_id="python")
    first = await completer.complete("file:///r/a.py", 1, 4)
    second = await completer.complete("file:///r/a.py", 1, 4)
    assert first.completion.text == second.completion.text == "return a + b"
    assert len(fake_server.fake.requests) == 1


async def test_typing_through_a_shown_completion_asks_nothing(fake_server):
    ws, completer = _completer(fake_server.address)
    opened = ws.open("file:///r/a.py", "def f():\n    ", language_id="python")
    await completer.complete("file:///r/a.py", 1, 4)
    ws.change(opened.uri, 2, [Change("ret", (1, 4), (1, 4))])
    result = await completer.complete("file:///r/a.py", 1, 7)
    assert result.completion.text == "urn a + b"
    ws.change(opened.uri, 3, [Change("x", (1, 7), (1, 7))])  # diverges from the suggestion
    await completer.complete("file:///r/a.py", 1, 8)
    assert len(fake_server.fake.requests) == 2


async def test_newer_request_supersedes_older(fake_server):
    fake = fake_server.fake
    fake.block = 1
    ws, completer = _completer(fake_server.address)
    opened = ws.open("file:///r/a.py", "def f():\n    ", language_id="python")
    older = asyncio.ensure_future(completer.complete(opened.uri, 1, 4))
    await fake.wait_for(lambda: len(fake.requests) == 1)
    ws.change(opened.uri, 2, [Change("r", (1, 4), (1, 4))])
    newer = await completer.complete(opened.uri, 1, 5)
    assert await older is None
    assert newer is not None
    await fake.wait_for(lambda: fake.cancelled == 1)


async def test_debounced_request_for_a_changed_document_is_dropped(fake_server):
    ws, completer = _completer(fake_server.address, debounceMs=50)
    waiting, release = asyncio.Event(), asyncio.Event()

    async def debounce(seconds: float) -> None:
        assert seconds == 0.05
        waiting.set()
        await release.wait()

    completer.sleep = debounce
    opened = ws.open("file:///r/a.py", "def f():\n    ", language_id="python")
    pending = asyncio.ensure_future(completer.complete(opened.uri, 1, 4))
    await waiting.wait()
    ws.change(opened.uri, 2, [Change("r", (1, 4), (1, 4))])
    release.set()
    assert await pending is None
    assert fake_server.fake.requests == []
