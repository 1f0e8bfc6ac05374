"""CompletionService and EngineManager with a fake engine: timings, speculative
figures, cancellation, switching without dropping requests (no vLLM, no network)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from quickdraft.server.config import load_config
from quickdraft.server.engine import EngineSnapshot
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.errors import RequestError
from quickdraft.server.presets import embedded_dir
from quickdraft.server.prompt_tokens import PromptTokenizer
from quickdraft.server.service import CompletionService, Timing, speculative_stats
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import Telemetry
from quickdraft.v1 import completion_pb2 as pb

TOKENIZER = AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))
PROMPT_TOKENS = PromptTokenizer(TOKENIZER)


@dataclass
class FakeEngine:
    """Streams ``steps``; ``live`` like a live vLLM engine of the embedded
    preset: K, the schedule and off switch in place, the drafting mode does
    not (the preset ships one drafter per mode)."""

    spec: SpecConfig
    live: bool = False
    steps: list[tuple[str, int]] = field(default_factory=lambda: [("def", 1), (" f(", 3), ("):", 2)])
    histogram: list[int] = field(default_factory=lambda: [1, 0, 1, 0, 0, 0])
    delay: float = 0.0
    aborted: list[str] = field(default_factory=list)
    unfinished: set = field(default_factory=set)
    dead: bool = False
    tokenizer: object = TOKENIZER
    prompt_tokens: PromptTokenizer = PROMPT_TOKENS
    stop_token_ids: list[int] = field(default_factory=lambda: [0])
    snapshot: EngineSnapshot = field(default_factory=EngineSnapshot)
    switches: int = 0
    max_k: int = 7
    drafter: str | None = None

    def can_switch_to(self, spec: SpecConfig) -> bool:
        if not self.live:
            return spec == self.spec
        return spec.k <= self.max_k and (not spec.enabled or not self.spec.enabled or spec.parallel == self.spec.parallel)

    async def switch(self, spec: SpecConfig) -> float:
        if not self.can_switch_to(spec):
            raise ValueError(f"cannot switch {self.spec.label()} to {spec.label()} live")
        if spec != self.spec:
            self.switches += 1
        self.spec = spec
        return 0.001

    def describe(self) -> str:
        return self.spec.label()

    async def generate(self, request_id, prompt_ids, sampling):
        self.unfinished.add(request_id)
        try:
            for i, (text, n) in enumerate(self.steps):
                await asyncio.sleep(self.delay)
                last = i == len(self.steps) - 1
                metrics = SimpleNamespace(histogram=self.histogram, num_draft_tokens=sum(self.histogram) * self.spec.k) if last else None
                out = SimpleNamespace(text=text, token_ids=list(range(n)), finish_reason="length" if last else None, spec_decode_metrics=metrics)
                yield SimpleNamespace(outputs=[out])
            self.unfinished.discard(request_id)
        finally:
            pass

    async def abort(self, request_id):
        self.aborted.append(request_id)
        self.unfinished.discard(request_id)

    def num_unfinished(self):
        return len(self.unfinished)

    def shutdown(self):
        self.dead = True


def make_service(engine_factory):
    cfg = load_config(env={})
    manager = EngineManager(cfg, engine_factory=engine_factory)
    return cfg, manager, CompletionService(cfg, manager, Telemetry("embedded"))


async def collect(service, req, client="c"):
    return [m async for m in service.complete(req, client)]


def test_timing_and_speculative_figures():
    async def run():
        engines = []

        async def factory(cfg, mode, live=False):
            engines.append(FakeEngine(mode, live))
            return engines[-1]

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig(True, 5))
        msgs = await collect(service, pb.CompleteRequest(prefix="x = "))
        await manager.stop()
        return msgs

    msgs = asyncio.run(run())
    assert [m.text for m in msgs[:-1]] == ["def", " f(", "):"]
    final = msgs[-1].final
    assert final.completion_tokens == 6 and final.finish_reason == pb.FINISH_REASON_LENGTH
    spec = final.speculative
    # histogram [1, 0, 1, 0, 0, 0]: one step accepted 0 drafts, one accepted 2.
    assert spec.num_drafts == 2 and spec.num_accepted_tokens == 2
    assert list(spec.accepted_per_position) == [1, 1, 0, 0, 0]
    assert spec.mean_acceptance_length == pytest.approx(2.0)


class EngineWideOnly(FakeEngine):
    """vLLM 0.24: no per-request counters; the stat logger's engine-wide ones
    grow as the engine steps (here: 2 verify steps of K=5, per-position
    acceptance 1, 1, 0, 0, 0 over them; another request's steps too)."""

    per_request_metrics = False

    async def generate(self, request_id, prompt_ids, sampling):
        snap = self.snapshot
        async for out in super().generate(request_id, prompt_ids, sampling):
            snap.drafts += 2
            snap.draft_tokens += 10
            per = [2, 1, 0, 0, 0]
            snap.accepted_per_position = [a + b for a, b in zip(snap.accepted_per_position or [0] * 5, per)]
            out.outputs[0].spec_decode_metrics = None
            yield out


def test_without_per_request_counters_the_engines_over_the_request_are_scaled_to_it():
    async def run():
        async def factory(cfg, mode, live=False):
            engine = EngineWideOnly(mode, live)
            engine.snapshot.drafts, engine.snapshot.accepted_per_position = 100, [90, 50, 10, 0, 0]  # before: not this request's
            return engine

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig(True, 5))
        seen = []
        service.observers.callbacks.append(lambda record, spec: seen.append(spec))
        msgs = await collect(service, pb.CompleteRequest(prefix="x = "))
        await manager.stop()
        return msgs[-1].final, seen

    final, seen = asyncio.run(run())
    spec = final.speculative
    # Over the request: 6 drafts, accepted at position 1 in 6 of them, at 2 in 3, so 1.5 tokens
    # per draft; its 6 tokens after the first one came from round(5 / 2.5) = 2 verify steps.
    assert spec.estimated_from_engine and spec.num_drafts == 2 and spec.num_draft_tokens == 10
    assert list(spec.accepted_per_position) == [2, 1, 0, 0, 0]
    assert spec.mean_acceptance_length == pytest.approx(2.5)
    assert seen and seen[0].num_drafts == 2  # the controller gets drafts to measure step time with


