"""Suggestion outcomes on the server: OutcomeBook (relating reports to
requests, never-shown waste, per-client bound), the ReportOutcomes and
GetOutcomeStats RPCs over loopback, POST /v1/completions/outcomes, the
clients and `quickdraft stats`. A fake engine; metrics read from an
in-memory reader, spans from an in-memory exporter."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import grpc
import httpx
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from quickdraft.client import AsyncCompletionClient, CompletionClient
from quickdraft.server.admission import Client
from quickdraft.server.config import load_config
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import Auth
from quickdraft.server.grpc_server import GrpcServer
from quickdraft.server.openai.api_router import build_app
from quickdraft.server.openai.serving import OpenAIServing
from quickdraft.server.outcomes import OutcomeBook, language_label
from quickdraft.server.service import CompletionService
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb
from tests.test_service import FakeEngine

# In a prompt and in the completion: neither may reach a metric label or a span attribute.
CODE = "zebra_quux_sentinel"
SPEC = SpecConfig(True, 5)


def metric_points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    return [p for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == name for p in m.data.data_points]


def point(reader: InMemoryMetricReader, name: str, **labels: str):
    """The one data point of ``name`` whose attributes include ``labels``."""
    found = [p for p in metric_points(reader, name) if all(p.attributes.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, [dict(p.attributes) for p in metric_points(reader, name)])
    return found[0]


def labels(language: str = "python", config: str = "parallel K=5") -> dict[str, str]:
    return {"quickdraft.language": language, "quickdraft.latency_class": "inline", "quickdraft.speculative.config": config}


@dataclass
class Stack:
    """A server's parts as app.QuickdraftServer wires them, telemetry read in memory."""

    cfg: object
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    service: CompletionService
    book: OutcomeBook
    manager: EngineManager
    grpc: GrpcServer
    clock: list[float]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc.port}"


async def start_stack(token: str | None = None, steps=None, **book) -> Stack:
    cfg = load_config(env={}, overrides={"server.port": 0, "telemetry.metrics_port": 0})
    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    telemetry = Telemetry("embedded", metric_reader=reader, span_exporter=spans)
    engine = FakeEngine(SPEC, steps=steps or [(CODE, 2), ("(a, b)", 3)])

    async def factory(cfg, spec, live=False):
        return engine

    manager = EngineManager(cfg, engine_factory=factory)
    service = CompletionService(cfg, manager, telemetry)
    clock = [1000.0]
    outcomes = OutcomeBook(telemetry, clock=lambda: clock[0], **book)
    service.observers.callbacks.append(outcomes.remember)
    server = GrpcServer(cfg, service, Auth(token), controller_state=lambda: None, outcomes=outcomes)
    await server.start()
    await manager.start(SPEC)
    return Stack(cfg, reader, spans, service, outcomes, manager, server, clock)


async def stop_stack(s: Stack) -> None:
    await s.grpc.stop(0)
    await s.manager.stop()


@pytest.fixture
async def stack():
    s = await start_stack()
    yield s
    await stop_stack(s)


async def complete(client: AsyncCompletionClient, request_id: str, language: str = "python") -> pb.CompleteFinal:
    stream = client.complete(prefix=f"def {CODE}():\n    return ", language_id=language, request_id=request_id)
    await stream.text()
    assert stream.final is not None
    return stream.final


# --- over gRPC, end to end --------------------------------------------------------


