"""server/vllm_live.py without an engine: version gate, switch requests, and
the decode-graph bookkeeping that lets a live step at any K replay a full
CUDA graph (checked here on fakes of vLLM's runner and dispatcher; the graphs
themselves only exist on CUDA, bench/live_switch.py measures them there)."""

from __future__ import annotations

import pytest

from quickdraft.server import vllm_live
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.vllm_live import DecodeGraphs, LiveSwitchUnsupported


def test_unsupported_vllm_is_refused_with_the_fix():
    with pytest.raises(LiveSwitchUnsupported, match="live_switching = false"):
        vllm_live.check_supported("0.30.1")
    vllm_live.check_supported("0.32.0+cpu")
    vllm_live.check_supported("0.24.0")


def test_live_request_checks_k_and_mode():
    state = vllm_live.live_request(SpecConfig.scheduled(True, [(1, 1, 7), (2, 8, 3)]), max_k=7, max_batch=8,
                                   parallel_capable=True)
    assert state.parallel and state.dense[1] == 7 and state.dense[2:] == (3,) * 7
    with pytest.raises(ValueError, match="above the engine's maximum"):
        vllm_live.live_request(SpecConfig(True, 8), max_k=7, max_batch=8, parallel_capable=True)
    with pytest.raises(ValueError, match="P-EAGLE"):
        vllm_live.live_request(SpecConfig(True, 3), max_k=7, max_batch=8, parallel_capable=False)


