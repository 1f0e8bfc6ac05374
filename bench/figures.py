"""The figures of one load-generator run, from its per-request results.

Which requests count where:
- latency figures (TTFT, TPOT, end-to-end) and acceptance: completed requests
  only. A cancelled request's latency says nothing about the server (the user
  gave up); counting only the cancelled ones that were fast would bias it.
- SLO attainment of a class: completed requests of the class with client TTFT
  <= the class's SLO, over completed + failed requests of the class (a failed
  request missed its SLO; a cancelled one was not waited for). An empty
  completion (a single-line request whose first token is the newline) counts
  by the time its empty answer arrived.
- requests failed: any outcome but a completion or the client's own cancel.
- output tokens/s: tokens of completed requests over the run's wall time
  (first send to last answer).
- TPOT: per-request (last - first token) / (tokens - 1), as percentiles, and
  token-weighted (all decode time / all decode tokens), which is what
  throughput at batch 1 follows.
"""

from __future__ import annotations

import math
from collections import Counter

from quickdraft.bench.loadgen import Result, RunOutcome
from quickdraft.bench.stats import LogHistogram, summarize

DEFAULT_SLO_S = {"inline": 0.3, "chat": 1.0, "batch": 10.0}
MS = 1000.0


def _ms(xs: list[float]) -> dict:
    return summarize([x * MS for x in xs], digits=2)


def _answer_s(r: Result) -> float:
    """When the editor had its answer: the first token, or for an empty completion the end."""
    if r.ttft_s is not None:
        return r.ttft_s
    return r.e2e_s if r.e2e_s is not None else math.inf


def summarize_run(run: RunOutcome, slo_s: dict[str, float] | None = None) -> dict:
    slo_s = {**DEFAULT_SLO_S, **(slo_s or {})}
    rs = run.results
    ok = [r for r in rs if r.outcome == "ok"]
    failed = [r for r in rs if r.outcome == "failed"]
    cancelled = [r for r in rs if r.outcome == "cancelled"]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    decode_s = sum(r.decode_s for r in ok if r.tpot_s is not None)
    decode_tokens = sum(r.tokens - 1 for r in ok if r.tpot_s is not None)
    drafts = sum(r.drafts for r in ok)
    accepted = sum(r.accepted for r in ok)
    tokens = sum(r.tokens for r in ok)
    classes = sorted({r.latency_class for r in rs})
    slo = {}
    for c in classes:
        done = [r for r in ok if r.latency_class == c]
        missed_by_failure = sum(r.latency_class == c for r in failed)
        met = sum(_answer_s(r) <= slo_s.get(c, math.inf) for r in done)
        den = len(done) + missed_by_failure
        slo[c] = {"slo_ms": slo_s.get(c, math.inf) * MS, "requests": den, "met": met, "attainment": None if den == 0 else round(met / den, 4)}
    by_kind = {}
    for kind in sorted({r.kind for r in ok}):
        sel = [r for r in ok if r.kind == kind]
        by_kind[kind] = {"ttft_ms": _ms([r.ttft_s for r in sel if r.ttft_s is not None]), "tpot_ms": _ms([r.tpot_s for r in sel if r.tpot_s is not None]),
                         "tokens_mean": round(sum(r.tokens for r in sel) / len(sel), 1)}
    server_ttft = [r.server_ttft_s for r in ok if r.server_ttft_s is not None]
    server_tpot = [r.server_tpot_s for r in ok if r.server_tpot_s is not None]
    return {
        "mode": run.spec.mode,
        "concurrency": run.spec.concurrency if run.spec.mode == "closed" else None,
        "rate_per_s": run.spec.rate_per_s if run.spec.mode == "open" else None,
        "wall_s": round(run.wall_s, 2),
        "requests": len(rs),
        "completed": len(ok),
        "cancelled": len(cancelled),
        "failed": len(failed),
        "failures": dict(Counter(r.error for r in failed).most_common(10)),
        "dropped": run.dropped,
        "warmup_failures": run.warmup_failures,
        "planned_cancels": sum(r.planned_cancel for r in rs),
        "ttft_ms": _ms(ttft),
        "tpot_ms": _ms(tpot),
        "tpot_ms_token_weighted": round(MS * decode_s / decode_tokens, 3) if decode_tokens else None,
        "e2e_ms": _ms(e2e),
        "server_ttft_ms": _ms(server_ttft),
        "server_tpot_ms": _ms(server_tpot),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / run.wall_s, 2) if run.wall_s > 0 else None,
        "completions_per_s": round(len(ok) / run.wall_s, 3) if run.wall_s > 0 else None,
        "mean_acceptance_length": round(1.0 + accepted / drafts, 3) if drafts else None,
        "drafts": drafts,
        "accepted_tokens": accepted,
        "slo": slo,
        "by_kind": by_kind,
        # Mergeable across runs (seconds): percentiles of merged runs come from these.
        "histograms": {
            "ttft_s": LogHistogram(lowest=1e-4).extend(ttft).to_dict(),
            "tpot_s": LogHistogram(lowest=1e-5).extend(tpot).to_dict(),
            "e2e_s": LogHistogram(lowest=1e-4).extend(e2e).to_dict(),
        },
    }


def one_line(fig: dict) -> str:
    """A short human summary for progress logs."""
    slo = ", ".join(f"{c} {v['attainment']:.0%}" for c, v in fig["slo"].items() if v["attainment"] is not None)
    acc = fig["mean_acceptance_length"]
    return (
        f"{fig['completed']} done / {fig['cancelled']} cancelled / {fig['failed']} failed; "
        f"TTFT p50 {fig['ttft_ms'].get('p50', float('nan')):.1f} ms p95 {fig['ttft_ms'].get('p95', float('nan')):.1f}; "
        f"TPOT p50 {fig['tpot_ms'].get('p50', float('nan')):.2f} ms; {fig['output_tokens_per_s']} tok/s"
        + (f"; acceptance {acc:.2f}" if acc else "")
        + (f"; SLO {slo}" if slo else "")
    )


def result_rows(results: list[Result]) -> list[dict]:
    return [r.to_dict() for r in results]
