"""Backend (gRPC channel, health, limits) and Completer against an in-process fake server."""

from __future__ import annotations

import asyncio

from quickdraft.client import build_request
from quickdraft.lsp_bridge.backend import DOWN, REFUSED, UP, Backend, BackendConfig, Outcome
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
    assert answered is Outcome.ANSWERED and received == ["first", " line\n"]
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
    assert await backend.complete(build_request(prefix="x"), lambda t: False) is Outcome.FAILED
    assert backend.state == DOWN and not backend.available
    await fake_server.start()
    await states.wait_for(UP)
    assert await backend.complete(build_request(prefix="x"), lambda t: False) is Outcome.ANSWERED
    assert states.seen[:2] == [DOWN, UP]
    await backend.close()


async def test_bytes_per_token_is_learned_from_answers_and_refusals(fake_server):
    fake = fake_server.fake
    fake.bytes_per_token, fake.max_prompt_tokens = 2.0, 100
    backend = _backend(fake_server.address, States())
    await backend.complete(build_request(prefix="x" * 120), lambda t: False, document="a", language="python")
    # 120 bytes were 60 tokens: the next prompt of this document is sized at about 2 bytes per token
    assert 1.7 < backend.budget_for("a", "python").chars_per_token <= 2.0
    # a document not seen yet borrows its language's ratio; another language keeps the announced one
    assert backend.budget_for("b", "python") == backend.budget_for("a", "python")
    assert backend.budget_for("c", "go").chars_per_token > 3.0
    outcome = await backend.complete(build_request(prefix="y" * 400), lambda t: False, document="d", language="go")
    assert outcome is Outcome.PROMPT_TOO_LONG
    assert backend.budget_for("d", "go").chars_per_token <= 2.0
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


async def test_a_prompt_refused_as_too_long_is_rebuilt_smaller_once(fake_server):
    fake = fake_server.fake
    # Dense code: 1.5 bytes per token, where the server announced 4.0.
    fake.bytes_per_token, fake.max_prompt_tokens = 1.5, 600
    ws, completer = _completer(fake_server.address)
    completer.backend.budget = Budget(tokens=500, chars_per_token=4.0)
    completer.backend.ratio.announced = 4.0
    body = "".join(f"    t{i} = [{i}, {i * 7}, {i * 13}]\n" for i in range(400))
    ws.open("file:///r/a.py", "def f():\n" + body + "    ", language_id="python")
    result = await completer.complete("file:///r/a.py", 401, 4)
    assert result is not None and result.completion.text == "return a + b"
    assert len(fake.requests) == 2 and fake.refused == 1
    first, second = (len(r.prefix) + len(r.suffix) for r in fake.requests)
    assert second < first and second / 1.5 <= 600


async def test_a_plaintext_token_to_a_remote_host_is_refused_then_fixed(fake_server):
    states = States()
    remote = BackendConfig(address="192.0.2.1:50051", token="s3cret")  # TEST-NET: never contacted
    backend = Backend(remote, on_state=states)
    backend.start()
    assert backend.state == REFUSED and not backend.available
    assert "192.0.2.1" in backend.error and "TLS" in backend.error and "s3cret" not in backend.error
    assert await backend.complete(build_request(prefix="x"), lambda t: False) is Outcome.FAILED
    # A corrected configuration (here: loopback) brings it back without a restart.
    await backend.reconfigure(BackendConfig(address=fake_server.address, token="s3cret"))
    await states.wait_for(UP)
    assert backend.error is None
    assert await backend.complete(build_request(prefix="x"), lambda t: False) is Outcome.ANSWERED
    assert fake_server.fake.metadata[-1]["authorization"] == "Bearer s3cret"
    await backend.close()
