"""The controller on the real CPU engine with live switching: it measures
the settings the live engine can run in windows, probes them by live
switches while streams run, and no request is lost. Its own server (the
shared one runs without a controller)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import embedded_config, start_server, stop_server

from tests.integration.test_serve import LONG

# Prompts the embedded model answers at length: the windows need decode tokens.
PROMPTS = [LONG, LONG.replace("Point", "Vector"), LONG.replace("x, y", "left, right").replace(".x", ".left").replace(".y", ".right")]


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    cfg = embedded_config()
    cfg.controller.enabled = True
    cfg.controller.profile_dir = str(tmp_path_factory.mktemp("profiles"))
    cfg.controller.measure.window_s = 0.3
    cfg.controller.measure.min_tokens = 12  # per request in flight: 24 a window at two streams
    rs = start_server(cfg)
    yield rs
    stop_server(rs)


def test_the_controller_measures_and_switches_live_without_losing_a_request(controlled):
    from quickdraft.client import CompletionClient
    from quickdraft.v1 import completion_pb2 as pb

    # Two streams until the controller has measured a second config (a window that the
    # load moved in is discarded, so how many requests that takes depends on timing), at most 40 each.
    enough = threading.Event()

    def stream(worker: int) -> list:
        with CompletionClient(controlled.address, timeout=120) as c:
            out = []
            for i in range(40):
                if enough.is_set() and i >= 8:
                    break
                out.append(c.complete_text(prefix=PROMPTS[(worker + i) % len(PROMPTS)], max_tokens=64,
                                           request_id=f"w{worker}-{i}"))
            return out

    with ThreadPoolExecutor(2) as pool, CompletionClient(controlled.address) as watcher:
        runs = [pool.submit(stream, w) for w in range(2)]
        while not all(r.done() for r in runs):
            if len({m.config for m in watcher.controller_state().measured}) >= 2:
                enough.set()
            time.sleep(0.2)
        results = [r for run in runs for r in run.result()]
    with CompletionClient(controlled.address) as c:
        state = c.controller_state()

    assert len(results) >= 16, "each stream runs at least 8 requests"
    assert all(r.final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH) for r in results)
    assert state.measuring, "the live engine can run several Ks: the controller should measure"
    probes = [d for d in state.decisions if d.action == "explore" and d.reason.startswith("measuring")]
    assert probes, [d.reason for d in state.decisions]
    assert state.live_switches >= len(probes) and state.engine_rebuilds == 0
    assert len(state.live_switch_ms) == state.live_switches
    assert state.measured and all(m.tpot_ms > 0 and m.windows >= 1 for m in state.measured)
    assert len({m.config for m in state.measured}) >= 2, [(d.action, d.reason) for d in state.decisions]
    # A request that ran across a live switch says so, and what it ended with.
    spanned = [r.final.speculative for r in results if r.final.speculative.live_switches]
    assert all(s.config_at_end for s in spanned)
