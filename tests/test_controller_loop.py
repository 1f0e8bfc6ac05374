"""The server side of the controller: observations from finished requests,
decisions applied as engine switches, profiles saved, state over the RPC.
Fake engines, real Controller."""

from __future__ import annotations

import asyncio
import json
import dataclasses
import time
from types import SimpleNamespace

import pytest

from quickdraft.server.config import load_config
from quickdraft.server.controller import Decision
from quickdraft.server.controller.measured import Window
from quickdraft.server.controller_loop import ControllerLoop, runnable
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.service import CompletionService
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb
from tests.test_service import FakeEngine


def test_a_parallel_schedule_runs_as_is_unless_the_cpu_build_would_crash(monkeypatch):
    from quickdraft.server import controller_loop

    sched = SpecConfig.scheduled(True, [(1, 1, 7), (2, 16, 3)])
    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: False)  # vLLM's CPU build
    assert runnable(sched, live_switching=True) == sched  # live switching sets the slots per step
    assert runnable(sched, live_switching=False) == SpecConfig(True, 7)
    ar = SpecConfig.scheduled(False, [(1, 2, 5), (3, 16, 1)])
    assert runnable(ar, live_switching=False) == ar
    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: True)  # vLLM's CUDA build
    assert runnable(sched, live_switching=False) == sched


def make(tmp_path, **overrides):
    cfg = load_config(env={}, overrides={"controller.enabled": "true", "controller.profile_dir": str(tmp_path), **overrides})
    made = []

    async def factory(cfg, spec, live=False):
        made.append(FakeEngine(spec, live=live))
        return made[-1]

    manager = EngineManager(cfg, engine_factory=factory)
    telemetry = Telemetry("embedded")
    service = CompletionService(cfg, manager, telemetry)
    return cfg, manager, service, ControllerLoop(cfg, manager, service, telemetry), made


def test_finished_requests_become_observations(tmp_path):
    async def run():
        cfg, manager, service, loop, _ = make(tmp_path)
        await manager.start(loop.start_spec())
        loop.start()
        async for _ in service.complete(pb.CompleteRequest(prefix="x")):
            pass
        # A cancelled request is not an observation.
        service.observers(RequestRecord("inline", 0.1, None, 0.2, 5, 1, "cancelled", "parallel K=5", [], 0), pb.SpeculativeStats())
        loop.stop()
        await manager.stop()
        return loop

    loop = asyncio.run(run())
    assert loop.ctl.observations == 1
    assert loop.ctl.state().acceptance["parallel"].trials[0] > 0


def test_requests_served_while_an_engine_is_built_are_not_observations(tmp_path, monkeypatch):
    from quickdraft.server.controller.estimator import Estimator

    async def run():
        cfg, manager, service, loop, _ = make(tmp_path)
        await manager.start(loop.start_spec())
        manager._prewarming.add(SpecConfig.off())  # as during prewarm(); a switch sets SWITCHING likewise
        assert manager.building
        async for _ in service.complete(pb.CompleteRequest(prefix="x")):
            pass
        assert loop.ctl.observations == 0 and loop.skipped_during_builds == 1
        # ... but they say how much a build slows the serving engine, once the model predicts its TPOT (1 ms here)
        monkeypatch.setattr(Estimator, "ready", property(lambda self: True))
        monkeypatch.setattr(loop.ctl.estimator, "plan", lambda engine, load: SimpleNamespace(prediction=SimpleNamespace(tpot_s=0.001)))
        loop.on_request(RequestRecord("inline", 0.1, 0.003, 0.2, 5, 8, "stop", "parallel K=5", [], 0), pb.SpeculativeStats())
        assert loop.ctl.rebuild.slowdown == pytest.approx(3.0) and loop.ctl.observations == 0
        manager._prewarming.clear()
        async for _ in service.complete(pb.CompleteRequest(prefix="x")):
            pass
        assert loop.ctl.observations == 1
        await manager.stop()

    asyncio.run(run())


