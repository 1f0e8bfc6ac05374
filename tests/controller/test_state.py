"""state() and its GetControllerState message, the decision history, and the cheap observe() path."""

from __future__ import annotations

import pytest

from quickdraft.bench.controller_sim import (
    CROSSING_ACCEPTANCE,
    CROSSING_COST,
    FakeClock,
    Harness,
    Phase,
    SimulatedEngine,
    calibrated,
)
from quickdraft.server.config import ControllerSettings
from quickdraft.server.controller import Controller, EngineSnapshot, Observation
from quickdraft.server.controller.decision import Decision, DecisionLog
from quickdraft.server.controller_proto import state_message
from quickdraft.server.speculative import SpecConfig
from quickdraft.v1 import completion_pb2 as pb


@pytest.fixture(scope="module")
def run():
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=0)
    ctl, clock = calibrated(eng)
    Harness(ctl, eng, clock, decide_every=2).run([Phase(1, 20), Phase(8, 20)])
    return ctl


def test_state_fits_the_proto_message(run):
    msg = state_message(run.state())
    assert msg.enabled
    assert msg.active.parallel_drafting and msg.active.num_speculative_tokens == 7
    assert msg.active.per_batch_size[0].min_batch_size == 1
    assert len(msg.candidates) == 9 and msg.candidates[0].config == "off"
    p7 = next(c for c in msg.candidates if c.config == "parallel K=7")
    assert p7.samples > 0 and p7.expected_acceptance_length > 2.5 and p7.predicted_tpot_ms > 0
    assert p7.predicted_ttft_ms > 0
    assert len(msg.acceptance_per_position) == 7
    assert list(msg.acceptance_per_position) == sorted(msg.acceptance_per_position, reverse=True)
    assert msg.decisions and msg.decisions[-1].reason
    assert msg.running_requests == pytest.approx(8, rel=0.1)


def test_state_detail(run):
    s = run.state()
    acc = s.acceptance["parallel"]
    assert acc.conditional_low[0] <= acc.conditional[0] <= acc.conditional_high[0]
    assert acc.trials[0] > 1000
    assert set(s.step_model.as_dict()) >= {"c0", "c1", "a0", "a1", "p0", "p1"}
    assert s.ttft_model.kappa >= 0
    assert s.load.current == pytest.approx(8, rel=0.1)
    assert (s.fallback.k_cap, s.fallback.speculation_blocked_for_s, s.fallback.reason) == (None, 0.0, "")
    assert s.pending is None and s.last_good.parallel and s.last_good == s.engine
    assert s.config == s.engine.at(8) and s.config.k <= 3
    assert any(e.kind == "load_change" for e in s.events)


def test_state_before_any_data():
    s = Controller(clock=FakeClock()).state()
    assert s.engine == SpecConfig.off() and s.step_model is None and s.predictions == ()
    msg = state_message(s)
    assert msg.active.method == "" and [c.samples for c in msg.candidates] == [0] * 9
    assert len(msg.acceptance_per_position) == 7  # the autoregressive prior, while speculation is off


def _hold(code, t):
    return Decision("hold", SpecConfig.off(), SpecConfig.off(), SpecConfig.off(), 0.0, code, code, t)


def test_history_is_bounded_and_keeps_the_interesting_entries():
    log = DecisionLog(5)
    for t in range(100):
        log.add(_hold("best", t))
        log.add(_hold("within_margin", t))  # same family as "best": not kept
    assert len(log) == 1
    log.add(_hold("sustaining", 100))
    log.add(Decision("switch", SpecConfig.off(), SpecConfig(True, 3), SpecConfig(True, 3), 0.2, "x", "better", 101))
    log.add(_hold("pending", 102))
    assert [d.reason_code for d in log] == ["best", "sustaining", "better", "pending"]
    for t in range(10):
        log.add(Decision("switch", SpecConfig.off(), SpecConfig(True, 3), SpecConfig(True, 3), 0.2, "x", "better", 200 + t))
    assert len(log) == 5


def test_history_size_setting_applies():
    ctl = Controller(ControllerSettings(history_size=3), clock=FakeClock())
    assert ctl.decisions.size == 3


def test_decide_without_data_holds():
    clock = FakeClock()
    ctl = Controller(clock=clock)
    d = ctl.decide()
    assert d.action == "hold" and d.reason_code == "no_data" and d.timestamp == clock.t