def test_engine_window_metrics_needs_drafts_in_the_window():
    from quickdraft.server.engine import EngineSnapshot
    from quickdraft.server.service import engine_window_metrics

    snap = EngineSnapshot(drafts=10, draft_tokens=50, accepted_per_position=[5, 2])
    assert engine_window_metrics(snap, snap, 20) is None
    after = EngineSnapshot(drafts=20, draft_tokens=100, accepted_per_position=[10, 4])
    m = engine_window_metrics(snap, after, 2)
    assert sum(m.histogram) == 1 and m.num_draft_tokens == 5 and m.estimated


def test_the_record_carries_the_load_at_the_first_token():
    """The controller files TTFT under the load its first token met; the engine
    runs 5 requests then, and 1 by the time this one ends."""
    async def run():
        engine = FakeEngine(SpecConfig(True, 5), delay=0.01)

        async def factory(cfg, mode, live=False):
            return engine

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig(True, 5))
        records = []
        service.observers.callbacks.append(lambda record, spec: records.append(record))
        engine.snapshot.running = 5
        seen = []
        async for msg in service.complete(pb.CompleteRequest(prefix="x = "), "c"):
            seen.append(msg)
            engine.snapshot.running = 1
        await manager.stop()
        return records

    [record] = asyncio.run(run())
    assert record.running_at_first_token == 5


def test_timing_definitions():
    t = Timing(arrival=10.0)
    t.add(1, 10.2)
    t.add(3, 10.5)
    t.add(0, 11.0)  # no tokens: not a token time
    assert t.ttft == pytest.approx(0.2)
    assert t.tpot == pytest.approx(0.3 / 3)
    assert Timing(arrival=0).tpot is None


