"""bench/live_switch.py over the fake engine: its figures and its table."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

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


def test_after_switch_bins_outputs_by_time_since_their_switch():
    marks = [(10.0, "off -> parallel K=3"), (11.0, "parallel K=3 -> off"), (12.0, "off -> parallel K=3")]
    gaps = [(9.5, 1, 0.5),                                    # before the first switch: left out
            (10.05, 1, 0.010), (10.2, 2, 0.010), (10.7, 2, 0.004), (10.8, 2, 0.004),  # first transition
            (11.05, 1, 0.003), (11.9, 1, 0.003),
            (12.05, 1, 0.006), (12.6, 2, 0.004), (13.5, 1, 0.001)]  # the last one after the end: left out
    out = live_switch.bin_after_switch(gaps, marks, end=13.0, period_s=1.0)
    assert out["bins_s"] == ["0.0-0.1", "0.1-0.25", "0.25-0.5", "0.5-1.0"]
    on = out["by_transition"]["off -> parallel K=3"]
    assert on["tokens"] == [2, 2, 0, 6]
    assert on["tpot_ms"] == [8.0, 5.0, None, 2.0]  # (10 + 6) ms / 2 tokens; 10 ms / 2; (4 + 4 + 4) ms / 6
    assert on["vs_steady"] == [4.0, 2.5, None, 1.0]
    off = out["by_transition"]["parallel K=3 -> off"]
    assert off["tokens"] == [1, 0, 0, 1] and off["vs_steady"] == [1.0, None, None, 1.0]


class CyclingEngine(FakeEngine):
    """One token a step, whatever the setting."""

    async def generate(self, request_id, prompt_ids, sampling):
        for _ in range(sampling.max_tokens):
            await asyncio.sleep(self.step_s)
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0])])


def test_after_switch_cycles_the_settings_while_streams_decode():
    engine = CyclingEngine(SpecConfig(True, 3), live=True, step_s=0.005)
    cycle = [SpecConfig.off(), SpecConfig(True, 3)]
    out = asyncio.run(live_switch.after_switch(engine, cycle, [[1, 2]] * 2, concurrency=2, period_s=0.6, switches=4,
                                               max_tokens=50))
    assert (out["concurrency"], out["switches"], out["period_s"]) == (2, 4, 0.6)
    assert set(out["by_transition"]) == {"parallel K=3 -> off", "off -> parallel K=3"}
    assert engine.switches == 4 and engine.spec == cycle[1]  # it starts at the cycle's last: four moves along it
    assert all(v["tokens"][-1] > 0 for v in out["by_transition"].values())
    text = live_switch.table({"levels": [], "after_switch": [out]})
    assert "| off -> parallel K=3 |" in text and "(1.00x)" in text
    with pytest.raises(SystemExit, match="--after-switch-period 0.3"):
        asyncio.run(live_switch.after_switch(engine, cycle, [[1]], concurrency=1, period_s=0.3, switches=1, max_tokens=4))