async def test_outcomes_reach_the_metrics_labelled_by_the_requests_language_class_and_config(stack):
    async with AsyncCompletionClient(stack.address) as client:
        await complete(client, "ed-0001-1")
        await complete(client, "ed-0001-2", language="rust")
        reply = await client.report_outcomes([
            pb.Outcome(request_id="ed-0001-1", kind=pb.OUTCOME_KIND_SHOWN, suggestion_chars=25),
            pb.Outcome(request_id="ed-0001-1", kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=840, accepted_chars=5, suggestion_chars=25,
                       acceptance=pb.ACCEPTANCE_WORD, language_id="cobol"),  # the request's own language wins
            pb.Outcome(request_id="ed-0001-2", kind=pb.OUTCOME_KIND_SHOWN),
            pb.Outcome(request_id="ed-0001-2", kind=pb.OUTCOME_KIND_REJECTED, shown_ms=2500, rejection=pb.REJECTION_TYPED_OVER),
        ], request_id_prefix="ed-0001-")
        stats = await client.outcome_stats()
    assert (reply.recorded, reply.unknown_request_ids, reply.duplicates) == (4, 0, 0)
    r = stack.reader
    assert point(r, "quickdraft.suggestions.shown", **labels("python")).value == 1
    assert point(r, "quickdraft.suggestions.shown", **labels("rust")).value == 1
    assert point(r, "quickdraft.suggestions.accepted", **labels("python"), **{"quickdraft.acceptance": "word"}).value == 1
    assert point(r, "quickdraft.suggestions.accepted_chars", **labels("python")).value == 5
    assert point(r, "quickdraft.suggestions.rejected", **labels("rust"), **{"quickdraft.rejection": "typed_over"}).value == 1
    accepted_time = point(r, "quickdraft.suggestion.time_on_screen", **labels("python"), **{"quickdraft.outcome": "accepted"})
    assert accepted_time.count == 1 and accepted_time.sum == pytest.approx(0.84)
    assert point(r, "quickdraft.suggestion.time_on_screen", **labels("rust"), **{"quickdraft.outcome": "rejected"}).sum == pytest.approx(2.5)
    assert metric_points(r, "quickdraft.suggestions.rejected")[0].attributes["gen_ai.request.model"] == "embedded"
    # The figures for people: per language and config, and in all.
    assert stats.total.shown == 2 and stats.total.accepted == 1 and stats.total.partially_accepted == 1 and stats.total.rejected == 1
    assert stats.total.acceptance_rate == pytest.approx(0.5) and stats.total.accepted_chars_per_shown == pytest.approx(2.5)
    assert stats.total.mean_shown_ms == pytest.approx((840 + 2500) / 2)
    by_language = {g.language: g for g in stats.groups}
    assert by_language["python"].acceptance_rate == 1.0 and by_language["python"].speculative_config == "parallel K=5"
    assert by_language["rust"].rejected == 1 and by_language["rust"].latency_class == "inline"
    assert stats.reporting_sessions == 1 and stats.never_shown_grace_s == 30.0
    # Trace events: one span per report, one event per outcome.
    [span] = [s for s in stack.spans.get_finished_spans() if s.name == "quickdraft.report_outcomes"]
    assert [e.name for e in span.events] == ["quickdraft.suggestion.shown", "quickdraft.suggestion.accepted",
                                             "quickdraft.suggestion.shown", "quickdraft.suggestion.rejected"]
    assert span.events[1].attributes["quickdraft.request_id"] == "ed-0001-1" and span.events[1].attributes["quickdraft.acceptance"] == "word"


async def test_no_code_text_reaches_any_exported_attribute(stack):
    async with AsyncCompletionClient(stack.address) as client:
        final = await complete(client, "ed-0002-1")
        await client.report_outcomes([pb.Outcome(request_id=final.request_id, kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=10,
                                                 accepted_chars=3, language_id=CODE)])
        await client.report_outcomes([pb.Outcome(request_id=CODE, kind=pb.OUTCOME_KIND_SHOWN)])  # an id that is code: unknown, counted
    data = stack.reader.get_metrics_data()
    exported = [v for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points
                for v in p.attributes.values()]
    spans = stack.spans.get_finished_spans()
    exported += [v for s in spans for v in s.attributes.values()]
    exported += [v for s in spans for e in s.events for v in e.attributes.values()]
    assert any(v == "ed-0002-1" for v in exported)  # the reader saw the outcome's span event at all
    assert point(stack.reader, "quickdraft.suggestions.accepted", **labels("python")).value == 1
    assert not [v for v in exported if CODE in str(v) or "(a, b)" in str(v)]


