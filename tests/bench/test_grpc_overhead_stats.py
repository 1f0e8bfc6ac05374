"""The server-cost benchmark's TPOT statistic: paired by round, not a ratio of medians."""

import pytest

from quickdraft.bench.grpc_overhead import paired_ratio


def test_paired_ratio_sees_a_constant_overhead_through_prompt_spread():
    # prompts whose TPOT spreads 2x; the second path is 2% slower on every one
    base = [0.0015, 0.0030, 0.0018, 0.0027, 0.0021]
    slower = [b * 1.02 for b in base]
    assert paired_ratio(slower, base) == pytest.approx(1.02)
    assert paired_ratio(base, base) == pytest.approx(1.0)


def test_rounds_missing_either_side_are_skipped_and_lengths_must_match():
    assert paired_ratio([None, 0.002, 0.004], [0.001, None, 0.002]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no round"):
        paired_ratio([None], [0.001])
    with pytest.raises(ValueError):
        paired_ratio([0.001, 0.002], [0.001])
