"""Feed the rows of a ``quickdraft tune`` log to the controller; print its pick per concurrency.

    python -m quickdraft.bench.gpu.replay_tune_log LOG [LOG...] [--max-tokens 64] [--config TOML]

For a tune run whose JSON and profile did not come back (a machine lost
before the sweep ended). The log
keeps one line per (config, concurrency) row: requests, median TPOT, TTFT p50
and mean accepted length. Each row becomes that many observations with the
row's TPOT and TTFT. Per-position acceptance is not in the log: the row's
accepted tokens are spread over the positions in proportion to the synthetic
acceptance rates the engine ran with (the config's ``[speculation]``), which is
what vLLM's synthetic sampler draws from. Only configs the log measured are
candidates: nothing is predicted for a mode without measurements.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from quickdraft.server.config import ControllerSettings, ScheduleSettings, SLOSettings, load_config
from quickdraft.server.controller import Controller, Observation
from quickdraft.server.speculative import SpecConfig

ROW = re.compile(
    r"^(?P<label>off|autoregressive K=\d+|parallel K=\d+) x(?P<c>\d+): (?P<n>\d+) requests, "
    r"TPOT (?P<tpot>[\d.]+) ms, TTFT p50 (?P<ttft>[\d.]+) ms, accepted length (?P<length>[\d.]+)"
)


def parse_rows(text: str) -> list[dict]:
    """The sweep rows of a tune log (progress-bar carriage returns allowed), first occurrence each."""
    rows: dict[tuple[str, int], dict] = {}
    for line in text.replace("\r", "\n").splitlines():
        m = ROW.match(line.strip())
        if m:
            key = (m["label"], int(m["c"]))
            rows.setdefault(key, {
                "config": SpecConfig.parse(m["label"]), "concurrency": int(m["c"]), "requests": int(m["n"]),
                "tpot_s": float(m["tpot"]) / 1000, "ttft_s": float(m["ttft"]) / 1000, "acceptance_length": float(m["length"]),
            })
    return list(rows.values())


def observations(row: dict, max_tokens: int, rates: list[float]) -> list[Observation]:
    cfg: SpecConfig = row["config"]
    extra: dict = {}
    if cfg.enabled:
        drafts = max(1, round(max_tokens / row["acceptance_length"]))
        accepted = drafts * (row["acceptance_length"] - 1.0)
        weights = rates[: cfg.k] if len(rates) >= cfg.k else [1.0] * cfg.k
        per_pos = [round(accepted * w / sum(weights)) for w in weights]
        per_pos = [min(drafts, v) for v in per_pos]
        extra = {"num_drafts": drafts, "num_draft_tokens": drafts * cfg.k, "accepted_per_position": tuple(per_pos)}
    return [
        Observation(latency_class="inline", ttft_s=row["ttft_s"], tpot_s=row["tpot_s"], output_tokens=max_tokens,
                    batch_size=row["concurrency"], config=cfg, **extra)
        for _ in range(row["requests"])
    ]


def replay(rows: list[dict], *, max_tokens: int, rates_ar: list[float], rates_parallel: list[float],
           ttft_slo_s: dict[str, float], max_batch: int) -> dict[int, SpecConfig]:
    """The controller's pick (an engine setting, its K schedule included) per measured concurrency, from these rows only."""
    candidates = tuple(dict.fromkeys(r["config"] for r in rows))
    ctl = Controller(ControllerSettings(candidates=candidates, initial=candidates[0],
                                        slo=SLOSettings(ttft_s=dict(ttft_slo_s)), schedule=ScheduleSettings(max_batch=max_batch)))
    for row in rows:
        for o in observations(row, max_tokens, rates_parallel if row["config"].parallel else rates_ar):
            ctl.observe(o)
    return {c: ctl.recommend(c).engine for c in sorted({r["concurrency"] for r in rows})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, nargs="+", help="tune logs; a (config, concurrency) row measured in several comes from the first")
    ap.add_argument("--max-tokens", type=int, default=64, help="the run's --max-tokens (greedy requests ran to it)")
    ap.add_argument("--config", default="bench/gpu/h200-qwen3-coder-dummy.toml", help="the run's TOML (synthetic rates, SLOs, max_num_seqs)")
    args = ap.parse_args(argv)
    rows = parse_rows("\n".join(log.read_text(errors="replace") for log in args.log))
    if not rows:
        print(f"no sweep rows in {', '.join(map(str, args.log))}", file=sys.stderr)
        return 2
    cfg = load_config(args.config)
    s = cfg.speculation
    picks = replay(rows, max_tokens=args.max_tokens, rates_ar=list(s.synthetic_acceptance_rates or []),
                   rates_parallel=list(s.synthetic_acceptance_rates_parallel or s.synthetic_acceptance_rates or []),
                   ttft_slo_s=dict(cfg.controller.ttft_slo_s), max_batch=cfg.engine.max_num_seqs)
    print("| config | concurrency | requests | TPOT ms | TTFT p50 ms | accepted length |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config'].label()} | {r['concurrency']} | {r['requests']} | {r['tpot_s'] * 1000:.2f} | {r['ttft_s'] * 1000:.1f} | {r['acceptance_length']:.2f} |")
    print("\ncontroller's pick per concurrency (measured configs only):")
    for c, pick in picks.items():
        best = min((r for r in rows if r["concurrency"] == c), key=lambda r: r["tpot_s"])
        print(f"  concurrency {c}: {pick.label()}   (lowest measured TPOT: {best['config'].label()}, {best['tpot_s'] * 1000:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