def test_observe_is_cheap_and_refits_lazily(monkeypatch):
    from quickdraft.server.controller import step_model, ttft_model

    fits = {"step": 0, "ttft": 0}
    orig_step, orig_ttft = step_model.StepTimeModel.fit, ttft_model.TTFTModel.fit

    def count_step(self):
        fits["step"] += 1 if self._dirty else 0
        return orig_step(self)

    def count_ttft(self, step):
        fits["ttft"] += 1 if self._dirty else 0
        return orig_ttft(self, step)

    monkeypatch.setattr(step_model.StepTimeModel, "fit", count_step)
    monkeypatch.setattr(ttft_model.TTFTModel, "fit", count_ttft)
    clock = FakeClock()
    ctl = Controller(clock=clock)
    eng = SimulatedEngine(CROSSING_COST, CROSSING_ACCEPTANCE, seed=3)
    for o in eng.requests(SpecConfig.off(), 1, 300):
        ctl.observe(o)
    assert fits == {"step": 0, "ttft": 0}
    ctl.observe_engine(EngineSnapshot(running=1))
    ctl.decide()
    assert fits["step"] == 1 and fits["ttft"] == 1


def test_observation_validation_says_what_is_wrong():
    with pytest.raises(ValueError, match="seconds, not milliseconds"):
        Observation("inline", -5.0, 0.01, 10, 1, SpecConfig.off())
    with pytest.raises(ValueError, match="latency_class"):
        Observation("urgent", 0.1, 0.01, 10, 1, SpecConfig.off())
    with pytest.raises(ValueError, match="divide a percentage by 100"):
        EngineSnapshot(running=1, kv_cache_usage=93.0)


def test_settings_from_dict_names_valid_keys():
    s = ControllerSettings.from_dict({"candidates": ["off", "parallel K=5"], "hysteresis": {"margin": 0.1},
                                      "slo": {"ttft_s": {"inline": 0.25}}})
    assert s.candidates == (SpecConfig.off(), SpecConfig(True, 5)) and s.hysteresis.margin == 0.1
    with pytest.raises(ValueError, match="valid:.*'margin'"):
        ControllerSettings.from_dict({"hysteresis": {"margni": 0.1}})
    with pytest.raises(ValueError, match="kv_low < kv_high"):
        ControllerSettings.from_dict({"fallback": {"kv_low": 0.95}})
    assert ControllerSettings.from_dict(s.to_dict()) == s


def test_observation_from_the_proto_stats():
    stats = pb.SpeculativeStats(enabled=True, parallel_drafting=True, num_speculative_tokens=5, num_drafts=20,
                                num_draft_tokens=100, num_accepted_tokens=30,
                                accepted_per_position=[14, 9, 5, 2, 0])
    o = Observation.from_speculative_stats(stats, latency_class="inline", ttft_s=0.05, tpot_s=0.004,
                                           output_tokens=51, batch_size=2.0)
    assert o.config == SpecConfig(True, 5) and o.drafts == 20 and o.num_accepted_tokens == 30
    assert o.acceptance_length == pytest.approx(2.5) and o.step_time_s == pytest.approx(0.01)
    off = Observation.from_speculative_stats(pb.SpeculativeStats(), latency_class="chat", ttft_s=0.05,
                                             tpot_s=0.01, output_tokens=10, batch_size=1.0)
    assert off.config == SpecConfig.off() and off.acceptance_length == 1.0


def test_ttft_counts_at_the_load_of_the_first_token():
    """At a change from 1 stream to 8 a request can end at its first token with
    a batch of 1 reported, behind a TTFT that waited for seven prefills. Filed
    under its first token's load it leaves the 1-stream TTFT quantile alone."""
    from quickdraft.server.config.controller import SLOSettings
    from quickdraft.server.controller.ttft_model import TTFTModel

    def model(transition_batch):
        m = TTFTModel(SLOSettings())
        p7 = SpecConfig(True, 7)
        for i in range(40):
            m.observe(Observation(latency_class="inline", ttft_s=0.10 + 0.001 * (i % 5), tpot_s=0.008, output_tokens=20,
                                  batch_size=1.0, config=p7))
        for _ in range(6):  # the transition: reported batch 1, TTFT of a full batch
            m.observe(Observation(latency_class="inline", ttft_s=0.5, tpot_s=0.008, output_tokens=1, batch_size=1.0,
                                  config=p7, ttft_batch_size=transition_batch))
        return m.predict("inline", 0.02, 1.0, lambda mode, k, b: 0.02, "parallel", 7)

    at_finish, at_first_token = model(None), model(8.0)
    assert at_first_token == pytest.approx(0.104, abs=0.01)
    assert at_finish > 0.3  # the old filing: the SLO (0.3 s) looked broken at 1 stream
    o = Observation.from_speculative_stats(pb.SpeculativeStats(), latency_class="inline", ttft_s=0.1, tpot_s=0.01,
                                           output_tokens=2, batch_size=1.0, ttft_batch_size=8.0)
    assert o.ttft_batch_size == 8.0
