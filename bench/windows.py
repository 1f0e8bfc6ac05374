"""How well the controller's measurement windows rank configs: from the windows
a server wrote to ``controller.observations_file`` (pinned statics' windows
included), offline.

    quickdraft bench windows OBSERVATIONS.jsonl [...] [--pinned-only] [--min-load 6]
        [--reference PHASES.json] [--windows 1,2] [--rounds 2000] [--json OUT]

For each load level with at least two configs of at least three windows:

- each config's windows: how many, their token-weighted decode TPOT, and the
  spread of one window's log TPOT about its config's mean, raw and with the
  level's prefill rate taken out (``measure.prefill_adjust``: the slope of TPOT
  on prompt tokens prefilled per decode token, pooled over the configs);
- picks from few windows, as the controller makes them: over ``--rounds``
  draws of ``--windows`` windows per config, how often the config scored
  fastest (raw, and adjusted by the controller's own ``MeasuredPolicy.tpot``)
  is the fastest by the reference, and the mean regret of the pick (its
  reference TPOT over the fastest one's, minus 1).

The reference is each config's settled TPOT in the phases run given with
``--reference`` (its phase at the concurrency nearest the level; the mean
where two phases share it), which is what the controller is judged
against; without it, each config's mean over all its windows, which keeps
the arrivals and prefix-cache hits those windows caught (a config run
after others finds their prompts cached). Windows the moving load
discarded (unstable) are left out, as the controller leaves them out.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from quickdraft.bench.phases.timeline import STATIC_MODES
from quickdraft.bench.report import read_bytes
from quickdraft.server.config import ControllerSettings, MeasureSettings
from quickdraft.server.controller.measured import MeasuredPolicy, Window
from quickdraft.server.speculative import SpecConfig


def load_windows(paths: list[Path], pinned_only: bool = False) -> list[Window]:
    out = []
    for path in paths:
        for n, line in enumerate(read_bytes(path).decode().splitlines(), 1):
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            if "window" in d and (d.get("pinned") or not pinned_only):
                out.append(Window.from_dict(d["window"]))
    return out


def load_reference(path: Path) -> dict[SpecConfig, dict[int, float]]:
    """Static configs' settled TPOT (s) per concurrency from a ``bench phases`` phases.json."""
    doc = json.loads(read_bytes(path))
    if doc.get("benchmark") != "controller_phases":
        raise ValueError(f"--reference {path}: not a phases.json of quickdraft bench phases")
    out: dict[SpecConfig, dict[int, list[float]]] = {}
    for r in doc["runs"]:
        if r.get("mode") not in STATIC_MODES or r.get("error"):
            continue
        c = SpecConfig.off() if r["mode"] == "off" else SpecConfig(r["mode"] == "parallel", int(r["k"]))
        for ph in r.get("phases") or []:
            t = ((ph.get("settled") or {}).get("tpot_ms_token_weighted"))
            if t:
                out.setdefault(c, {}).setdefault(int(ph["concurrency"]), []).append(t / 1e3)
    return {c: {n: sum(v) / len(v) for n, v in per.items()} for c, per in out.items()}


def _policy(windows: list[Window], adjust: bool) -> MeasuredPolicy:
    """A policy that has filed ``windows`` (all at one time: none is stale)."""
    settings = ControllerSettings(measure=MeasureSettings(prefill_adjust=adjust, windows_kept=64))
    mp = MeasuredPolicy(settings)
    for w in windows:
        mp.observe(w, now=0.0)
    return mp


def _scores(windows: list[Window], adjust: bool) -> dict[tuple[int, SpecConfig], float]:
    mp = _policy(windows, adjust)
    return {(lvl, c): mp.tpot(c, cell, lvl) for (lvl, c), cell in mp.table.cells.items()}


def _log_spread(xs: list[float]) -> float:
    logs = [math.log(x) for x in xs if x > 0]
    return statistics.pstdev(logs) if len(logs) > 1 else 0.0