def test_a_live_engines_longer_histogram_reports_the_k_it_runs():
    """A live engine's histogram has a slot per position up to its largest K."""
    running_k5 = SpecConfig(True, 5)
    stats = speculative_stats(SimpleNamespace(histogram=[1, 1, 1, 0, 0, 1, 0, 0], num_draft_tokens=20), running_k5)
    assert list(stats.accepted_per_position) == [3, 2, 1, 1, 1]
    # Switched down from K=7 during the request: the positions it drafted then still count.
    stats = speculative_stats(SimpleNamespace(histogram=[1, 0, 0, 0, 0, 0, 0, 1], num_draft_tokens=12), running_k5)
    assert list(stats.accepted_per_position) == [1] * 7


def test_speculation_off_reports_disabled():
    stats = speculative_stats(None, SpecConfig.off())
    assert not stats.enabled and stats.num_drafts == 0


def test_cancel_aborts_the_engine_request():
    async def run():
        eng = FakeEngine(SpecConfig(True, 5), delay=0.05, steps=[("a", 1)] * 50)

        async def factory(cfg, mode, live=False):
            return eng

        cfg, manager, service = make_service(factory)
        await manager.start(eng.spec)

        async def consume():
            async for _ in service.complete(pb.CompleteRequest(prefix="x")):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await manager.stop()
        return eng

    eng = asyncio.run(run())
    assert len(eng.aborted) == 1 and eng.num_unfinished() == 0


def test_switch_keeps_in_flight_requests_and_routes_new_ones():
    async def run():
        made = []

        async def factory(cfg, mode, live=False):
            made.append(FakeEngine(mode, live, delay=0.02, steps=[("a", 1)] * 10))
            return made[-1]

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig(True, 5))
        old_stream = asyncio.create_task(collect(service, pb.CompleteRequest(prefix="x")))
        await asyncio.sleep(0.05)
        assert await manager.switch(SpecConfig(False, 3), "test")
        new_msgs = await collect(service, pb.CompleteRequest(prefix="y"))
        old_msgs = await old_stream
        await asyncio.sleep(0.05)
        await manager.stop()
        return made, old_msgs, new_msgs, manager

    made, old_msgs, new_msgs, manager = asyncio.run(run())
    assert old_msgs[-1].final.speculative.parallel_drafting, "the in-flight request finished on the old engine"
    assert not new_msgs[-1].final.speculative.parallel_drafting and new_msgs[-1].final.speculative.num_speculative_tokens == 3
    assert made[0].dead, "the old engine was retired once idle"
    assert manager.stats.rebuilds == 1


def test_a_live_switch_mid_request_is_reported_and_builds_nothing():
    async def run():
        made = []

        async def factory(cfg, spec, live=False):
            made.append(FakeEngine(spec, live, delay=0.02, steps=[("a", 1)] * 10))
            return made[-1]

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig(True, 5))
        spanning = asyncio.create_task(collect(service, pb.CompleteRequest(prefix="x")))
        await asyncio.sleep(0.05)
        assert await manager.switch(SpecConfig(True, 7), "test")
        after = await collect(service, pb.CompleteRequest(prefix="y"))
        during = await spanning
        info = service.server_info()
        await manager.stop()
        return made, during, after, manager, info

    made, during, after, manager, info = asyncio.run(run())
    assert len(made) == 1 and made[0].live
    assert manager.stats.live_switches == 1 and manager.stats.rebuilds == 0
    spanned = during[-1].final.speculative
    assert (spanned.config, spanned.live_switches, spanned.config_at_end) == ("parallel K=5", 1, "parallel K=7")
    clean = after[-1].final.speculative
    assert (clean.config, clean.live_switches, clean.config_at_end) == ("parallel K=7", 0, "")
    assert info.speculative.label == "parallel K=7" and info.speculative.live and info.speculative.live_switches == 1


def test_failed_switch_keeps_the_old_engine():
    async def run():
        calls = []

        async def factory(cfg, mode, live=False):
            calls.append(mode)
            if len(calls) == 2:
                raise RuntimeError("out of memory")
            return FakeEngine(mode, live)

        cfg, manager, service = make_service(factory)
        await manager.start(SpecConfig(True, 5))
        ok = await manager.switch(SpecConfig(False, 3))  # another drafter: a new engine
        msgs = await collect(service, pb.CompleteRequest(prefix="x"))
        await manager.stop()
        return ok, msgs, manager

    ok, msgs, manager = asyncio.run(run())
    assert not ok and manager.stats.failed_switches == 1
    assert msgs[-1].final.speculative.num_speculative_tokens == 5


