"""Drives the adaptive controller (server/controller) from the running server.

Per finished request it turns the service's record into an Observation; every
``controller.decide_every_s`` (``controller.measure.window_s`` while the
controller measures: every candidate a live switch away) it samples the
engine, hands the controller the window served since the last tick, asks
for a decision, and applies anything but "hold" by switching the engine:
live, between two engine steps, where the serving engine can run the new
setting (server/vllm_live.py), else by building another engine while the
old one serves (server/engine_manager.py), so no request is dropped.
The tuned profile is saved after each applied switch and on stop.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import time
from pathlib import Path

from quickdraft.server.config import ControllerPolicy, ControllerSettings, QuickdraftConfig
from quickdraft.server.controller import (
    DEFAULT_PROFILE_DIR,
    Controller,
    EngineSnapshot,
    Observation,
    ProfileKey,
    ProfileStore,
    load_into,
    save_from,
    with_fingerprint,
)
from quickdraft.server.controller.measured import Window
from quickdraft.server.controller_proto import state_message
from quickdraft.server.engine import hardware_description, vllm_version
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.service import CompletionService
from quickdraft.server.speculative import MAX_K, SpecConfig, default_candidates
from quickdraft.server.vllm_build import parallel_schedules_supported
from quickdraft.server.telemetry import RequestRecord, Telemetry
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.controller")


def runnable(spec: SpecConfig, live_switching: bool) -> SpecConfig:
    """``spec`` as this vLLM build can run it: a parallel-drafting schedule
    crashes the CPU build unless live switching sets the drafter's slots per
    step, so there it becomes the K for one request (e.g. from a profile
    tuned without live switching)."""
    if spec.parallel and spec.per_batch_size and not live_switching and not parallel_schedules_supported():
        return spec.at(1)
    return spec


def controller_settings(cfg: QuickdraftConfig) -> ControllerSettings:
    """What the controller receives: the [controller] policy sections as set,
    plus what only the server knows (docs/configuration.md, "Derived at
    start"): the candidates (no parallel K above the preset's trained slots),
    the initial config ([speculation]), schedule.max_batch
    (engine.max_num_seqs), and schedule.parallel turned off where this vLLM
    build crashes on parallel-drafting schedules and live switching is off."""
    policy = copy.deepcopy(cfg.controller)  # the controller must not share objects with the user's config
    policy.schedule.max_batch = cfg.engine.max_num_seqs
    policy.schedule.parallel = policy.schedule.parallel and (cfg.speculation.live_switching or parallel_schedules_supported())
    max_k = cfg.preset.max_parallel_k or MAX_K
    return ControllerSettings(
        candidates=tuple(c for c in default_candidates() if not (c.parallel and c.k > max_k)),
        initial=cfg.spec_config(),
        **{f.name: getattr(policy, f.name) for f in dataclasses.fields(ControllerPolicy)},
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
        self.skipped_across_switches = 0
        path = cfg.controller.observations_file
        self._observations_out = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - open for the server's life
        self.failed_switches = 0
        self.pinned: SpecConfig | None = None
        """An operator's pin (server/pinning.py): no decisions, no learning, while set."""
        self.skipped_while_pinned = 0
        self._window: _WindowStart | None = None
        self._draft_epoch = 0
        service.observers.callbacks.append(self.on_request)

    def start_spec(self) -> SpecConfig:
        """The setting to start with: the profile's last good one, else the configured one."""
        return runnable(self.ctl.start_config(), self.cfg.speculation.live_switching)

    def start(self) -> None:
        engine = self.engines.engine
        if engine is not None:
            self.ctl.activate(engine.spec, now=self.clock())
        self._task = asyncio.create_task(self._run(), name="controller")
        if self.engines.standby_capacity > 0:
            self._prewarm_task = asyncio.create_task(self.prewarm(), name="controller-prewarm")

    def full_batch_spec(self) -> SpecConfig:
        """The setting the model picks for a full batch (engine.max_num_seqs)."""
        return runnable(self.ctl.recommend(float(self.cfg.engine.max_num_seqs)).engine, self.cfg.speculation.live_switching)

    async def prewarm(self) -> bool:
        """With standby engines: build the full-batch pick's engine now when
        the serving engine cannot switch to it live, so the first move to high
        load is instant, not a rebuild."""
        engine = self.engines.engine
        if engine is None or not self.ctl.estimator.ready:
            return False  # no profile: nothing to predict from yet
        spec = self.full_batch_spec()
        if self.engines.instant(spec):
            return False
        log.info("building a standby engine for a full batch: %s", spec.label())
        t0 = time.monotonic()
        built = await self.engines.prewarm(spec)
        if built:
            self.ctl.observe_build(time.monotonic() - t0)  # built beside the serving engine, as a rebuild is
        return built

    def pin(self, spec: SpecConfig | None) -> None:
        """Hold ``spec`` (an operator's choice) until called with None; then
        carry on from what the engine runs."""
        self.pinned = spec
        if spec is None:
            engine = self.engines.engine
            if engine is not None:
                self.ctl.activate(engine.spec, now=self.clock())

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
        if self.pinned is not None:
            # Served in a config the controller did not choose; what it measures
            # would become the controller's evidence for a choice it never made.
            self.skipped_while_pinned += 1
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
        if spec.live_switches:
            # Ran partly in another setting: its TPOT and acceptance mix two configs.
            self.skipped_across_switches += 1
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
        while True:
            await asyncio.sleep(self.cfg.controller.measure.window_s if self.ctl.measuring else self.cfg.controller.decide_every_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the controller must never take the server down
                log.exception("controller tick failed")

    async def tick(self) -> None:
        engine = self.engines.engine
        if engine is None or not self.engines.serving:
            self._window = None
            return
        self.ctl.set_warm(self.engines.standby, live=self.engines.live_can_serve)
        if self.pinned is not None:
            # The controller learns nothing from a pin; its windows are still
            # written out, as what one config measures window after window.
            if self._observations_out is not None and self.ctl.measuring:
                self._close_window(engine, self.clock(), learn=False)
            else:
                self._window = None
            return
        snap = engine.snapshot
        now = self.clock()
        self.ctl.observe_engine(EngineSnapshot(running=snap.running, waiting=snap.waiting, kv_cache_usage=min(1.0, max(0.0, snap.kv_cache_usage))), now=now)
        if self.ctl.measuring:
            self._close_window(engine, now)
        else:
            self._window = None
        decision = self.ctl.decide(now=now)
        if decision.action == "hold":
            return
        log.info("controller %s: %s -> %s: %s", decision.action, decision.current.label(), decision.target.label(), decision.reason)
        if decision.action == "fallback":
            self.telemetry.speculation_off.add(1, {"reason": decision.reason_code})
        spec = runnable(decision.engine, self.cfg.speculation.live_switching)
        instant = self.engines.instant(spec)
        if not instant and not self.cfg.controller.allow_rebuild and decision.action != "fallback":
            self.ctl.apply_failed(decision, "engine rebuilds are disabled (controller.allow_rebuild = false)", now=self.clock())
            return
        ok = await self.engines.switch(spec, f"controller {decision.action}: {decision.reason}")
        self._window = None  # the next window starts in the new setting
        if ok:
            self.applied_switches += 1
            if not instant:
                self.telemetry.engine_rebuilds.add(1, {"reason": decision.reason_code})
            self.ctl.applied(decision, now=self.clock(), rebuilt=not instant)
            if not instant:
                self.save()  # a live switch changes nothing a restart would need sooner than stop()
        else:
            self.failed_switches += 1
            self.ctl.apply_failed(decision, "the switch failed (see the log)", now=self.clock())

    def _close_window(self, engine, now: float, learn: bool = True) -> None:
        """Hand the controller what was served since the last window, once the
        window is long enough and decoded enough tokens, or at ten windows'
        time whatever it decoded (short completions on a slow machine); one
        that ran into another engine or setting, or decoded nothing, is dropped.
        ``learn`` False (a pin): the window is only written out."""
        meter, snap, m = self.service.meter, engine.snapshot, self.cfg.controller.measure
        start = self._window
        self._window = _WindowStart(engine, engine.spec, time.monotonic(), time.perf_counter(), snap.running_seconds,
                                    snap.running, meter.decode_seconds, meter.decode_tokens, snap.drafts,
                                    tuple(snap.accepted_per_position), snap.in_system_seconds, snap.running + snap.waiting,
                                    snap.steps, snap.prefill_tokens)
        if start is None or start.engine is not engine or start.spec != engine.spec or self.engines.building:
            return
        epoch = getattr(engine, "draft_epoch", 0)
        if epoch != self._draft_epoch:
            # Drafting resumed after an off that skipped the drafter: the requests then in flight
            # draft from holes in the drafter's KV, so this window's acceptance and step time are
            # not the config's. Drop it; the next one starts with them mostly gone.
            self._draft_epoch = epoch
            return
        seconds = self._window.monotonic - start.monotonic
        tokens = meter.decode_tokens - start.decode_tokens
        if seconds < m.window_s or tokens < m.min_tokens * max(1, start.in_system):
            if seconds < 10 * m.window_s and not (learn and self._abandon(engine, start, seconds, tokens, now)):
                self._window = start  # keep it open
                return
            if tokens <= 0:
                return
        running = (snap.running_seconds - start.running_seconds) / seconds
        offered = (snap.in_system_seconds - start.in_system_seconds) / seconds
        first = tuple((cls, ttft) for cls, ttft, at in list(meter.first_tokens) if at >= start.perf)
        accepted = tuple(a - (start.accepted[i] if i < len(start.accepted) else 0)
                         for i, a in enumerate(snap.accepted_per_position))
        window = Window(
            engine.spec.at(max(1.0, running)), seconds, meter.decode_seconds - start.decode_seconds, tokens, running,
            start.running, snap.running, first, drafts=snap.drafts - start.drafts, accepted_per_position=accepted,
            offered=offered, offered_start=start.in_system, offered_end=snap.running + snap.waiting,
            steps=snap.steps - start.steps, prefill_tokens=snap.prefill_tokens - start.prefill_tokens)
        if learn:
            self.ctl.observe_window(window, now=now)
        if self._observations_out is not None:
            record = {"t": round(now, 3), "window": window.to_dict()}
            if not learn:
                record["pinned"] = True
            self._observations_out.write(json.dumps(record) + "\n")
            self._observations_out.flush()

    def _abandon(self, engine, start: "_WindowStart", seconds: float, tokens: int, now: float) -> bool:
        """Whether a probe's open window ends early: a quarter of its tokens in,
        it decodes far slower than the best measured config (measure.abandon_above)."""
        m = self.cfg.controller.measure
        if seconds < m.window_s or 4 * tokens < m.min_tokens * max(1, start.in_system):
            return False
        running = (engine.snapshot.running_seconds - start.running_seconds) / seconds
        ceiling = self.ctl.measured.abandon_above(start.spec.at(max(1.0, running)), now)
        return ceiling is not None and (self.service.meter.decode_seconds - start.decode_seconds) / tokens > ceiling

    # --- outputs -----------------------------------------------------------------

    def state_proto(self) -> pb.ControllerState:
        msg = state_message(self.ctl.state(decisions=self.ctl.settings.history_size))
        msg.enabled = True
        msg.engine_rebuilds = self.engines.stats.rebuilds
        msg.live_switches = self.engines.stats.live_switches
        msg.live_switch_ms.extend(self.engines.stats.live_switch_ms)
        msg.profile_path = str(self.store.path_for(self.key))
        msg.pinned = self.pinned.label() if self.pinned is not None else ""
        return msg


@dataclasses.dataclass(frozen=True)
class _WindowStart:
    """Where the current measurement window began."""

    engine: object
    spec: SpecConfig
    monotonic: float
    perf: float
    running_seconds: float
    running: int
    decode_seconds: float
    decode_tokens: int
    drafts: int
    accepted: tuple[int, ...]
    in_system_seconds: float
    in_system: int
    steps: int
    prefill_tokens: int