class FakeDispatcher:
    def __init__(self, width: int):
        self.uniform_decode_query_len = width
        self.keys: set = set()
        self.padded: list[tuple] = []

    def _create_padded_batch_descriptor(self, num_tokens, uniform_decode, has_lora, num_active_loras=0):
        from vllm.forward_context import BatchDescriptor

        self.padded.append((num_tokens, uniform_decode, self.uniform_decode_query_len))
        # vLLM's capture sizes for width 8 step by 8 tokens.
        return BatchDescriptor(num_tokens=-(-num_tokens // 8) * 8, uniform=uniform_decode)

    def add_cudagraph_key(self, mode, desc):
        self.keys.add(desc)


class FakeRunner:
    def __init__(self, width: int = 8):
        self.uniform_decode_query_len = width
        self.cudagraph_dispatcher = FakeDispatcher(width)
        self.seen: list[tuple[int, int]] = []

    def _determine_batch_execution_and_padding(self, **kw):
        # What vLLM does: dispatch with the runner's width, and say which width it was.
        d = self.cudagraph_dispatcher
        self.seen.append((self.uniform_decode_query_len, d.uniform_decode_query_len))
        uniform = kw["max_num_scheduled_tokens"] == self.uniform_decode_query_len
        return d._create_padded_batch_descriptor(kw["num_tokens"], uniform, False)


def step(runner, q: int, n: int, **extra):
    return runner._determine_batch_execution_and_padding(num_tokens=q * n, num_reqs=n, max_num_scheduled_tokens=q,
                                                          **extra)


def test_counts_cover_every_batch_up_to_16_then_every_8th():
    assert DecodeGraphs.counts_for(8, 64, 4) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert DecodeGraphs.counts_for(8, 64, 6) == [1, 2, 3, 4, 5, 6, 7, 8]  # 8 x 6 = 48 <= 64
    assert DecodeGraphs.counts_for(8, 64, 9) == [1, 2, 3, 4, 5, 6, 7]
    assert DecodeGraphs.counts_for(256, 512, 2)[-3:] == [240, 248, 256]
    assert 17 not in DecodeGraphs.counts_for(256, 512, 2) and 24 in DecodeGraphs.counts_for(256, 512, 2)


def test_a_step_at_a_captured_width_dispatches_as_uniform_decode_of_that_width():
    runner = FakeRunner(width=8)
    graphs = DecodeGraphs.of(runner)
    assert DecodeGraphs.of(runner) is graphs
    graphs.request_counts[4] = [1, 2, 4, 8]  # K=3, as capture() records it
    desc = step(runner, 4, 3)
    # Three requests of 4 tokens pad to the next captured count, not to a token size.
    assert (desc.num_tokens, desc.num_reqs, desc.uniform) == (16, 4, True)
    assert runner.seen[-1] == (4, 4)
    # The width is the engine's again after the step.
    assert runner.uniform_decode_query_len == 8 and runner.cudagraph_dispatcher.uniform_decode_query_len == 8


def test_other_steps_keep_vllms_dispatch():
    runner = FakeRunner(width=8)
    graphs = DecodeGraphs.of(runner)
    graphs.request_counts[4] = [1, 2]
    step(runner, 8, 2)  # max K: vLLM's own graphs
    assert runner.seen[-1] == (8, 8)
    mixed = runner._determine_batch_execution_and_padding(num_tokens=11, num_reqs=3, max_num_scheduled_tokens=4)
    assert runner.seen[-1] == (8, 8) and not mixed.uniform  # not every request has 4 tokens
    step(runner, 3, 2)  # a width nobody captured
    assert runner.seen[-1] == (8, 8)
    step(runner, 4, 2, force_uniform_decode=False)  # vLLM's capture of mixed batches
    assert runner.seen[-1] == (8, 8)


def test_more_requests_than_captured_fall_back_to_vllms_padding():
    runner = FakeRunner(width=8)
    graphs = DecodeGraphs.of(runner)
    graphs.request_counts[4] = [1, 2]
    desc = step(runner, 4, 5)
    assert not desc.uniform and desc.num_tokens == 24
    assert runner.cudagraph_dispatcher.padded[-1] == (20, False, 4)


def test_runner_without_graphs_is_reported_unsupported():
    class CpuRunner(FakeRunner):
        device = "cpu"

    assert "no CUDA graphs" in DecodeGraphs.unsupported(CpuRunner())


# --- speculation off without the drafter's pass ----------------------------------------


def test_skip_is_asked_only_for_off():
    def skip(spec):
        return vllm_live.live_request(spec, max_k=7, max_batch=8, parallel_capable=True,
                                      skip_drafter_when_off=True).skip_drafter

    assert skip(SpecConfig.off())
    assert not skip(SpecConfig(True, 3)) and not skip(SpecConfig(False, 1))
    # A schedule with K=0 at some batch sizes still drafts at others: its K=0 steps keep the pass.
    assert not skip(SpecConfig.scheduled(False, [(1, 2, 5), (3, 8, 0)]))
    assert not vllm_live.live_request(SpecConfig.off(), max_k=7, max_batch=8, parallel_capable=True).skip_drafter


class FakeCommonAttnMetadata:
    def __init__(self, batch: int):
        self.batch = batch

    def batch_size(self) -> int:
        return self.batch


class FakeProposer:
    """The attributes of vLLM's EAGLE proposer that LiveDrafter reads and sets."""

    method = "eagle3"
    pass_hidden_states_to_model = True

    def __init__(self):
        self.parallel_drafting = True
        self.extra_slots_per_request = 5
        self.num_speculative_tokens = 5
        self._last_draft_probs = "stale"
        self.calls: list[int] = []

    def propose(self, num_speculative_tokens, **kw):
        import torch

        self.calls.append(num_speculative_tokens)
        return torch.zeros(kw["common_attn_metadata"].batch_size(), num_speculative_tokens, dtype=torch.int64)


def _propose(proposer, k: int, batch: int = 3):
    import torch

    return proposer.propose(num_speculative_tokens=k, target_token_ids=torch.zeros(7, dtype=torch.int64),
                            common_attn_metadata=FakeCommonAttnMetadata(batch))


def test_drafter_pass_is_skipped_at_k0_only_when_told():
    import torch

    proposer = FakeProposer()
    live = vllm_live.LiveDrafter.of(proposer)
    _propose(proposer, 0)
    assert proposer.calls == [0] and live.skipped == 0  # vLLM's own K=0: the first pass runs
    live.skip_at_zero = True
    out = _propose(proposer, 0, batch=4)
    assert proposer.calls == [0], "the drafter ran although off skips it"
    assert out.shape == (4, 0) and out.dtype == torch.int64 and live.skipped == 1
    assert proposer._last_draft_probs is None and proposer.num_speculative_tokens == 0
    # A step that drafts runs the drafter whatever the flag says.
    assert _propose(proposer, 3).shape == (3, 3) and proposer.calls == [0, 3]


def test_requests_started_while_the_drafter_is_skipped_get_a_cache_salt_of_their_own():
    """Blocks computed while the drafter was skipped hold no drafter KV: the
    requests started then carry a prefix-cache salt of their own, which
    requests that draft never carry, so they never reuse those blocks; and
    requests that draft keep hitting what was cached before the off period."""
    import asyncio

    from quickdraft.server.config import QuickdraftConfig
    from quickdraft.server.engine import Engine

    told: list[tuple] = []

    class FakeCore:
        async def call_utility_async(self, *args):
            told.append(args)
            return {"skip_drafter": args[-1]}  # as on a release where the skip is tested

    class FakeLLM:
        engine_core = FakeCore()
        errored = False

        def generate(self, prompt, sampling, request_id):
            return prompt  # what the engine would get

    def salt(engine):
        return engine.generate("r", [1, 2, 3], None).get("cache_salt")

    async def go(skip: bool) -> list:
        cfg = QuickdraftConfig()
        cfg.speculation.skip_drafter_when_off = skip
        cfg.model.drafter = cfg.drafter_path(True)  # one head for both modes
        engine = Engine(cfg, SpecConfig(True, 5), live=True)
        engine.llm = FakeLLM()
        seen = []
        for spec in (SpecConfig(True, 5), SpecConfig.off(), SpecConfig(False, 3), SpecConfig(True, 5),
                     SpecConfig.off(), SpecConfig.off(), SpecConfig(True, 2)):
            await engine.switch(spec)
            seen.append((told[-1][-1], salt(engine)))
        return seen

    off = "quickdraft-no-drafter"
    assert asyncio.run(go(True)) == [(False, None), (True, off), (False, None), (False, None), (True, off),
                                     (True, off), (False, None)]
    assert all(s == (False, None) for s in asyncio.run(go(False)))