@pytest.mark.parametrize(("outcome", "field", "says"), [
    (pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=-5), "outcomes[0].shown_ms", "milliseconds"),
    (pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=float("nan")), "outcomes[0].shown_ms", "milliseconds"),
    (pb.Outcome(request_id="x"), "outcomes[0].kind", "SHOWN, ACCEPTED or REJECTED"),
    (pb.Outcome(request_id="x", kind=9), "outcomes[0].kind", "not an outcome"),
    (pb.Outcome(kind=pb.OUTCOME_KIND_SHOWN), "outcomes[0].request_id", "empty"),
    (pb.Outcome(request_id="a\nb", kind=pb.OUTCOME_KIND_SHOWN), "outcomes[0].request_id", "printable"),
    (pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_SHOWN, accepted_chars=4), "outcomes[0].accepted_chars", "only ACCEPTED"),
    (pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_ACCEPTED, accepted_chars=40, suggestion_chars=20), "outcomes[0].accepted_chars",
     "more than the suggestion"),
    (pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_REJECTED, acceptance=pb.ACCEPTANCE_WORD), "outcomes[0].acceptance", "only an ACCEPTED"),
    (pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_ACCEPTED, rejection=pb.REJECTION_DISMISSED), "outcomes[0].rejection", "only a REJECTED"),
])
async def test_bad_values_are_invalid_argument_naming_the_field_and_the_server_keeps_serving(stack, outcome, field, says):
    good = pb.Outcome(request_id="ed-0003-1", kind=pb.OUTCOME_KIND_SHOWN)
    async with AsyncCompletionClient(stack.address) as client:
        await complete(client, "ed-0003-1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.report_outcomes([good, outcome])  # the bad one is second: the batch is refused whole
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(field.replace("[0]", "[1]") + ":") and says in err.value.details()
        assert metric_points(stack.reader, "quickdraft.suggestions.shown") == []
        # The server keeps serving: reports and completions.
        assert (await client.report_outcomes([good])).recorded == 1
        assert (await complete(client, "ed-0003-2")).completion_tokens == 5


async def test_too_many_outcomes_or_a_short_prefix_are_refused_by_name(stack):
    async with AsyncCompletionClient(stack.address) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.report_outcomes([pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_SHOWN)] * 257)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("outcomes: 257 outcomes; at most 256")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.report_outcomes([], request_id_prefix="ab")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith("request_id_prefix:")


async def test_unknown_request_ids_and_duplicates_are_counted_not_errors(stack):
    async with AsyncCompletionClient(stack.address) as client:
        await complete(client, "ed-0004-1")
        reply = await client.report_outcomes([
            pb.Outcome(request_id="never-made", kind=pb.OUTCOME_KIND_SHOWN),
            pb.Outcome(request_id="ed-0004-1", kind=pb.OUTCOME_KIND_SHOWN),
            pb.Outcome(request_id="ed-0004-1", kind=pb.OUTCOME_KIND_SHOWN),  # typed through: shown again
            pb.Outcome(request_id="ed-0004-1", kind=pb.OUTCOME_KIND_REJECTED, shown_ms=5),
            pb.Outcome(request_id="ed-0004-1", kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=5),  # a second end
        ])
    assert (reply.recorded, reply.unknown_request_ids, reply.duplicates) == (2, 1, 2)
    assert point(stack.reader, "quickdraft.outcomes.unmatched", **{"quickdraft.reason": "unknown_request"}).value == 1
    assert point(stack.reader, "quickdraft.outcomes.unmatched", **{"quickdraft.reason": "duplicate"}).value == 2
    assert point(stack.reader, "quickdraft.suggestions.shown", **labels()).value == 1
    assert metric_points(stack.reader, "quickdraft.suggestions.accepted") == []