def test_admission_limits_and_unavailable_engine():
    async def run():
        eng = FakeEngine(SpecConfig(True, 5), delay=0.05, steps=[("a", 1)] * 20)

        async def factory(cfg, mode, live=False):
            return eng

        cfg, manager, service = make_service(factory)
        with pytest.raises(RequestError, match="engine is starting"):
            await collect(service, pb.CompleteRequest(prefix="x"))
        await manager.start(eng.spec)
        service.admission.max_per_client = 1
        first = asyncio.create_task(collect(service, pb.CompleteRequest(prefix="x"), client="alice"))
        await asyncio.sleep(0.02)
        with pytest.raises(RequestError) as err:
            await collect(service, pb.CompleteRequest(prefix="x"), client="alice")
        other = await collect(service, pb.CompleteRequest(prefix="x"), client="bob")
        await first
        await manager.stop()
        return err.value, other

    err, other = asyncio.run(run())
    assert err.code == "RESOURCE_EXHAUSTED" and "max_streams_per_client" in err.message
    assert other[-1].HasField("final")


def test_closing_the_stream_aborts_at_once():
    """aclose() on complete() must reach the engine now, not at garbage collection."""

    async def run():
        eng = FakeEngine(SpecConfig(True, 5), delay=0.01, steps=[("a", 1)] * 50)

        async def factory(cfg, mode, live=False):
            return eng

        cfg, manager, service = make_service(factory)
        await manager.start(eng.spec)
        gen = service.complete(pb.CompleteRequest(prefix="x"))
        await gen.__anext__()
        await gen.aclose()
        aborted_now = list(eng.aborted)
        open_streams = service.admission.open
        await manager.stop()
        return aborted_now, open_streams

    aborted_now, open_streams = asyncio.run(run())
    assert len(aborted_now) == 1
    assert open_streams == 0


@pytest.mark.parametrize("controller_state", [None, lambda: None])
async def test_controller_state_without_a_controller_reports_the_static_config(controller_state):
    """A server started without --controller answers GetControllerState with
    enabled = false and the config it runs, not an error."""
    from quickdraft.server.grpc_server import CompletionServicer

    spec = pb.SpeculativeConfig(method="eagle3", parallel_drafting=True, num_speculative_tokens=5)
    service = SimpleNamespace(server_info=lambda: pb.ServerInfo(speculative=spec))
    servicer = CompletionServicer(service, controller_state=controller_state)
    state = await servicer.GetControllerState(pb.GetControllerStateRequest(), context=None)
    assert state.enabled is False
    assert state.active.num_speculative_tokens == 5 and state.active.parallel_drafting


def test_fallback_spec_after_a_crash_loop():
    from quickdraft.server.engine_manager import fallback_spec

    configured = SpecConfig(True, 5)
    scheduled = SpecConfig.scheduled(True, [(1, 2, 5), (3, 16, 1)])
    assert fallback_spec(scheduled, configured) == configured
    assert fallback_spec(scheduled, scheduled) == SpecConfig(True, 5)
    assert fallback_spec(configured, configured) == SpecConfig.off()


async def test_an_engine_that_keeps_dying_young_is_restarted_with_another_config():
    """Two quick deaths under the same config: the third start uses the
    configured static config (here P-EAGLE K=5) instead of the crashing one."""
    import time as _time

    started: list[SpecConfig] = []

    async def factory(cfg, mode, live=False):
        started.append(mode)
        e = FakeEngine(mode, live)
        e.started_at = _time.time()
        return e

    cfg, manager, _ = make_service(factory)
    crashing = SpecConfig.scheduled(True, [(1, 2, 5), (3, 16, 1)])
    await manager.start(crashing)
    for _ in range(2):
        manager.engine.dead = True
        for _ in range(100):
            await asyncio.sleep(0.05)
            if not manager.engine.dead and manager.state == "serving":
                break
    assert started == [crashing, crashing, cfg.spec_config()]
    assert manager.stats.fallbacks == 1 and manager.stats.restarts == 2
    await manager.stop()