def test_requests_that_shared_the_machine_with_a_draining_engine_are_not_observations(tmp_path):
    """After a switch the old engine finishes its streams on the same cores:
    requests of the new engine that overlap that drain measure both engines,
    so they are skipped, and so is one that started before the drain ended."""
    async def run():
        cfg, manager, service, loop, made = make(tmp_path, **{"controller.standby_engines": "0"})
        await manager.start(loop.start_spec())
        old_stream = manager.lease()
        await old_stream.__aenter__()  # a stream still running on the old engine
        assert await manager.switch(SpecConfig.off(), "test")
        assert manager.contended and not manager.building
        async for _ in service.complete(pb.CompleteRequest(prefix="x")):
            pass
        assert loop.ctl.observations == 0 and loop.skipped_while_shared == 1
        await old_stream.__aexit__(None, None, None)  # the drain is over; the old engine is shut down
        for _ in range(500):
            if made[0].dead and not manager.contended:
                break
            await asyncio.sleep(0.01)
        assert not manager.contended and made[0].dead
        # finished now, but started 5 s ago, while the old engine still ran
        loop.on_request(RequestRecord("inline", 0.1, 0.003, 5.0, 5, 8, "stop", "off", [], 0), pb.SpeculativeStats())
        assert loop.ctl.observations == 0 and loop.skipped_while_shared == 2
        await asyncio.sleep(0.01)
        async for _ in service.complete(pb.CompleteRequest(prefix="x")):
            pass
        assert loop.ctl.observations == 1
        await manager.stop()

    asyncio.run(run())


