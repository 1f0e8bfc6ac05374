"""Suggestion outcomes end to end: an LSP client (pytest-lsp) drives the
bridge subprocess, which talks to a real quickdraft gRPC server (fake engine);
the editor's quickdraft/completionOutcome notifications reach the server's
metrics labelled by the request's language, latency class and config."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from lsprotocol import types

from quickdraft.lsp_bridge.outcomes import ACCEPT_COMMAND, CAPABILITY, NOTIFICATION, OutcomeReporter
from quickdraft.v1 import completion_pb2 as pb
from tests.test_outcomes import metric_points, point, start_stack, stop_stack

REPORTS = {CAPABILITY: True}


async def until(predicate, timeout: float = 30.0) -> None:
    """Wait for the bridge's batch to arrive; the bound only stops a hang, it is not what is tested."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate() and loop.time() < end:
        await asyncio.sleep(0.05)


@pytest.fixture
async def server():
    s = await start_stack(steps=[("compute", 1), ("(a, b)", 3)])
    yield s
    await stop_stack(s)


def suggestion_of(result: types.InlineCompletionList) -> tuple[str, str]:
    [item] = result.items
    assert item.command is not None and item.command.command == ACCEPT_COMMAND
    [argument] = item.command.arguments
    return item.insert_text, argument["suggestionId"]


async def test_outcomes_from_an_editor_reach_the_server_metrics_with_the_requests_labels(server, bridge_factory):
    editor = await bridge_factory(server.address, experimental=REPORTS)
    await editor.status.wait_for("up")
    uri = editor.open("calc.py", "def total(a, b):\n    return ")
    text, accepted_id = suggestion_of(await editor.inline(uri))
    assert text == "compute(a, b)"
    editor.open("main.rs", "fn main() {\n    let x = ", language_id="rust")
    _, rejected_id = suggestion_of(await editor.inline(editor.uri("main.rs")))
    assert rejected_id != accepted_id
    notify = editor.client.protocol.notify
    notify(NOTIFICATION, {"suggestionId": accepted_id, "kind": "shown"})
    notify(NOTIFICATION, {"suggestionId": accepted_id, "kind": "accepted", "shownMs": 640, "acceptedChars": 7, "acceptance": "word"})
    notify(NOTIFICATION, {"suggestionId": rejected_id, "kind": "shown"})
    notify(NOTIFICATION, {"suggestionId": rejected_id, "kind": "rejected", "shownMs": 1200, "rejection": "typedOver"})
    # Malformed and unknown ones are ignored; nothing reaches the server for them.
    notify(NOTIFICATION, {"suggestionId": "no-such-suggestion", "kind": "accepted"})
    notify(NOTIFICATION, {"suggestionId": accepted_id, "kind": "eaten"})
    notify(NOTIFICATION, ["not", "an", "object"])

    r = server.reader
    await until(lambda: len(metric_points(r, "quickdraft.suggestions.rejected")) == 1)
    python = {"quickdraft.language": "python", "quickdraft.latency_class": "inline", "quickdraft.speculative.config": "parallel K=5"}
    rust = {**python, "quickdraft.language": "rust"}
    assert point(r, "quickdraft.suggestions.shown", **python).value == 1
    assert point(r, "quickdraft.suggestions.shown", **rust).value == 1
    assert point(r, "quickdraft.suggestions.accepted", **python, **{"quickdraft.acceptance": "word"}).value == 1
    assert point(r, "quickdraft.suggestions.accepted_chars", **python).value == 7
    assert point(r, "quickdraft.suggestions.rejected", **rust, **{"quickdraft.rejection": "typed_over"}).value == 1
    assert point(r, "quickdraft.suggestion.time_on_screen", **python).sum == pytest.approx(0.64)
    assert metric_points(r, "quickdraft.outcomes.unmatched") == []  # the bridge named only requests the server made
    stats = server.book.stats()
    assert stats.total.shown == 2 and stats.total.accepted == 1 and stats.total.accepted_chars == 7
    assert stats.reporting_sessions == 1  # the bridge declared its session's request id prefix
    events = [e for s in server.spans.get_finished_spans() if s.name == "quickdraft.report_outcomes" for e in s.events]
    assert events and all(e.attributes["quickdraft.request_id"].startswith("lsp-") for e in events)
    # The editor keeps being answered.
    editor.type(uri, len(editor.texts[uri]), "a")
    assert (await editor.inline(uri)).items is not None


async def test_a_suggestion_typed_through_keeps_its_id(server, bridge_factory):
    editor = await bridge_factory(server.address, experimental=REPORTS)
    await editor.status.wait_for("up")
    uri = editor.open("calc.py", "def total(a, b):\n    return ")
    _, first = suggestion_of(await editor.inline(uri))
    editor.type(uri, len(editor.texts[uri]), "comp")
    text, again = suggestion_of(await editor.inline(uri))
    assert text == "ute(a, b)" and again == first  # one request, one suggestion


async def test_editors_that_do_not_report_get_no_command(server, bridge_factory):
    editor = await bridge_factory(server.address)
    await editor.status.wait_for("up")
    uri = editor.open("calc.py", "def total(a, b):\n    return ")
    [item] = (await editor.inline(uri)).items
    assert item.insert_text == "compute(a, b)" and item.command is None


async def test_the_queue_is_bounded_and_an_unreachable_server_drops_batches_counted():
    sent: list[list[pb.Outcome]] = []
    answers: list[grpc.StatusCode | None] = [None]

    async def send(batch, prefix):
        sent.append(batch)
        return answers[0]

    reporter = OutcomeReporter(send, max_queue=3, batch=2)
    sid = reporter.suggestion_id("lsp-x-1", "python", 10)
    for _ in range(5):
        reporter.on_notification({"suggestionId": sid, "kind": "shown"})
    assert reporter.dropped == 2  # the queue holds 3
    await reporter.flush()
    assert [len(b) for b in sent] == [2, 1] and reporter.sent == 3
    answers[0] = grpc.StatusCode.UNAVAILABLE
    reporter.on_notification({"suggestionId": sid, "kind": "accepted", "acceptedChars": 99, "shownMs": -4})
    await reporter.flush()
    assert reporter.dropped == 3 and reporter.sent == 3
    [batch] = sent[-1:]
    assert batch[0].accepted_chars == 10 and batch[0].shown_ms == 0.0  # kept in range before it leaves
    answers[0] = grpc.StatusCode.UNIMPLEMENTED  # an older server: stop sending
    reporter.on_notification({"suggestionId": sid, "kind": "shown"})
    await reporter.flush()
    assert not reporter.enabled and reporter.on_notification({"suggestionId": sid, "kind": "shown"}) is None
