"""Speculative decoding on the real engine: greedy output does not depend on
the drafting mode, and the drafter vLLM runs is the one we trained (its
acceptance counts equal those of training/reference.py's decoder)."""

from __future__ import annotations

import logging
import time

import pytest

from quickdraft.server.speculative import SpecConfig
from quickdraft.server.prompt_tokens import tokenize
from quickdraft.v1 import completion_pb2 as pb
from tests.integration.test_serve import heldout

pytestmark = pytest.mark.engine

MODES = {
    "parallel K=5": SpecConfig(True, 5),
    "autoregressive K=3": SpecConfig(False, 3),
    "off": SpecConfig.off(),
}


def requests() -> list[pb.CompleteRequest]:
    out = [pb.CompleteRequest(prefix=p["prefix"], max_tokens=48, **({"suffix": p["suffix"]} if p["suffix"] is not None else {})) for p in heldout(6)]
    out.append(pb.CompleteRequest(prefix="class Point:\n    def __init__(self, x, y):\n        self.x = x\n", max_tokens=48))
    return out


class ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def vllm_errors():
    """Errors vLLM logs in this process while the module's switches run."""
    handler = ErrorRecords()
    logger = logging.getLogger("vllm")  # vLLM's own handlers sit here; its loggers do not propagate past it
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def runs(server, vllm_errors):
    """Outputs and figures of the same requests under each mode (two engine switches and back)."""
    from quickdraft.client import CompletionClient

    default = server.engine.spec
    results = {}
    try:
        with CompletionClient(server.address, timeout=120) as client:
            for label, mode in MODES.items():
                assert server.switch(mode, f"test: {label}")
                assert server.engine.spec == mode
                results[label] = [client.complete_text(r) for r in requests()]
    finally:
        assert server.switch(default, "test: back to default")
    return results


def test_greedy_output_identical_with_speculation_off_autoregressive_and_parallel(runs):
    off = [r.text for r in runs["off"]]
    assert any(off), "the model produced nothing at all"
    for label in ("parallel K=5", "autoregressive K=3"):
        assert [r.text for r in runs[label]] == off, f"{label} changed greedy output"


def test_acceptance_counters_nonzero_in_both_modes(runs):
    for label in ("parallel K=5", "autoregressive K=3"):
        per_pos = [sum(r.final.speculative.accepted_per_position[i] for r in runs[label]) for i in range(3)]
        assert all(n > 0 for n in per_pos), f"{label}: accepted per position {per_pos}"
    assert all(not r.final.speculative.enabled for r in runs["off"])


def test_engine_switches_are_counted(server, runs):
    # The embedded preset drafts with one head per mode, and "off" is a plain
    # engine on the CPU: each of the three switches here needs another engine.
    assert server.server.engines.stats.rebuilds >= 3
    assert server.engine.spec == SpecConfig(True, 5)


@pytest.mark.parametrize("label", ["parallel K=5", "autoregressive K=3"])
def test_vllm_runs_the_drafter_we_trained(server, runs, label):
    """Per-position accepted counts from vLLM equal those of the PyTorch
    reference decoder on the same weights (only the last verify step of a
    request may differ: vLLM may cut it at max_tokens or a stop token)."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.eagle3 import Eagle3Drafter
    from training.reference import speculative_greedy

    mode = MODES[label]
    cfg = server.cfg
    target = AutoModelForCausalLM.from_pretrained(cfg.target_path(), dtype=torch.float32).eval()
    from pathlib import Path

    drafter = Eagle3Drafter.load(Path(cfg.drafter_path(mode.parallel)))  # the head the engine ran for that mode
    stop = set(server.engine.stop_token_ids)
    compared = 0
    for req, got in list(zip(requests(), runs[label]))[:4]:
        ids = tokenize(server.engine.prompt_tokens, req, "qwen-fim")
        ref = speculative_greedy(target, drafter, ids, req.max_tokens, mode.k, mode.parallel, stop)
        ref_per_pos = [sum(1 for a in ref.accepted_per_step if a >= p) for p in range(1, mode.k + 1)]
        vllm_per_pos = list(got.final.speculative.accepted_per_position)
        assert abs(got.final.speculative.num_drafts - ref.num_drafts) <= 1, (label, got.final.speculative.num_drafts, ref.num_drafts)
        assert all(abs(a - b) <= 1 for a, b in zip(ref_per_pos, vllm_per_pos)), (label, ref_per_pos, vllm_per_pos)
        compared += sum(ref_per_pos)
    assert compared > 0, "nothing was accepted: the comparison would be vacuous"


def test_retired_engines_stop_without_an_output_handler_error(runs, server, vllm_errors):
    """The switches above retired engines with no request left on them. vLLM
    0.32 logs "AsyncLLM output_handler failed" (EngineDeadError) when such an
    engine stops while its output-handler task still runs; server/engine.py
    cancels the task first."""
    deadline = time.monotonic() + 120
    while server.server.engines.stopping and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.server.engines.stopping == 0, "a retired engine is still shutting down after 120 s"
    assert not [m for m in vllm_errors if "output_handler failed" in m]