async def test_reports_need_the_bearer_token_like_every_rpc():
    s = await start_stack(token="s3cret-token")
    try:
        async with AsyncCompletionClient(s.address) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await anonymous.report_outcomes([pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_SHOWN)])
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with AsyncCompletionClient(s.address, token="s3cret-token") as client:
            assert (await client.report_outcomes([pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_SHOWN)])).unknown_request_ids == 1
    finally:
        await stop_stack(s)


async def test_stats_cli_and_the_sync_client(stack, capsys):
    from quickdraft.cli import main

    async with AsyncCompletionClient(stack.address) as client:
        await complete(client, "ed-0005-1", language="go")

    def report_and_print() -> int:
        with CompletionClient(stack.address) as sync:
            reply = sync.report_outcomes([pb.Outcome(request_id="ed-0005-1", kind=pb.OUTCOME_KIND_ACCEPTED, shown_ms=1500, accepted_chars=20,
                                                     suggestion_chars=20)], request_id_prefix="ed-0005-")
            assert reply.recorded == 1
        return main(["stats", "--server", stack.address])

    assert await asyncio.to_thread(report_and_print) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith("go ")]
    assert row.split()[:6] == ["go", "inline", "parallel", "K=5", "1", "1"] and "100.0%" in row and "20.0" in row and "1.5 s" in row
    assert any(line.startswith("total") for line in out.splitlines())
    assert "1 editor sessions reporting" in out
    assert await asyncio.to_thread(main, ["stats", "--server", stack.address, "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["total"]["accepted_chars"] == "20" and as_json["groups"][0]["language"] == "go"


# --- the book alone: never-shown waste, bounds ---------------------------------------


def record(request_id: str, finish: str = "stop", tokens: int = 12, user: str = "alice", language: str = "python") -> RequestRecord:
    return RequestRecord(latency_class="inline", ttft_s=0.01, tpot_s=0.01, duration_s=0.1, prompt_tokens=50, completion_tokens=tokens,
                         finish=finish, spec_label="parallel K=5", accepted_per_position=[], num_drafts=0, user=user,
                         request_id=request_id, language=language)


def book_with_clock(**kwargs) -> tuple[OutcomeBook, Telemetry, InMemoryMetricReader, list[float]]:
    reader = InMemoryMetricReader()
    telemetry = Telemetry("embedded", metric_reader=reader)
    clock = [0.0]
    return OutcomeBook(telemetry, clock=lambda: clock[0], **kwargs), telemetry, reader, clock


def test_never_shown_waste_counts_only_the_requests_of_sessions_that_report():
    book, telemetry, reader, clock = book_with_clock(grace_s=30.0)
    alice = Client("user:alice", "alice")
    finished = [record("vsc-1111-1", tokens=10), record("vsc-1111-2", tokens=7),  # a session that reports
                record("helix-2", tokens=100),  # the same user's other editor, which never reports
                record("vsc-1111-3", finish="cancelled", tokens=4),  # wasted already, as cancelled
                record("vsc-1111-4", finish="error", tokens=3)]
    for r in finished:
        telemetry.record(r)
        book.remember(r)
    book.report(pb.ReportOutcomesRequest(outcomes=[pb.Outcome(request_id="vsc-1111-1", kind=pb.OUTCOME_KIND_SHOWN)],
                                         request_id_prefix="vsc-1111-"), alice)
    clock[0] = 29.0
    assert book.stats().total.wasted_tokens_never_shown == 0  # still within its grace period
    clock[0] = 31.0
    stats = book.stats()
    assert stats.total.wasted_tokens_never_shown == 7 and stats.total.wasted_tokens_cancelled == 4
    assert point(reader, "quickdraft.tokens.wasted", **{"quickdraft.waste.reason": "never_shown"}).value == 7
    assert point(reader, "quickdraft.tokens.wasted", **{"quickdraft.waste.reason": "cancelled"}).value == 4
    never = point(reader, "quickdraft.tokens.wasted", **{"quickdraft.waste.reason": "never_shown"})
    assert never.attributes["quickdraft.latency_class"] == "inline" and never.attributes["quickdraft.speculative.config"] == "parallel K=5"


def test_a_client_that_never_reports_makes_nothing_look_wasted():
    book, telemetry, reader, clock = book_with_clock(grace_s=30.0)
    for i in range(50):
        book.remember(record(f"lsp-abcd1234-{i}"))
    clock[0] = 3600.0
    assert book.stats().total.wasted_tokens_never_shown == 0
    assert [p for p in metric_points(reader, "quickdraft.tokens.wasted") if p.attributes.get("quickdraft.waste.reason") == "never_shown"] == []


def test_a_session_that_stopped_reporting_is_no_longer_judged():
    book, telemetry, reader, clock = book_with_clock(grace_s=30.0, reporting_window_s=600.0)
    alice = Client("user:alice", "alice")
    book.report(pb.ReportOutcomesRequest(request_id_prefix="vsc-1111-"), alice)
    clock[0] = 1000.0
    book.remember(record("vsc-1111-9"))
    clock[0] = 1031.0
    assert book.stats().total.wasted_tokens_never_shown == 0


def test_outcomes_for_another_users_request_are_unknown():
    book, telemetry, reader, clock = book_with_clock()
    book.remember(record("vsc-1111-1", user="alice"))
    reply = book.report(pb.ReportOutcomesRequest(outcomes=[pb.Outcome(request_id="vsc-1111-1", kind=pb.OUTCOME_KIND_ACCEPTED)]),
                        Client("user:mallory", "mallory"))
    assert reply.unknown_request_ids == 1 and reply.recorded == 0
    assert book.stats().total.accepted == 0


def test_a_client_cannot_flood_the_book_and_others_keep_reporting():
    book, telemetry, reader, clock = book_with_clock(rate_per_s=10.0, burst=100)
    one = [pb.Outcome(request_id="x", kind=pb.OUTCOME_KIND_SHOWN)] * 60
    flood, calm = Client("ipv4:10.0.0.1"), Client("ipv4:10.0.0.2")
    book.report(pb.ReportOutcomesRequest(outcomes=one), flood)
    with pytest.raises(RequestError) as err:
        book.report(pb.ReportOutcomesRequest(outcomes=one), flood)
    assert err.value.code == "RESOURCE_EXHAUSTED" and "outcomes a second" in err.value.message
    assert book.report(pb.ReportOutcomesRequest(outcomes=one), calm).unknown_request_ids == 60
    clock[0] = 5.0  # 50 more allowed by now
    assert book.report(pb.ReportOutcomesRequest(outcomes=one[:50]), flood).unknown_request_ids == 50


def test_the_book_forgets_the_oldest_requests_past_its_bound():
    book, telemetry, reader, clock = book_with_clock(remembered=3)
    for i in range(5):
        book.remember(record(f"r-{i}"))
    reply = book.report(pb.ReportOutcomesRequest(outcomes=[pb.Outcome(request_id=f"r-{i}", kind=pb.OUTCOME_KIND_SHOWN) for i in range(5)]),
                        Client("user:alice", "alice"))
    assert (reply.recorded, reply.unknown_request_ids) == (3, 2)


def test_language_labels_are_a_closed_set():
    assert language_label("Python") == "python" and language_label("") == "unknown"
    assert language_label("x" * 60) == "other" and language_label(CODE) == "other"


# --- over HTTP ---------------------------------------------------------------------


@pytest.fixture
async def http():
    s = await start_stack()
    app = build_app(OpenAIServing(s.cfg, s.service, Auth(None), s.book))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quickdraft.test") as c:
        yield s, c
    await stop_stack(s)


async def test_http_outcomes_relate_to_an_http_completion(http):
    s, c = http
    r = await c.post("/v1/completions", json={"prompt": f"def {CODE}():", "max_tokens": 8}, headers={"X-Request-Id": "cont-7777-1"})
    assert r.status_code == 200, r.text
    r = await c.post("/v1/completions/outcomes", json={"request_id_prefix": "cont-7777-", "outcomes": [
        {"request_id": "cont-7777-1", "kind": "shown", "language_id": "typescript"},
        {"request_id": "cont-7777-1", "kind": "accepted", "shown_ms": 300, "accepted_chars": 6, "suggestion_chars": 9, "acceptance": "line"},
        {"request_id": "nobody", "kind": "rejected", "rejection": "dismissed"},
    ]})
    assert r.status_code == 200 and r.json() == {"recorded": 2, "unknown_request_ids": 1, "duplicates": 0}
    # The completion named no language (HTTP has none): the editor's word is used.
    assert point(s.reader, "quickdraft.suggestions.accepted", **labels("typescript"), **{"quickdraft.acceptance": "line"}).value == 1


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"outcomes": [{"request_id": "x", "kind": "seen"}]}, "outcomes[0].kind", 400),
    ({"outcomes": [{"kind": "shown"}]}, "outcomes[0].request_id", 400),
    ({"outcomes": [{"request_id": "x", "kind": "accepted", "shown_ms": "long"}]}, "outcomes[0].shown_ms", 400),
    ({"outcomes": [{"request_id": "x", "kind": "accepted", "accepted_chars": -1}]}, "outcomes[0].accepted_chars", 400),
    ({"outcomes": [{"request_id": "x", "kind": "accepted", "accepted_chars": int("9" * 50)}]}, "outcomes[0].accepted_chars", 400),
    ({"outcomes": [{"request_id": "x", "kind": "shown", "accepted_chars": 3}]}, "outcomes[0].accepted_chars", 400),
    ({"outcomes": [{"request_id": "x", "kind": "accepted", "shown_ms": 1e12}]}, "outcomes[0].shown_ms", 400),
    ({"outcomes": "all of them"}, "outcomes", 400),
    ({"outcomes": [{"request_id": "x", "kind": "shown"}] * 257}, "outcomes", 400),
    ({"outcomes": [], "request_id_prefix": 7}, "request_id_prefix", 400),
])
async def test_http_bad_outcomes_are_refused_naming_the_parameter(http, body, param, status):
    s, c = http
    r = await c.post("/v1/completions/outcomes", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param) and error["code"] == "INVALID_ARGUMENT"
    r = await c.post("/v1/completions/outcomes", json={"outcomes": [{"request_id": "x", "kind": "shown"}]})
    assert r.status_code == 200  # and the next report is taken


