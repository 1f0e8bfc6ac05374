"""Live speculative switching on the real engine (server/vllm_live.py).

One live engine of the embedded model whose P-EAGLE head drafts in both
modes, as the GPU presets' heads do (the embedded preset itself ships a
separate EAGLE-3 head, so its parallel <-> autoregressive move is a change
of engine). The tests drive it below the service, with token ids, so that a
switch can be made between any two engine steps of a stream.
"""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest

from quickdraft.server.speculative import SpecConfig
from tests.integration.conftest import LoopThread, embedded_config

pytestmark = pytest.mark.engine

MAX_BATCH_SCHEDULES = (
    SpecConfig.scheduled(True, [(1, 1, 7), (2, 3, 3), (4, 16, 1)]),
    SpecConfig.scheduled(False, [(1, 2, 5), (3, 16, 0)]),
)
CONFIGS = (
    (SpecConfig.off(),)
    + tuple(SpecConfig(False, k) for k in range(1, 8))
    + tuple(SpecConfig(True, k) for k in range(1, 8))
    + MAX_BATCH_SCHEDULES
)


def prompts(engine, n: int) -> list[list[int]]:
    from tests.integration.test_serve import heldout

    return [engine.tokenizer(p["prefix"])["input_ids"][-300:] for p in heldout(n)]


async def generate(engine, ids: list[int], rid: str, max_tokens: int, on_token=None) -> list[int]:
    from vllm import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    last = None
    n = 0
    async for out in engine.generate(rid, ids, sampling):
        last = out
        n += 1
        if on_token is not None:
            await on_token(n)
    assert last is not None and last.finished, f"{rid} did not finish"
    return list(last.outputs[0].token_ids)


@pytest.fixture(scope="module")
def live():
    """(loop, engine): a live engine that drafts in both modes with one head."""
    from quickdraft.server.engine import Engine

    cfg = embedded_config()
    cfg.model.drafter = cfg.drafter_path(True)  # the P-EAGLE head for autoregressive drafting too
    loop = LoopThread()
    engine = loop.run(Engine.start(cfg, SpecConfig(True, 5), live=True), timeout=600)
    assert engine.parallel_capable and engine.autoregressive_capable, engine.describe()
    yield loop, engine
    engine.shutdown()
    loop.stop()


@pytest.fixture
def live_engine(live):
    return live[1]


@pytest.fixture
def run(live):
    return live[0].run


def test_switches_mid_stream_keep_greedy_output_identical(run, live_engine):
    """Every ordered pair of settings, switched between engine steps while
    four streams decode: their tokens equal speculation off's, none is lost."""
    ids = prompts(live_engine, 4)
    max_tokens = 160

    async def reference() -> list[list[int]]:
        await live_engine.switch(SpecConfig.off())
        return [await generate(live_engine, p, f"ref-{i}", max_tokens) for i, p in enumerate(ids)]

    pairs = [(a, b) for a, b in itertools.permutations(CONFIGS, 2)]
    order = [c for pair in pairs for c in pair]

    async def switching() -> tuple[list[list[int]], int]:
        todo = iter(order)
        done = 0
        switching_done = asyncio.Event()

        async def on_token(_n: int) -> None:
            nonlocal done
            for _ in range(3):  # a few switches between two outputs of the first stream
                spec = next(todo, None)
                if spec is None:
                    switching_done.set()
                    return
                await live_engine.switch(spec)
                done += 1

        outs = await asyncio.gather(*(generate(live_engine, p, f"live-{i}", max_tokens, on_token if i == 0 else None)
                                      for i, p in enumerate(ids)))
        # Streams shorter than the switch list: finish the list on new streams.
        while not switching_done.is_set():
            more = await asyncio.gather(*(generate(live_engine, p, f"more-{done}-{i}", max_tokens, on_token if i == 0 else None)
                                          for i, p in enumerate(ids)))
            assert more == outs
        return outs, done

    ref = run(reference())
    outs, done = run(switching(), timeout=900)
    assert done == len(order) == 2 * len(CONFIGS) * (len(CONFIGS) - 1)
    for i, (got, want) in enumerate(zip(outs, ref)):
        assert len(got) == max_tokens
        assert got == want, f"stream {i} differs from speculation off after live switches"


def _drafts(engine) -> tuple[int, int, list[int], int]:
    s = engine.snapshot
    return s.drafts, s.draft_tokens, list(s.accepted_per_position), s.accepted_tokens


@pytest.mark.parametrize("spec", [SpecConfig(True, 3), SpecConfig(False, 7), SpecConfig(True, 6), SpecConfig(False, 2)],
                         ids=lambda s: s.label())
def test_switch_sets_k_and_mode_of_the_next_steps(run, live_engine, spec):
    """After a switch, a lone stream drafts exactly K tokens per step in the
    asked mode, and vLLM's per-position acceptance stays consistent."""
    ids = prompts(live_engine, 1)[0]

    async def go():
        await live_engine.switch(spec)
        state = (await live_engine.llm.collective_rpc("quickdraft_drafting_state"))[0]
        before = _drafts(live_engine)
        await generate(live_engine, ids, f"k-{spec.label()}", 64)
        await asyncio.sleep(0.3)  # the stat logger records after the last step
        return state, before, _drafts(live_engine)

    state, before, after = run(go())
    assert state["parallel"] is spec.parallel
    drafts = after[0] - before[0]
    draft_tokens = after[1] - before[1]
    assert drafts > 0
    assert draft_tokens == spec.k * drafts, f"{spec.label()}: {draft_tokens} draft tokens over {drafts} steps"
    per_pos = [a - (before[2][i] if i < len(before[2]) else 0) for i, a in enumerate(after[2])]
    assert sum(per_pos) == after[3] - before[3], "per-position acceptance does not add up to the accepted tokens"
    assert all(n == 0 for n in per_pos[spec.k:]), "acceptance counted beyond the step's K"
    assert all(per_pos[i] >= per_pos[i + 1] for i in range(spec.k - 1)), per_pos


