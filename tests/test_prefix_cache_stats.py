"""Prefix-cache lookups: counted per engine step, read in GetServerInfo (issue 25)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from vllm.v1.metrics.stats import PrefixCacheStats

from quickdraft.server.engine import EngineSnapshot, _stat_logger_factory
from quickdraft.server.speculative import SpecConfig
from tests.test_service import FakeEngine, make_service


def _step(queries: int, hits: int, running: int = 1):
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=0, num_skipped_waiting_reqs=0, kv_cache_usage=0.1,
                           spec_decoding_stats=None, prefix_cache_stats=PrefixCacheStats(requests=1, queries=queries, hits=hits))


def test_the_stat_logger_sums_prefix_cache_lookups_over_steps():
    snapshot = EngineSnapshot()
    logger = _stat_logger_factory(snapshot)(vllm_config=None)
    for queries, hits in ((374, 0), (375, 128), (0, 0), (376, 256)):
        logger.record(_step(queries, hits), None)
    logger.record(None, None)  # a step without scheduler stats counts nothing
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits, snapshot.steps) == (1125, 384, 4)


def test_server_info_reports_the_running_engines_prefix_cache():
    async def run():
        engines = []

        async def factory(cfg, spec, live=False):
            engines.append(FakeEngine(spec, live))
            return engines[-1]

        cfg, manager, service = make_service(factory)
        before = service.server_info()
        await manager.start(SpecConfig(False, 0))
        engines[0].snapshot.prefix_cache_queries, engines[0].snapshot.prefix_cache_hits = 1000, 640
        after = service.server_info()
        await manager.stop()
        return before, after

    before, after = asyncio.run(run())
    assert (before.prefix_cache_queried_tokens, before.prefix_cache_hit_tokens) == (0, 0)
    assert (after.prefix_cache_queried_tokens, after.prefix_cache_hit_tokens) == (1000, 640)
