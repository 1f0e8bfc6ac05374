"""Drives the adaptive controller (server/controller) from the running server.

Per finished request it turns the service's record into an Observation; every
``controller.decide_every_s`` it samples the engine, asks for a decision, and
applies anything but "hold" by switching the engine (server/engine_manager.py
builds the new engine while the old one serves, so no request is dropped).
The tuned profile is saved after each applied switch and on stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from google.protobuf import json_format

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.controller import (
    DEFAULT_PROFILE_DIR,
    Controller,
    ControllerSettings,
    EngineSnapshot,
    KSchedule,
    Observation,
    ProfileKey,
    ProfileStore,
    ScheduleSettings,
    SLOSettings,
    SpecConfig,
    default_candidates,
    load_into,
    save_from,
    with_fingerprint,
)
from quickdraft.server.engine import SpecMode, hardware_description, vllm_version
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.service import CompletionService
from quickdraft.server.validation import parallel_schedules_supported
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.controller")


def mode_of(config: SpecConfig, schedule: KSchedule | None) -> SpecMode:
    """The engine configuration for a controller config and K schedule."""
    if not config.enabled:
        return SpecMode.off()
    if schedule is None or schedule.is_uniform:
        return SpecMode(enabled=True, parallel=config.parallel, k=schedule.max_k if schedule else config.k)
    if schedule.parallel and not parallel_schedules_supported():
        # e.g. a profile tuned before the CPU build's crash was known: K for one request, no schedule
        k = schedule.k_for(1)
        return SpecMode(enabled=True, parallel=True, k=k) if k > 0 else SpecMode.off()
    return SpecMode(enabled=True, parallel=schedule.parallel, k=schedule.max_k, per_batch_size=tuple(schedule.to_vllm()))


def config_of(mode: SpecMode) -> tuple[SpecConfig, KSchedule | None]:
    if not mode.enabled:
        return SpecConfig.off(), None
    schedule = KSchedule.from_vllm(mode.parallel, mode.per_batch_size) if mode.per_batch_size else None
    return SpecConfig(mode.parallel, mode.k), schedule


def controller_settings(cfg: QuickdraftConfig) -> ControllerSettings:
    max_k = cfg.preset.max_parallel_k or 16
    candidates = tuple(c for c in default_candidates() if not (c.parallel and c.k > max_k))
    return ControllerSettings(
        candidates=candidates,
        initial=config_of(SpecMode.from_config(cfg))[0],
        slo=SLOSettings(ttft_s=dict(cfg.controller.ttft_slo_s)),
        schedule=ScheduleSettings(max_batch=cfg.engine.max_num_seqs, parallel=parallel_schedules_supported()),
    )


def profile_key(cfg: QuickdraftConfig) -> ProfileKey:
    """What a tuned profile is valid for: this hardware, model, drafters and vLLM."""
    drafters = [cfg.drafter_path(True), cfg.drafter_path(False)]
    return ProfileKey(
        hardware=hardware_description(),
        model=with_fingerprint(cfg.target_path()),
        drafter=" | ".join("None" if d is None else with_fingerprint(d) for d in drafters),
        vllm_version=vllm_version(),
    )


def profile_store(cfg: QuickdraftConfig) -> ProfileStore:
    return ProfileStore(Path(cfg.controller.profile_dir).expanduser() if cfg.controller.profile_dir else DEFAULT_PROFILE_DIR)


class ControllerLoop:
    def __init__(self, cfg: QuickdraftConfig, engines: EngineManager, service: CompletionService, telemetry: Telemetry, clock=time.time):
        self.cfg = cfg
        self.engines = engines
        self.service = service
        self.telemetry = telemetry
        self.clock = clock
        self.ctl = Controller(controller_settings(cfg))
        self.key = profile_key(cfg)
        self.store = profile_store(cfg)
        self.loaded_profile = load_into(self.ctl, self.store, self.key)
        self._task: asyncio.Task | None = None
        self._prewarm_task: asyncio.Task | None = None
        self.applied_switches = 0
        self.skipped_during_builds = 0
        self.skipped_while_shared = 0
        path = cfg.controller.observations_file
        self._observations_out = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - open for the server's life
        self.failed_switches = 0
        service.observers.callbacks.append(self.on_request)

    def start_mode(self) -> SpecMode:
        """The engine to start with: the profile's last good config, else the configured one."""
        config, schedule = self.ctl.start_config()
        return mode_of(config, schedule)

    def start(self) -> None:
        engine = self.engines.engine
        if engine is not None:
            self.ctl.activate(*config_of(engine.mode), now=self.clock())
        self._task = asyncio.create_task(self._run(), name="controller")
        if self.engines.standby_capacity > 0:
            self._prewarm_task = asyncio.create_task(self.prewarm(), name="controller-prewarm")

    def full_batch_mode(self) -> SpecMode:
        """The engine the model picks for a full batch (engine.max_num_seqs)."""
        config, schedule, _ = self.ctl.recommend(float(self.cfg.engine.max_num_seqs))
        return mode_of(config, schedule)

    async def prewarm(self) -> bool:
        """With standby engines: build the full-batch pick's engine now when it
        differs from the serving one, so the first move to high load is a
        switch, not a rebuild."""
        engine = self.engines.engine
        if engine is None or not self.ctl.estimator.ready:
            return False  # no profile: nothing to predict from yet
        mode = self.full_batch_mode()
        if mode == engine.mode:
            return False
        log.info("building a standby engine for a full batch: %s", mode.label())
        t0 = time.monotonic()
        built = await self.engines.prewarm(mode)
        if built:
            self.ctl.observe_build(time.monotonic() - t0)  # built beside the serving engine, as a rebuild is
        return built

    def stop(self) -> None:
        for task in (self._task, self._prewarm_task):
            if task is not None:
                task.cancel()
        self.save()
        if self._observations_out is not None:
            self._observations_out.close()
            self._observations_out = None

    def save(self) -> None:
        try:
            save_from(self.ctl, self.store, self.key)
        except OSError as e:
            log.warning("could not save the controller profile: %s", e)

    # --- inputs ------------------------------------------------------------------

    def on_request(self, record: RequestRecord, spec: pb.SpeculativeStats) -> None:
        # Cancelled and failed requests say nothing reliable about step time.
        if record.finish not in ("stop", "length") or record.ttft_s is None or record.tpot_s is None:
            return
        engine = self.engines.engine
        running = engine.snapshot.running if engine is not None else 1
        if self.engines.building:
            # Served while another engine was being built beside this one: its
            # TTFT and TPOT measure the build's competition, not the config,
            # which is what a rebuild costs the requests served meanwhile.
            self.skipped_during_builds += 1
            self.ctl.observe_during_build(record.tpot_s, max(1, running))
            return
        if self.engines.contended_since(time.monotonic() - record.duration_s):
            # Ran while another engine shared the machine: the one switched
            # away from still finishing its streams, or a build that ended
            # mid-request. On a 2-core CPU the first figures of a new engine,
            # taken while the old one drained, once read 50.8 ms for a config
            # that serves at 25 ms, and the controller switched back.
            self.skipped_while_shared += 1
            return
        obs = Observation.from_speculative_stats(
            spec,
            latency_class=record.latency_class,
            ttft_s=record.ttft_s,
            tpot_s=record.tpot_s,
            output_tokens=record.completion_tokens,
            batch_size=max(1, running),
            prompt_tokens=record.prompt_tokens,
            ttft_batch_size=record.running_at_first_token or None,  # 0: not known
        )
        now = self.clock()
        self.ctl.observe(obs, now=now)
        if self._observations_out is not None:
            self._observations_out.write(json.dumps({"t": round(now, 3), "observation": obs.to_dict()}) + "\n")
            self._observations_out.flush()

    # --- the loop ----------------------------------------------------------------

    async def _run(self) -> None:
        period = self.cfg.controller.decide_every_s
        while True:
            await asyncio.sleep(period)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the controller must never take the server down
                log.exception("controller tick failed")

    async def tick(self) -> None:
        engine = self.engines.engine
        if engine is None or not self.engines.serving:
            return
        snap = engine.snapshot
        now = self.clock()
        self.ctl.observe_engine(EngineSnapshot(running=snap.running, waiting=snap.waiting, kv_cache_usage=min(1.0, max(0.0, snap.kv_cache_usage))), now=now)
        self.ctl.set_warm(config_of(mode) for mode in self.engines.standby)
        decision = self.ctl.decide(now=now)
        if decision.action == "hold":
            return
        log.info("controller %s: %s -> %s: %s", decision.action, decision.current.label(), decision.target.label(), decision.reason)
        if decision.action == "fallback":
            self.telemetry.speculation_off.add(1, {"reason": decision.reason_code})
        mode = mode_of(decision.target, decision.schedule)
        if not self.cfg.controller.allow_rebuild and decision.action != "fallback":
            self.ctl.apply_failed(decision, "engine rebuilds are disabled (controller.allow_rebuild = false)", now=self.clock())
            return
        instant_before = self.engines.stats.instant_switches
        ok = await self.engines.switch(mode, f"controller {decision.action}: {decision.reason}")
        if ok:
            self.applied_switches += 1
            rebuilt = self.engines.stats.instant_switches == instant_before
            if rebuilt:
                self.telemetry.engine_rebuilds.add(1, {"reason": decision.reason_code})
            self.ctl.applied(decision, now=self.clock(), rebuilt=rebuilt)
            self.save()
        else:
            self.failed_switches += 1
            self.ctl.apply_failed(decision, "the new engine failed to start", now=self.clock())

    # --- outputs -----------------------------------------------------------------

    def state_proto(self) -> pb.ControllerState:
        state = self.ctl.state()
        msg = json_format.ParseDict(state, pb.ControllerState(), ignore_unknown_fields=True)
        msg.enabled = True
        msg.engine_rebuilds = self.engines.stats.rebuilds
        msg.profile_path = str(self.store.path_for(self.key))
        return msg
