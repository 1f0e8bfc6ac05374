"""The server side of the controller: observations from finished requests,
decisions applied as engine switches, profiles saved, state over the RPC.
Fake engines, real Controller."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from quickdraft.server.config import load_config
from quickdraft.server.controller import Decision, KSchedule, SpecConfig
from quickdraft.server.controller_loop import ControllerLoop, config_of, mode_of
from quickdraft.server.engine import SpecMode
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.service import CompletionService
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb
from tests.test_service import FakeEngine


def test_mode_and_config_round_trip(monkeypatch):
    from quickdraft.server import controller_loop

    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: True)  # as on vLLM's CUDA build
    for mode in (SpecMode.off(), SpecMode(True, True, 5), SpecMode(True, False, 3), SpecMode(True, True, 7, ((1, 1, 7), (2, 16, 3))),
                 SpecMode(True, False, 5, ((1, 2, 5), (3, 16, 1)))):
        assert mode_of(*config_of(mode)) == mode
    uniform = KSchedule.uniform(SpecConfig(True, 5), 16)
    assert mode_of(SpecConfig(True, 5), uniform) == SpecMode(True, True, 5)


def make(tmp_path, **overrides):
    cfg = load_config(env={}, overrides={"controller.enabled": "true", "controller.profile_dir": str(tmp_path), **overrides})
    made = []

    async def factory(cfg, mode):
        made.append(FakeEngine(mode))
        return made[-1]

    manager = EngineManager(cfg, engine_factory=factory)
    telemetry = Telemetry("embedded")
    service = CompletionService(cfg, manager, telemetry)
    return cfg, manager, service, ControllerLoop(cfg, manager, service, telemetry), made


def test_finished_requests_become_observations(tmp_path):
    async def run():
        cfg, manager, service, loop, _ = make(tmp_path)
        await manager.start(loop.start_mode())
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
    assert loop.ctl.state()["acceptance"]["parallel"]["trials"][0] > 0


def test_a_switch_decision_rebuilds_the_engine_and_saves_the_profile(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        await manager.start(loop.start_mode())
        loop.start()
        loop._task.cancel()  # drive tick() by hand
        current = SpecConfig(True, 5)
        target = SpecConfig(False, 3)
        decision = Decision("switch", current, target, KSchedule.uniform(target, 16), 0.2, "autoregressive K=3 predicted 20% faster", "better", loop.clock())
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
    assert [e.mode for e in made] == [SpecMode(True, True, 5), SpecMode(True, False, 3)]
    assert manager.stats.rebuilds == 1 and loop.applied_switches == 1
    assert len(applied) == 1
    assert state.enabled and state.engine_rebuilds == 1
    assert state.profile_path.startswith(str(tmp_path))
    assert any(tmp_path.iterdir()), "no profile written"


def test_failed_switch_is_reported_to_the_controller(tmp_path):
    async def run():
        cfg, manager, service, loop, made = make(tmp_path)
        calls = {"n": 0}

        async def flaky(cfg, mode):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("no memory")
            return FakeEngine(mode)

        manager._factory = flaky
        await manager.start(loop.start_mode())
        loop.start()
        loop._task.cancel()
        target = SpecConfig.off()
        decision = Decision("fallback", SpecConfig(True, 5), target, None, -0.1, "acceptance collapsed", "acceptance_collapse", loop.clock())
        loop.ctl.decide = lambda now=None: decision
        failed = []
        loop.ctl.apply_failed = lambda d, err="", **kw: failed.append(err)
        await loop.tick()
        loop.stop()
        await manager.stop()
        return manager, failed, loop

    manager, failed, loop = asyncio.run(run())
    assert failed and loop.failed_switches == 1
    assert manager.engine is None or manager.engine.mode == SpecMode(True, True, 5)


def test_parallel_candidates_respect_the_drafter_limit(tmp_path):
    cfg, manager, service, loop, _ = make(tmp_path)
    ks = {c.k for c in loop.ctl.settings.candidates if c.parallel}
    assert ks and max(ks) <= cfg.preset.max_parallel_k
