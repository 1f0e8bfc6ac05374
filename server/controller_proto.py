"""The controller's state as the gRPC ``GetControllerState`` message."""

from __future__ import annotations

from quickdraft.server.controller import ControllerState, Decision, Prediction
from quickdraft.server.speculative import SpecConfig
from quickdraft.v1 import completion_pb2 as pb

TTFT_SHOWN = ("inline", "chat", "batch")
"""The candidate's ``predicted_ttft_ms`` is that of the first of these classes the model predicts."""


def state_message(state: ControllerState) -> pb.ControllerState:
    if state.predictions:
        candidates = [candidate_message(p) for p in state.predictions]
    else:
        candidates = [pb.CandidateEstimate(config=c.label(), parallel_drafting=c.parallel, num_speculative_tokens=c.k)
                      for c in state.candidates]
    return pb.ControllerState(
        enabled=state.enabled,
        active=speculative_message(state.engine),
        candidates=candidates,
        decisions=[decision_message(d) for d in state.decisions],
        acceptance_per_position=state.shown_acceptance(),
        running_requests=state.load.current,
        profile_path=state.profile_path,
        engine_rebuilds=state.engine_rebuilds,
        measuring=state.measuring,
        measured=[pb.MeasuredTPOT(load=m.load, config=m.config.label(), tpot_ms=m.tpot_s * 1e3, windows=m.windows,
                                  age_s=m.age_s) for m in state.measured],
    )


def speculative_message(engine: SpecConfig) -> pb.SpeculativeConfig:
    if not engine.enabled:
        return pb.SpeculativeConfig()
    return pb.SpeculativeConfig(
        method="eagle3", num_speculative_tokens=engine.max_k, parallel_drafting=engine.parallel,
        per_batch_size=[pb.BatchSizeK(min_batch_size=lo, max_batch_size=hi, num_speculative_tokens=k)
                        for lo, hi, k in engine.per_batch_size])


def candidate_message(p: Prediction) -> pb.CandidateEstimate:
    ttft_s = next((p.ttft_s[c] for c in TTFT_SHOWN if p.ttft_s.get(c) is not None), None)
    msg = pb.CandidateEstimate(config=p.config.label(), parallel_drafting=p.config.parallel,
                               num_speculative_tokens=p.config.k, expected_acceptance_length=p.acceptance_length,
                               samples=p.count)
    if p.tpot_s is not None:
        msg.predicted_tpot_ms = p.tpot_s * 1e3
    if ttft_s is not None:
        msg.predicted_ttft_ms = ttft_s * 1e3
    return msg


def decision_message(d: Decision) -> pb.ControllerDecision:
    return pb.ControllerDecision(unix_time=d.timestamp, from_config=d.current.label(), to_config=d.engine.label(),
                                 reason=d.reason, action=d.action)
