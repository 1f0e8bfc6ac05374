"""bench/live_switch.py over the fake engine: its figures and its table."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from quickdraft.bench import live_switch
from quickdraft.server.speculative import SpecConfig
from tests.bench.fakes import FakeEngine


def test_levels_measure_decode_time_per_token():
    engine = FakeEngine(SpecConfig(True, 3), live=True, step_s=0.002, accepted=3)
    level = live_switch.Level("parallel K=3", 2, "live")
    prompts = [[1, 2, 3]] * 4
    asyncio.run(live_switch.run_level(engine, level, prompts, requests=4, max_tokens=33, tag="t"))
    assert len(level.ttft_s) == 4
    assert level.decode_tokens == 4 * 32
    # 4 tokens a step of 2 ms x (1 + 0.05 x 3): about 0.29 ms a token
    assert 0.2 < level.tpot_ms < 2.0


def test_switch_latency_counts_every_switch_and_leaves_the_last_setting():
    engine = FakeEngine(SpecConfig(True, 3), live=True, step_s=0.001)
    configs = [SpecConfig.off(), SpecConfig(False, 5), SpecConfig(True, 7)]
    out = asyncio.run(live_switch.switch_latency(engine, configs, [[1, 2]] * 3, concurrency=2, switches=10, max_tokens=8))
    assert out["switches"] == 10
    assert out["p50_ms"] <= out["p99_ms"] <= out["max_ms"]
    assert sum(out["steps_elapsed"].values()) == 10
    assert engine.spec == configs[9 % 3]


def test_table_puts_live_beside_static():
    def level(label, c, engine, tpot):
        return {"label": label, "concurrency": c, "engine": engine, "tpot_ms": tpot, "ttft_s": [0.05]}

    result = {"levels": [level("parallel K=5", 1, "live", 3.0), level("parallel K=5", 8, "live", 6.0),
                         level("parallel K=5", 1, "static", 2.0), level("parallel K=5", 8, "static", 6.0)],
              "switch_latency": {"concurrency": 8, "switches": 5, "p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 2.0,
                                 "step_ms_meanwhile": 6.0, "steps_elapsed": {"1": 5}}}
    text = live_switch.table(result)
    assert "c=1: 1.500, c=8: 1.000" in text
    assert "p50 1.0 ms" in text


class TransientEngine(FakeEngine):
    """One token a step; steps right after a switch (``slow_s``) take three times as long."""

    slow_s: float = 0.1
    slow_until: float = 0.0

    async def generate(self, request_id, prompt_ids, sampling):
        for _ in range(sampling.max_tokens):
            await asyncio.sleep(self.step_s * (3.0 if time.perf_counter() < self.slow_until else 1.0))
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0])])

    async def switch(self, spec: SpecConfig) -> float:
        self.slow_until = time.perf_counter() + self.slow_s
        return await super().switch(spec)


def test_after_switch_bins_tpot_by_time_since_each_switch():
    engine = TransientEngine(SpecConfig(True, 3), live=True, step_s=0.005)
    cycle = [SpecConfig.off(), SpecConfig(True, 3)]
    out = asyncio.run(live_switch.after_switch(engine, cycle, [[1, 2]] * 2, concurrency=2, period_s=0.6, switches=6,
                                               max_tokens=50))
    assert set(out["by_transition"]) == {"parallel K=3 -> off", "off -> parallel K=3"}
    assert out["bins_s"] == ["0.0-0.1", "0.1-0.25", "0.25-0.5", "0.5-0.6"]
    for key, v in out["by_transition"].items():
        first, *middle, steady = v["vs_steady"]
        assert first > 1.8, (key, v)  # the slow steps land in the first bin
        assert all(0.7 < r < 1.4 for r in middle), (key, v)
        assert steady == 1.0 and all(n > 0 for n in v["tokens"])
    text = live_switch.table({"levels": [], "after_switch": [out]})
    assert "| off -> parallel K=3 |" in text and "(1.00x)" in text
