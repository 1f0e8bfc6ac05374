"""bench/live_switch.py over the fake engine: its figures and its table."""

from __future__ import annotations

import asyncio

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