def test_serve_exits_1_when_the_engine_cannot_be_restarted(monkeypatch):
    """The engine dies and every restart attempt fails: the manager gives up
    (FAILED) and `serve_forever` returns 1, for a supervisor to restart the
    server, instead of staying up NOT_SERVING."""
    from quickdraft.server import engine_manager as em
    from quickdraft.server.app import QuickdraftServer
    from quickdraft.server.config import load_config

    monkeypatch.setattr(em, "RESTART_BACKOFF_S", (0.0, 0.0, 0.0))
    builds: list[SpecConfig] = []

    async def factory(cfg, mode, live=False):
        builds.append(mode)
        if len(builds) > 1:
            raise RuntimeError("no memory for a new engine")
        return FakeEngine(mode, live)

    cfg = load_config(env={}, overrides={"server.port": 0, "telemetry.metrics_port": 0})
    server = QuickdraftServer(cfg, engine_factory=factory)

    async def run() -> int:
        serving = asyncio.create_task(server.serve_forever())
        for _ in range(200):
            await asyncio.sleep(0.05)
            if server.engines.state == em.SERVING:
                break
        assert server.engines.state == em.SERVING
        server.engines.engine.dead = True
        return await asyncio.wait_for(serving, 30)

    assert asyncio.run(run()) == 1
    assert len(builds) == 1 + len(em.RESTART_BACKOFF_S)
    assert server._failed.is_set()  # it exited because the manager gave up, not for a signal


def test_shutdown_counts_unfinished_requests_the_way_vllm_0_24_allows():
    """vLLM 0.24's AsyncLLM has no get_num_unfinished_requests (0.32's has):
    the count before cancelling the output handler comes from the output
    processor, which both versions have, so a 0.24 shutdown raises nothing."""
    from quickdraft.server.engine import _num_unfinished, _stop_output_handler

    class OutputProcessor:
        def __init__(self, n: int):
            self.n = n

        def get_num_unfinished_requests(self) -> int:
            return self.n

    class AsyncLLM024:  # the attributes 0.24 has, and no more
        def __init__(self, n: int):
            self.output_processor = OutputProcessor(n)
            self.output_handler = None

    assert not hasattr(AsyncLLM024(0), "get_num_unfinished_requests")
    assert _num_unfinished(AsyncLLM024(3)) == 3
    _stop_output_handler(AsyncLLM024(0))  # no task: nothing to cancel, and no AttributeError


def _metric_points(reader, name: str) -> list:
    data = reader.get_metrics_data()
    return [p for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == name for p in m.data.data_points]


def test_tokens_generated_for_a_cancelled_request_are_counted_as_wasted():
    """quickdraft.tokens.wasted: the output tokens a request had when its
    client cancelled it, labelled by latency class and config; a request that
    finishes adds nothing."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()

    async def run():
        eng = FakeEngine(SpecConfig(True, 5), delay=0.02, steps=[("a", 1)] * 200)

        async def factory(cfg, mode, live=False):
            return eng

        cfg = load_config(env={})
        manager = EngineManager(cfg, engine_factory=factory)
        service = CompletionService(cfg, manager, Telemetry("embedded", metric_reader=reader))
        await manager.start(eng.spec)
        eng.steps = [("a", 1)] * 3
        await collect(service, pb.CompleteRequest(prefix="x"))  # finishes: nothing wasted
        assert _metric_points(reader, "quickdraft.tokens.wasted") == []
        eng.steps = [("a", 1)] * 200
        seen = 0

        async def consume():
            nonlocal seen
            async for m in service.complete(pb.CompleteRequest(prefix="x"), "c"):
                seen += len(m.text)

        task = asyncio.create_task(consume())
        while seen < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await manager.stop()
        return seen

    seen = asyncio.run(run())
    points = _metric_points(reader, "quickdraft.tokens.wasted")
    assert len(points) == 1
    assert points[0].value >= seen >= 5  # every token streamed before the cancel, one "a" each
    assert points[0].attributes["quickdraft.latency_class"] == "inline"
    assert points[0].attributes["quickdraft.speculative.config"] == "parallel K=5"
