"""The per-batch-size K schedule: noise between neighbouring batch sizes does
not make it zig-zag, and a clear change of the best K still shows."""

from __future__ import annotations

import pytest

from quickdraft.server.config import ControllerSettings, ScheduleSettings
from quickdraft.server.controller.estimator import Estimator
from quickdraft.server.speculative import SpecConfig


def _estimator(tpot_per_k, tolerance: float | None = None) -> Estimator:
    """An estimator whose predicted TPOT (step time / accepted length) per
    batch size b and K is ``tpot_per_k(b, k)``: accepted length 1, so the
    step time is the TPOT."""
    sched = ScheduleSettings(max_batch=16) if tolerance is None else ScheduleSettings(max_batch=16, k_change_tolerance=tolerance)
    est = Estimator(ControllerSettings(candidates=(SpecConfig(False, 1), SpecConfig(False, 3), SpecConfig(False, 5)), schedule=sched))
    est.refit = lambda: None  # nothing observed: the step and acceptance models below stand in
    est.step.predict = lambda mode, k, b, local=True: tpot_per_k(b, k)
    est.expected_length = lambda mode, k, bound="mean": 1.0
    return est


def _noisy(b: float, k: int) -> float:
    # K=3 and K=5 within 3% of each other, the winner alternating with the batch size
    # (as noisy fits do); K=1 clearly best from 12 on
    base = {1: 1.30, 3: 1.00, 5: 1.00}[k] if b < 12 else {1: 0.80, 3: 1.00, 5: 1.00}[k]
    wiggle = 0.03 if (k == 5) == (int(b) % 2 == 0) else 0.0
    return base + wiggle


def test_noise_between_batch_sizes_does_not_make_the_schedule_zig_zag():
    sched = _estimator(_noisy).best_schedule(False)
    assert sched is not None
    # one K (the batch-1 winner, K=5) until K=1 is clearly faster
    assert [k for _, _, k in sched.per_batch_size] == [5, 1], sched.per_batch_size
    assert sched.k_for(11) == 5 and sched.k_for(12) == 1


def test_without_the_tolerance_the_same_predictions_zig_zag():
    sched = _estimator(_noisy, tolerance=0.0).best_schedule(False)
    assert sched is not None and len(sched.per_batch_size) > 3, sched.per_batch_size


def test_tolerance_is_validated():
    with pytest.raises(ValueError, match="k_change_tolerance"):
        ScheduleSettings(k_change_tolerance=0.7).validate()
