"""Per-position acceptance: Beta posteriors, E[L](K), extrapolation, shifts."""

from __future__ import annotations

import pytest

from quickdraft.bench.controller_sim import SimAcceptance, SimCost, SimulatedEngine, conditional_from_marginal
from quickdraft.server.config import AcceptanceSettings
from quickdraft.server.controller import Observation
from quickdraft.server.controller.acceptance import AcceptanceModel
from quickdraft.server.speculative import SpecConfig


def _feed(model, engine, config, n, batch=1):
    for obs in engine.requests(config, batch, n):
        model.observe(obs)


def test_posteriors_recover_per_position_rates_for_each_mode():
    truth = SimAcceptance()  # anchors.md: AR ~72/50/33/21/14 %, parallel ~64/40/25/15/10 %
    eng = SimulatedEngine(SimCost(noise=0.0), truth, seed=3)
    m = AcceptanceModel(AcceptanceSettings())
    _feed(m, eng, SpecConfig(False, 5), 300)
    _feed(m, eng, SpecConfig(True, 5), 300)
    for mode, parallel in (("autoregressive", False), ("parallel", True)):
        rates = truth.rates(mode)
        pos = m.positions(mode)
        for i in range(5):
            # within the 90% band, widened a little for 5 positions x 2 modes
            assert pos[i].low - 0.02 <= rates[i] <= pos[i].high + 0.02, (mode, i, pos[i], rates[i])
        assert m.expected_length(mode, 5) == pytest.approx(truth.expected_length(mode, 5), rel=0.03)
    # parallel drafts accept less per position than autoregressive ones
    assert m.marginal("parallel", 5)[0] < m.marginal("autoregressive", 5)[0]
    assert m.expected_length("parallel", 5) < m.expected_length("autoregressive", 5)


def test_expected_length_formula():
    m = AcceptanceModel(AcceptanceSettings(prior_strength=1e-6))
    # 1000 steps at K=3: position 1 accepted 800 times, 2: 400, 3: 100
    m.observe(Observation("inline", 0.1, 0.01, 100, 1, SpecConfig(False, 3), num_drafts=1000,
                          num_draft_tokens=3000, accepted_per_position=[800, 400, 100]))
    a = [p.mean for p in m.positions("autoregressive")[:3]]
    assert a == pytest.approx([0.8, 0.5, 0.25], abs=1e-4)
    assert m.expected_length("autoregressive", 3) == pytest.approx(1 + 0.8 + 0.4 + 0.1, abs=1e-3)
    assert m.expected_length("autoregressive", 0) == 1.0


def test_histogram_input_equals_per_position_counts():
    a, b = AcceptanceModel(AcceptanceSettings()), AcceptanceModel(AcceptanceSettings())
    # steps accepting exactly 0,1,2,3 drafts
    hist = [200, 400, 300, 100]
    a.observe(Observation("inline", 0.1, 0.01, 100, 1, SpecConfig(True, 3), num_drafts=1000,
                          num_draft_tokens=3000, accepted_histogram=hist))
    b.observe(Observation("inline", 0.1, 0.01, 100, 1, SpecConfig(True, 3), num_drafts=1000,
                          num_draft_tokens=3000, accepted_per_position=[800, 400, 100]))
    assert [p.mean for p in a.positions("parallel")] == pytest.approx([p.mean for p in b.positions("parallel")])


def test_unmeasured_k_is_extrapolated_conservatively():
    # true conditional acceptance is flat at 0.7: E[L](7) is well above E[L](3)
    flat = SimAcceptance((0.7,) * 8, (0.7,) * 8)
    eng = SimulatedEngine(SimCost(noise=0.0), flat, seed=5)
    m = AcceptanceModel(AcceptanceSettings())
    _feed(m, eng, SpecConfig(False, 3), 400)
    est7, true7 = m.expected_length("autoregressive", 7), flat.expected_length("autoregressive", 7)
    assert m.expected_length("autoregressive", 3) < est7 < true7  # more than K=3, less than the truth
    assert est7 > 0.85 * true7  # but not absurdly pessimistic
    # positions never drafted carry no trials and a wider band than measured ones
    pos = m.positions("autoregressive")
    assert pos[4].trials == 0 and pos[0].trials > 0
    assert pos[4].high - pos[4].low > 3 * (pos[0].high - pos[0].low)


def test_one_mode_informs_the_other_through_the_prior():
    eng = SimulatedEngine(SimCost(noise=0.0), SimAcceptance((0.9,) * 8, (0.9,) * 8), seed=1)
    m = AcceptanceModel(AcceptanceSettings())
    before = m.expected_length("parallel", 3)
    _feed(m, eng, SpecConfig(False, 3), 100)  # only autoregressive data
    after = m.expected_length("parallel", 3)
    assert after > before  # the excellent AR drafter raises the parallel prior ...
    assert after < m.expected_length("autoregressive", 3)  # ... but parallel stays a little lower


def test_variable_k_with_draft_counts_per_position():
    # a schedule drafted K=3 in half the steps and K=1 in the rest; conditional rates 0.8
    m = AcceptanceModel(AcceptanceSettings(prior_strength=1e-6))
    # 1000 steps; position 1 drafted 1000x, accepted 800; position 2 drafted by the 500 K=3 steps
    # reaching it: 400 of them; accepted 320; position 3: 256 reach, accepted 205
    m.observe(Observation("inline", 0.1, 0.01, 100, 4, SpecConfig(False, 3), num_drafts=1000,
                          num_draft_tokens=2000, accepted_per_position=[800, 320, 256],
                          draft_tokens_per_position=[1000, 500, 500]))
    a = [p.mean for p in m.positions("autoregressive")[:3]]
    assert a == pytest.approx([0.8, 0.8, 0.8], abs=0.01)


def test_shift_is_detected_and_old_evidence_forgotten():
    good = SimAcceptance()
    bad = good.scaled(0.5)
    models = []
    for forget in (True, False):
        eng = SimulatedEngine(SimCost(noise=0.0), good, seed=2)
        m = AcceptanceModel(AcceptanceSettings())
        _feed(m, eng, SpecConfig(True, 5), 200)
        assert m.detect_shift("parallel") is None  # steady data: no false alarm
        eng.acceptance = bad
        shift = None
        for i in range(60):
            _feed(m, eng, SpecConfig(True, 5), 1)
            shift = m.detect_shift("parallel")
            if shift:
                break
        assert shift is not None and i < 30, i
        assert shift.recent_rate < shift.long_rate - AcceptanceSettings().shift_threshold
        if forget:
            m.forget(0.1)
        _feed(m, eng, SpecConfig(True, 5), 40)
        models.append(m)
    g, b = good.expected_length("parallel", 5), bad.expected_length("parallel", 5)
    with_forget, without = (m.expected_length("parallel", 5) for m in models)
    assert abs(with_forget - b) < 0.25 * (g - b)  # most of the way to the new acceptance
    assert abs(without - b) > 1.5 * abs(with_forget - b)  # and forgetting is what got it there


def test_invalid_settings_name_the_field():
    with pytest.raises(ValueError, match="acceptance.shift_keep"):
        AcceptanceSettings(shift_keep=0.0).validate()


def test_conditional_from_marginal():
    assert conditional_from_marginal([0.8, 0.4, 0.1]) == pytest.approx((0.8, 0.5, 0.25))