async def test_http_outcomes_need_json_and_the_token():
    s = await start_stack()
    try:
        app = build_app(OpenAIServing(s.cfg, s.service, Auth("s3cret-token"), s.book))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quickdraft.test") as c:
            r = await c.post("/v1/completions/outcomes", json={"outcomes": []})
            assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
            auth = {"Authorization": "Bearer s3cret-token"}
            r = await c.post("/v1/completions/outcomes", content=b"outcomes=1", headers={**auth, "Content-Type": "text/plain"})
            assert r.status_code == 415
            r = await c.post("/v1/completions/outcomes", json={"outcomes": []}, headers=auth)
            assert r.status_code == 200 and r.json()["recorded"] == 0
    finally:
        await stop_stack(s)


def test_docs_metrics_lists_every_series_the_server_makes():
    """docs/metrics.md names every instrument of server/telemetry.py by its Prometheus name."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    source = (root / "server" / "telemetry.py").read_text()
    names = re.findall(r'create_(counter|histogram)\(\s*"([\w.]+)"', source)
    assert len(names) >= 15 and ("counter", "quickdraft.suggestions.shown") in names
    doc = (root / "docs" / "metrics.md").read_text()
    missing = []
    for kind, name in names:
        prometheus = name.replace(".", "_") + ("_total" if kind == "counter" else "")
        if f"`{prometheus}" not in doc:
            missing.append(prometheus)
    assert not missing, f"docs/metrics.md does not list {missing}"