def analyse(windows: list[Window], draws: list[int], rounds: int, min_load: float = 0.0, seed: int = 0,
            statics: dict[SpecConfig, dict[int, float]] | None = None) -> dict:
    table = _policy([], adjust=True).table
    usable = [w for w in windows if w.decode_tokens > 0 and w.running > 0
              and w.stable(table.settings.measure.stable_ratio) and w.load >= min_load]
    by_level: dict[int, dict[SpecConfig, list[Window]]] = defaultdict(lambda: defaultdict(list))
    for w in usable:
        by_level[table.level(w.load)][w.config].append(w)
    rng = random.Random(seed)
    levels = []
    for lvl, per in sorted(by_level.items()):
        per = {c: ws for c, ws in per.items() if len(ws) >= 3}
        if len(per) < 2:
            continue
        load = table.load_of(lvl)
        means = {c: sum(w.decode_seconds for w in ws) / sum(w.decode_tokens for w in ws) for c, ws in per.items()}
        reference, source = means, "all windows"
        if statics:
            streams = min({n for fig in statics.values() for n in fig}, key=lambda n: abs(math.log(n / load)))
            per = {c: ws for c, ws in per.items() if streams in statics.get(c, {})}
            if len(per) < 2:
                continue
            reference = {c: statics[c][streams] for c in per}
            source = f"settled TPOT at {streams} stream{'s' if streams > 1 else ''}"
        every = [w for ws in per.values() for w in ws]
        best = min(reference, key=reference.__getitem__)
        full = _policy(every, adjust=True)
        slope, rate = full.table.prefill_slope(lvl), full.table.prefill_rate(lvl)
        configs = []
        for c, ws in sorted(per.items(), key=lambda kv: reference[kv[0]]):
            raw = [w.decode_seconds / w.decode_tokens for w in ws]
            adjusted = [t + slope * (rate - w.prefill_tokens / w.decode_tokens) for t, w in zip(raw, ws)]
            configs.append({"config": c.label(), "windows": len(ws), "tpot_ms": reference[c] * 1e3,
                            "windows_tpot_ms": means[c] * 1e3,
                            "spread_raw": _log_spread(raw), "spread_adjusted": _log_spread(adjusted)})
        picks = []
        for m in draws:
            hits = {False: 0, True: 0}
            regret = {False: 0.0, True: 0.0}
            for _ in range(rounds):
                sample = [w for ws in per.values() for w in rng.sample(ws, min(m, len(ws)))]
                for adjust in (False, True):
                    scores = {c: s for (_l, c), s in _scores(sample, adjust).items() if c in per}
                    pick = min(scores, key=scores.__getitem__)
                    hits[adjust] += pick == best
                    regret[adjust] += reference[pick] / reference[best] - 1.0
            picks.append({"windows_per_config": m,
                          **{f"{'adjusted' if a else 'raw'}_{k}": v for a in (False, True)
                             for k, v in (("best_share", hits[a] / rounds), ("mean_regret", regret[a] / rounds))}})
        levels.append({"load": load, "reference": source, "best": best.label(), "slope_ms": slope * 1e3, "prefill_rate": rate,
                       "configs": configs, "picks": picks})
    return {"windows": len(windows), "usable": len(usable), "rounds": rounds, "levels": levels}


def report(result: dict) -> str:
    lines = [f"{result['usable']} of {result['windows']} windows usable (load held still)"]
    for lv in result["levels"]:
        lines += ["", f"## load {lv['load']:.1f}: fastest by the reference ({lv['reference']}) {lv['best']}; "
                  f"prefill rate {lv['prefill_rate']:.2f} prompt tokens per decode token, slope {lv['slope_ms']:.3f} ms per unit", "",
                  "| config | windows | reference TPOT ms | windows' TPOT ms | spread of one window, raw | adjusted |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {c['config']} | {c['windows']} | {c['tpot_ms']:.2f} | {c['windows_tpot_ms']:.2f} | {c['spread_raw']:.3f} | "
                  f"{c['spread_adjusted']:.3f} |" for c in lv["configs"]]
        lines += ["", f"| windows per config | picks the fastest, raw | adjusted | mean regret of the pick, raw | adjusted |",
                  "|---:|---:|---:|---:|---:|"]
        lines += [f"| {p['windows_per_config']} | {p['raw_best_share']:.0%} | {p['adjusted_best_share']:.0%} | "
                  f"{p['raw_mean_regret']:+.1%} | {p['adjusted_mean_regret']:+.1%} |" for p in lv["picks"]]
    if not result["levels"]:
        lines.append("no load level with two configs of three windows or more")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="controller.observations_file outputs (JSON lines, gzipped or not)")
    p.add_argument("--pinned-only", action="store_true", help="only windows served under a pin (the statics of bench phases --one-server)")
    p.add_argument("--min-load", type=float, default=0.0, help="leave out windows below this many requests offered")
    p.add_argument("--windows", default="1,2", help="windows per config each simulated pick draws (comma-separated)")
    p.add_argument("--rounds", type=int, default=2000, help="simulated picks per count of windows")
    p.add_argument("--reference", type=Path, default=None,
                   help="a bench phases phases.json (gzipped or not): its statics' settled TPOT is the reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    try:
        draws = [int(x) for x in args.windows.split(",") if x]
        if not draws or min(draws) < 1 or args.rounds < 1:
            raise ValueError("--windows takes positive counts and --rounds a positive number")
        statics = load_reference(args.reference) if args.reference else None
        result = analyse(load_windows(args.files, args.pinned_only), draws, args.rounds, args.min_load, args.seed, statics)
    except (OSError, ValueError, KeyError) as e:
        print(f"quickdraft bench windows: {e}", file=sys.stderr)
        return 2
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0
