"""vLLM's served per-step acceptance equals training/reference.py's, for the
shipped drafters, step by step: the reference decoder (and through it the
training side's served measure, tests/test_served_measure.py) is what vLLM does.

tests/integration/test_speculation.py compares the two through the server with a
tolerance of one per position and request; this compares every verify step,
with prefix caching on and the prompts sent twice (the second time a cache
hit, where vLLM drops the trailing cached block and recomputes it)."""

from __future__ import annotations

import pytest

from training import served_acceptance as sa

pytestmark = pytest.mark.engine

TARGET = sa.EMBEDDED / "target"
N, MAX_TOKENS = 8, 48


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    # Plain continuations (as bench/gate.py sends): every request runs many steps.
    return sa.prompt_ids(TARGET, N, prefix_only=True)


@pytest.mark.parametrize("parallel,k", [(True, 5), (False, 3)], ids=["p-eagle K=5", "eagle3 K=3"])
def test_served_acceptance_equals_reference_step_by_step(prompts, parallel, k):
    drafter = sa.EMBEDDED / ("drafter-p-eagle" if parallel else "drafter-eagle3")
    runs = sa.served(TARGET, drafter, prompts, k=k, parallel=parallel, max_tokens=MAX_TOKENS, prefix_caching=True, passes=2)
    ref = sa.reference(TARGET, drafter, prompts, k=k, parallel=parallel, max_tokens=MAX_TOKENS)
    ref_steps = [r.accepted_per_step for r in ref]
    for p, run in enumerate(runs, 1):
        steps = [r.accepted_per_step for r in run]
        assert [r.tokens for r in run] == [r.tokens for r in ref], f"pass {p}: greedy output differs from the reference"
        assert sa.per_position(steps, k) == sa.per_position(ref_steps, k), (
            f"pass {p}: served per-position acceptance {sa.per_position(steps, k)} != reference {sa.per_position(ref_steps, k)}")
        assert steps == ref_steps, f"pass {p}: per-step accepted counts differ"
    assert sa.per_position(ref_steps, k)[1] > 0, "nothing accepted at position 2: the comparison would be vacuous"