def test_a_switch_decision_rebuilds_the_engine_and_saves_the_profile(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        await manager.start(loop.start_spec())
        loop.start()
        loop._task.cancel()  # drive tick() by hand
        current = SpecConfig(True, 5)
        target = SpecConfig(False, 3)
        decision = Decision("switch", current, target, target, 0.2, "autoregressive K=3 predicted 20% faster", "better", loop.clock())
        loop.ctl.decide = lambda now=None: decision
        applied = []
        real_applied = loop.ctl.applied
        loop.ctl.applied = lambda d, **kw: (applied.append(d), real_applied(d, **kw))
        await loop.tick()
        state = loop.state_proto()
        loop.stop()
        await manager.stop()
        return manager, made, applied, state, loop

    manager, made, applied, state, loop = asyncio.run(run())
    assert [e.spec for e in made] == [SpecConfig(True, 5), SpecConfig(False, 3)]
    assert manager.stats.rebuilds == 1 and loop.applied_switches == 1
    assert len(applied) == 1
    assert state.enabled and state.engine_rebuilds == 1
    assert state.profile_path.startswith(str(tmp_path))
    assert any(tmp_path.iterdir()), "no profile written"


def test_failed_switch_is_reported_to_the_controller(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        calls = {"n": 0}

        async def flaky(cfg, spec, live=False):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("no memory")
            return FakeEngine(spec)

        manager._factory = flaky
        await manager.start(loop.start_spec())
        loop.start()
        loop._task.cancel()
        target = SpecConfig.off()
        decision = Decision("fallback", SpecConfig(True, 5), target, target, -0.1, "acceptance collapsed", "acceptance_collapse", loop.clock())
        loop.ctl.decide = lambda now=None: decision
        failed = []
        loop.ctl.apply_failed = lambda d, err="", **kw: failed.append(err)
        await loop.tick()
        loop.stop()
        await manager.stop()
        return manager, failed, loop

    manager, failed, loop = asyncio.run(run())
    assert failed and loop.failed_switches == 1
    assert manager.engine is None or manager.engine.spec == SpecConfig(True, 5)


def test_parallel_candidates_respect_the_drafter_limit(tmp_path):
    cfg, manager, service, loop, _ = make(tmp_path)
    ks = {c.k for c in loop.ctl.settings.candidates if c.parallel}
    assert ks and max(ks) <= cfg.preset.max_parallel_k


# -- warm standby engines (controller.standby_engines) ---------------------------


def test_standby_engine_makes_the_switch_back_instant(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path, **{"controller.standby_engines": "1"})
        a, b, c = SpecConfig(False, 3), SpecConfig.off(), SpecConfig(True, 5)
        await manager.start(a)
        assert await manager.switch(b, "to off")  # built: a stays warm
        assert len(made) == 2 and not made[0].dead and manager.standby == {a: made[0]}
        assert await manager.switch(a, "back")  # instant: nothing built
        assert len(made) == 2 and manager.engine is made[0] and manager.standby == {b: made[1]}
        assert manager.stats.instant_switches == 1 and manager.stats.rebuilds == 1
        assert await manager.switch(c, "third config")  # built; one standby allowed: b goes, a stays warm
        await asyncio.sleep(0.05)  # let the retire task run
        assert len(made) == 3 and manager.standby == {a: made[0]} and made[1].dead
        await manager.stop()
        assert all(e.dead for e in made)

    asyncio.run(run())


def test_tick_tells_the_controller_which_engines_are_warm(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path, **{"controller.standby_engines": "1"})
        warm = SpecConfig.scheduled(False, [(1, 2, 3), (3, 16, 1)])
        await manager.start(warm)
        assert await manager.switch(SpecConfig.off(), "to off")  # the scheduled engine stays warm
        loop._task = None
        seen = []
        real = loop.ctl.set_warm
        loop.ctl.set_warm = lambda engines, live=None: (seen.append((list(engines), live)), real(seen[-1][0], live))
        await loop.tick()
        await manager.stop()
        return seen, warm

    seen, warm = asyncio.run(run())
    assert len(seen) == 1 and seen[0][0] == [warm]
    assert seen[0][0][0].k_for(4) == 1


def test_a_live_engine_tells_the_controller_every_setting_it_can_switch_to(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        await manager.start(SpecConfig(True, 5))
        loop._task = None
        seen = []
        real = loop.ctl.set_warm
        loop.ctl.set_warm = lambda engines, live=None: (seen.append(live), real(engines, live))
        await loop.tick()
        await manager.stop()
        return seen

    (live,) = asyncio.run(run())
    assert live(SpecConfig(True, 7)) and live(SpecConfig.scheduled(True, [(1, 1, 7), (2, 16, 2)]))
    assert not live(SpecConfig(True, 8)), "K above the engine's maximum needs a rebuild"
    assert not live(SpecConfig(False, 2)), "the embedded preset drafts autoregressively with another head"
    assert not live(SpecConfig.off()), "off is a plain engine on the CPU (speculation.off_engine = auto)"


def test_a_decision_the_engine_can_run_live_is_a_live_switch_not_a_rebuild(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path, **{"controller.allow_rebuild": "false"})
        await manager.start(loop.start_spec())
        loop.start()
        loop._task.cancel()
        target = SpecConfig.scheduled(True, [(1, 1, 7), (2, 16, 3)])
        decision = Decision("switch", SpecConfig(True, 5), target.at(1), target, 0.1, "test", "better", loop.clock())
        loop.ctl.decide = lambda now=None: decision
        applied = []
        real = loop.ctl.applied
        loop.ctl.applied = lambda d, **kw: (applied.append(kw["rebuilt"]), real(d, **kw))
        await loop.tick()
        state = loop.state_proto()
        loop.stop()
        await manager.stop()
        return manager, made, applied, state

    manager, made, applied, state = asyncio.run(run())
    assert len(made) == 1 and made[0].spec.per_batch_size == ((1, 1, 7), (2, 16, 3))
    assert applied == [False]  # allow_rebuild = false does not stop a live switch
    assert manager.stats.live_switches == 1 and manager.stats.rebuilds == 0
    assert state.live_switches == 1 and state.engine_rebuilds == 0


def test_without_standby_the_old_engine_is_retired(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        await manager.start(SpecConfig.off())
        await manager.switch(SpecConfig(False, 3))
        await asyncio.sleep(0.05)
        assert made[0].dead and manager.standby == {}
        await manager.stop()

    asyncio.run(run())


def test_a_stream_that_outlives_its_engines_drain_timeout_ends_cleanly(tmp_path):
    """The engine switched away from is stopped after its drain timeout even
    if a stream still runs on it; that stream's end must not fail (it once
    raised KeyError: the retire had dropped the engine's stream count)."""
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        await manager.start(SpecConfig.off())
        async with manager.lease() as engine:
            assert engine is made[0]
            assert await manager.switch(SpecConfig(False, 3), drain_timeout=0.01)
            for _ in range(100):  # the retire gives up waiting, then stops the engine
                await asyncio.sleep(0.01)
                if made[0].dead and id(made[0]) not in manager._in_flight:
                    break
            assert made[0].dead and id(made[0]) not in manager._in_flight
        assert manager.in_flight() == 0
        async with manager.lease() as engine:
            assert engine is made[1] and manager.in_flight() == 1
        await manager.stop()

    asyncio.run(run())


def test_prewarm_builds_the_full_batch_pick_and_the_switch_to_it_is_instant(tmp_path, monkeypatch):
    from quickdraft.server.controller.estimator import Estimator

    async def run():
        cfg, manager, service, loop, made = make(tmp_path, **{"controller.standby_engines": "1"})
        await manager.start(SpecConfig(False, 3))
        monkeypatch.setattr(Estimator, "ready", property(lambda self: True))
        loop.ctl.recommend = lambda load: SimpleNamespace(engine=SpecConfig.off() if load >= 8 else SpecConfig(False, 3))
        assert loop.full_batch_spec() == SpecConfig.off()
        rebuild_before = loop.ctl.rebuild.seconds
        assert await loop.prewarm()
        assert len(made) == 2 and manager.standby == {SpecConfig.off(): made[1]}
        # a build beside the serving engine is what a rebuild costs: it updates the estimate
        assert loop.ctl.rebuild.seconds != rebuild_before and loop.ctl.rebuild.measured
        assert not await loop.prewarm()  # already warm
        # an exploration elsewhere keeps the prewarmed engine: the switched-away one is not kept instead
        assert await manager.switch(SpecConfig(True, 7), "probe")
        await asyncio.sleep(0.05)
        assert manager.standby == {SpecConfig.off(): made[1]} and made[0].dead
        assert await manager.switch(SpecConfig(False, 3), "back")
        await asyncio.sleep(0.05)
        assert manager.standby == {SpecConfig.off(): made[1]} and len(made) == 4
        # a controller decision to go to off is then applied without a rebuild
        loop.start()
        loop._task.cancel()
        current, target = SpecConfig(False, 3), SpecConfig.off()
        decision = Decision("switch", current, target, target, 0.2, "off predicted 20% faster at 8", "better", loop.clock())
        loop.ctl.decide = lambda now=None: decision
        seen = []
        real = loop.ctl.applied
        loop.ctl.applied = lambda d, **kw: (seen.append(kw), real(d, **kw))
        await loop.tick()
        assert manager.engine is made[1] and len(made) == 4
        assert seen == [{"now": seen[0]["now"], "rebuilt": False}]
        loop.stop()
        await manager.stop()

    asyncio.run(run())


def test_standby_engines_are_validated():
    from quickdraft.server.config import ConfigError

    cfg = load_config(env={}, overrides={"controller.standby_engines": "9"})
    with pytest.raises(ConfigError, match="standby_engines"):
        cfg.validate(check_files=False, check_vllm=False)


def test_observations_are_recorded_for_replay_when_asked(tmp_path):
    from quickdraft.server.controller import Observation

    path = tmp_path / "observations.jsonl"

    async def run():
        cfg, manager, service, loop, _ = make(tmp_path, **{"controller.observations_file": str(path)})
        await manager.start(loop.start_spec())
        seen = []
        real = loop.ctl.observe
        loop.ctl.observe = lambda obs, now=None: (seen.append(obs), real(obs, now=now))
        for _ in range(2):
            async for _ in service.complete(pb.CompleteRequest(prefix="x")):
                pass
        loop.stop()
        await manager.stop()
        return seen

    seen = asyncio.run(run())
    lines = [d for d in map(json.loads, path.read_text().splitlines()) if "observation" in d]
    assert len(seen) == len(lines) == 2
    assert [Observation.from_dict(d["observation"]) for d in lines] == seen
    assert seen[0].config.enabled and seen[0].num_drafts > 0  # the speculative counters survive the round trip


async def eight_running(tmp_path, **overrides):
    """A loop over a fake engine with 8 requests running, measuring in windows of
    at least 0.05 s and 100 tokens per request; (manager, loop, engine, serve),
    where ``serve(tokens, tpot)`` decodes that much over 0.06 s, then lets the
    loop close its window if it may."""
    cfg, manager, service, loop, made = make(tmp_path, **{"controller.measure.window_s": "0.05",
                                                          "controller.measure.min_tokens": "100", **overrides})
    await manager.start(SpecConfig(True, 5))
    loop._task = None
    engine = made[0]
    engine.snapshot.running = 8

    async def serve(tokens: int, tpot: float = 0.002) -> None:
        service.meter.decode_seconds += tokens * tpot
        service.meter.decode_tokens += tokens
        engine.snapshot.running_seconds += 8 * 0.06
        await asyncio.sleep(0.06)
        loop._close_window(engine, time.time())

    return manager, loop, engine, serve


def test_a_window_holds_min_tokens_per_request_and_none_spans_the_drafters_return(tmp_path):
    """With 8 requests in the engine a window waits for 8 x min_tokens; the
    window in which drafting resumes after an off that skipped the drafter
    (the engine's draft_epoch moved) is dropped, the next one counts."""
    async def run():
        manager, loop, engine, serve = await eight_running(tmp_path)
        mp = loop.ctl.measured
        loop._close_window(engine, time.time())  # opens the first window
        await serve(500)
        assert mp.windows == 0, "500 tokens over 8 requests is not a window at 100 per request"
        await serve(500)
        assert mp.windows == 1
        engine.draft_epoch = getattr(engine, "draft_epoch", 0) + 1  # drafting resumed after a skipped off
        await serve(1000)
        assert mp.windows == 1, "the window that holds the drafter's return was counted"
        await serve(1000)
        assert mp.windows == 2
        await manager.stop()

    asyncio.run(run())


def test_windows_are_written_out_also_under_a_pin_which_teaches_the_controller_nothing(tmp_path):
    """controller.observations_file gets every window (with the engine's step
    and prefill counts); under an operator's pin the windows are still written,
    marked pinned, and the controller files none of them."""
    path = tmp_path / "obs.jsonl"

    async def run():
        manager, loop, engine, serve = await eight_running(tmp_path, **{"controller.observations_file": str(path)})
        mp = loop.ctl.measured
        snap = engine.snapshot
        loop.pinned = SpecConfig(True, 5)
        await loop.tick()  # opens the first window under the pin
        loop.service.meter.decode_seconds += 1000 * 0.002
        loop.service.meter.decode_tokens += 1000
        snap.running_seconds += 8 * 0.06
        snap.steps, snap.prefill_tokens = 40, 2000
        await asyncio.sleep(0.06)
        await loop.tick()  # closes it
        assert mp.windows == 0, "a pinned window taught the controller"
        loop.pinned = None
        await serve(1000)  # the next window, unpinned, is filed
        await manager.stop()
        return mp.windows

    assert asyncio.run(run()) == 1
    windows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [w.get("pinned", False) for w in windows] == [True, False]
    first = Window.from_dict(windows[0]["window"])
    assert (first.steps, first.prefill_tokens, first.decode_tokens) == (40, 2000, 1000)
    assert first.config == SpecConfig(True, 5)


def test_a_probe_far_behind_the_best_ends_its_window_early(tmp_path):
    """At 8 requests a window waits for 8 x min_tokens; a probe decoding over
    measure.abandon_above slower than the best measured config ends its window
    once it holds a quarter of that, while a close one runs its length."""
    async def run(probe_tpot: float) -> int:
        manager, loop, engine, serve = await eight_running(tmp_path)
        mp = loop.ctl.measured
        loop._close_window(engine, time.time())
        await serve(800, 0.002)
        assert mp.windows == 1, "parallel K=5 measured at 2 ms"
        assert await manager.switch(SpecConfig(True, 3), "probe")
        loop._window = None
        loop._close_window(engine, time.time())  # the probe's window opens
        await serve(150, probe_tpot)
        assert mp.windows == 1, "under a quarter of the window's tokens: never ended early"
        await serve(100, probe_tpot)
        windows = mp.windows
        await manager.stop()
        return windows

    assert asyncio.run(run(0.003)) == 2, "50% slower than the best: the window ended at 250 of 800 tokens"
    assert asyncio.run(run(0.0022)) == 1, "10% slower: the window runs its length"


def test_a_live_engine_is_measured_in_windows_and_a_probe_is_a_live_switch(tmp_path):
    """The loop hands the controller what was served since the last tick:
    decode time over decode tokens from the serving path, the time-weighted
    running requests from the engine; the controller then probes another K live."""
    async def run():
        # 100 tokens per request in the engine: the window below holds 8 requests and 1,000 tokens.
        cfg, manager, service, loop, made = make(tmp_path, **{"controller.measure.window_s": "0.2",
                                                              "controller.measure.min_tokens": "100"})
        await manager.start(SpecConfig(True, 5))
        loop._task = None
        engine = made[0]
        engine.snapshot.running = 8
        await loop.tick()  # opens the first window
        assert loop.ctl.measuring and loop.ctl.measured.windows == 0
        service.meter.decode_seconds += 8 * 0.25
        service.meter.decode_tokens += 1000
        engine.snapshot.running_seconds += 8 * 0.25
        service.meter.first_tokens.append(("inline", 0.05, time.perf_counter()))
        await asyncio.sleep(0.25)
        await loop.tick()
        state = loop.state_proto()
        await manager.stop()
        return loop, engine, state

    loop, engine, state = asyncio.run(run())
    mp = loop.ctl.measured
    assert mp.windows == 1 and mp.discarded == 0
    assert 2 <= mp.level <= mp.table.level(8), "about 8 running requests over a window of at least 0.25 s"
    (cell,) = mp.table.cells.values()
    assert abs(cell.decode_tpot_s - 2.0 / 1000) < 1e-12 and list(cell.ttft["inline"]) == [0.05]
    assert engine.spec != SpecConfig(True, 5) and engine.spec.parallel, "the probe was not made"
    assert loop._window is None, "a switch must start a new window"
    assert state.measuring and state.measured[0].config == "parallel K=5" and state.live_switches == 1
    assert len(state.live_switch_ms) == 1