def test_off_drafts_nothing(run, live_engine):
    ids = prompts(live_engine, 1)[0]

    async def go():
        await live_engine.switch(SpecConfig.off())
        before = _drafts(live_engine)
        await generate(live_engine, ids, "k-off", 48)
        await asyncio.sleep(0.3)
        return before, _drafts(live_engine)

    before, after = run(go())
    assert after[0] == before[0] and after[1] == before[1]


def test_off_skips_the_drafter_and_drafting_resumes_clean(run, live_engine):
    """Off skips the drafter's pass (speculation.skip_drafter_when_off); when
    drafting resumes, a prompt first prefilled while off drafts exactly as it
    does from a clean prefill, because the new cache salt keeps the blocks
    without drafter KV out of its prefix-cache hits."""
    ids = prompts(live_engine, 3)[2]

    async def state() -> dict:
        return (await live_engine.llm.collective_rpc("quickdraft_drafting_state"))[0]

    async def drafted(rid: str) -> tuple[list[int], tuple]:
        before = _drafts(live_engine)
        out = await generate(live_engine, ids, rid, 48)
        await asyncio.sleep(0.3)
        after = _drafts(live_engine)
        return out, tuple(a - b for a, b in zip((after[0], after[1], after[3]), (before[0], before[1], before[3])))

    async def go():
        await live_engine.switch(SpecConfig.off())
        off_state, epoch = await state(), live_engine.draft_epoch
        out_off = await generate(live_engine, ids, "skip-off", 48)
        skipped = (await state())["skipped_passes"] - off_state["skipped_passes"]
        await live_engine.switch(SpecConfig(True, 5))
        resumed = await drafted("skip-resumed")
        await live_engine.switch(SpecConfig.off())
        await live_engine.switch(SpecConfig(True, 5))
        clean = await drafted("skip-clean")
        return off_state, epoch, out_off, skipped, resumed, clean

    off_state, epoch, out_off, skipped, resumed, clean = run(go())
    assert off_state["skip_at_zero"] is True
    assert skipped >= 48, f"only {skipped} drafter passes skipped over 48 tokens off"
    assert live_engine.draft_epoch == epoch + 2
    assert resumed[0] == clean[0] == out_off
    assert resumed[1][0] > 0 and resumed[1][2] > 0, "no drafts accepted after drafting resumed"
    assert resumed[1] == clean[1], f"drafts/tokens/accepted {resumed[1]} after the off period vs {clean[1]} from a clean prefill"


def test_schedule_follows_the_batch(run, live_engine):
    """A K schedule changes K with the number of running streams (parallel
    drafting with a schedule crashed vLLM's CPU build before this module)."""
    spec = SpecConfig.scheduled(True, [(1, 1, 5), (2, 16, 2)])
    ids = prompts(live_engine, 4)

    async def go():
        await live_engine.switch(spec)
        before = _drafts(live_engine)
        await asyncio.gather(*(generate(live_engine, p, f"sched-{i}", 48) for i, p in enumerate(ids)))
        await asyncio.sleep(0.3)
        return before, _drafts(live_engine)

    before, after = run(go())
    drafts, tokens = after[0] - before[0], after[1] - before[1]
    assert drafts > 0
    # Mostly 4 streams at K=2, a few steps at K=5 when one is left.
    assert 2 * drafts <= tokens < 5 * drafts


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for p in [pid, *_children(pid)]:
            try:
                with open(f"/proc/{p}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
            except OSError:
                pass
    return total / 1024


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def test_thousand_switches_do_not_grow_memory(run, live_engine):
    ids = prompts(live_engine, 2)
    cycle = itertools.cycle(CONFIGS)

    async def churn(n: int) -> None:
        stream = asyncio.gather(*(generate(live_engine, p, f"mem-{n}-{i}", 96) for i, p in enumerate(ids)))
        for _ in range(n):
            await live_engine.switch(next(cycle))
        await stream

    pids = live_engine.engine_core_pids()
    assert pids
    run(churn(100))  # warm: every setting's buffers and shapes seen once
    before = _rss_mib(pids)
    run(churn(1000), timeout=900)
    after = _rss_mib(pids)
    assert after - before < 32, f"engine processes grew {after - before:.1f} MiB over 1,000 switches"


def test_decode_graphs_are_skipped_without_cuda_graphs(run, live_engine):
    """The CPU build has no CUDA graphs: asking for decode graphs at every
    live K is answered with the reason and leaves the engine serving."""
    from quickdraft.server import vllm_live

    report = run(vllm_live.capture_decode_graphs(live_engine.llm, list(range(live_engine.max_k))))
    assert "no CUDA graphs" in report["skipped"]
    ids = prompts(live_engine, 1)[0]
    assert len(run(generate(live_engine, ids, "after-capture", 8))) == 8
