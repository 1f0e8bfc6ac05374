"""Static configs' figures from an earlier run: a phases.json, or a sweep.json's level at each phase's concurrency."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path

from quickdraft.bench.phases.timeline import STATIC_MODES, PhasesSpec
from quickdraft.bench.report import read_bytes
from quickdraft.bench.workload import WorkloadSpec

FIGURE_KEYS = ("mode", "concurrency", "wall_s", "requests", "completed", "cancelled", "failed", "failures", "ttft_ms", "tpot_ms",
               "tpot_ms_token_weighted", "e2e_ms", "output_tokens", "output_tokens_per_s", "mean_acceptance_length")


def load_statics(path: Path, spec: PhasesSpec, wspec: WorkloadSpec | None = None) -> tuple[list[dict], list[str]]:
    """Static configs' runs from an earlier phases.json, or from a sweep.json
    (its closed-loop level at each phase's concurrency; figures only, the same
    for the whole phase and its settled part), either gzipped as the results
    archive keeps them. (runs, notes)."""
    try:
        doc = json.loads(read_bytes(path))
    except (OSError, EOFError, gzip.BadGzipFile, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--statics-from {path}: cannot read it ({e})") from None
    notes = []
    date = doc.get("date", "?")
    runs = []
    if doc.get("benchmark") == "controller_phases":
        if list(doc["spec"]["concurrency"]) != list(spec.concurrency):
            raise ValueError(f"--statics-from {path}: its phases are {doc['spec']['concurrency']} streams, this run's {spec.concurrency}")
        theirs_clock = doc["spec"].get("clock", "client")
        if theirs_clock != spec.clock:
            raise ValueError(f"--statics-from {path}: timed on the {theirs_clock}'s clock, this run on the {spec.clock}'s "
                             f"(--clock {theirs_clock} compares with it)")
        for key, ours in (("phase_seconds", spec.phase_seconds), ("settle_s", spec.settle_s)):
            if doc["spec"].get(key) != ours:
                notes.append(f"statics from {path}: {key} {doc['spec'].get(key)} there, {ours} here")
        for r in doc["runs"]:
            if r.get("mode") in STATIC_MODES and r.get("phases") and not r.get("error"):
                src = r.get("source") or "this run"
                runs.append({**r, "source": f"{path} ({date})" if src == "this run" else src})
        theirs = doc.get("workload") or {}
    elif "sweep" in doc and "runs" in doc:
        for r in doc["runs"]:
            if r.get("mode") not in STATIC_MODES or not r.get("levels") or r.get("error"):
                continue
            ph = []
            for i, c in enumerate(spec.concurrency):
                lv = next((lv for lv in r["levels"] if lv.get("concurrency") == c and lv.get("mode", "closed") == "closed"), None)
                fig = None if lv is None else {k: lv.get(k) for k in FIGURE_KEYS}
                ph.append({"phase": i, "concurrency": c, "whole": fig, "settled": fig})
            runs.append({"label": r["label"], "mode": r["mode"], "k": r.get("k"), "source": f"{path} (sweep, {date})", "phases": ph})
        theirs = doc.get("workload") or {}
        notes.append(f"statics from the sweep {path} ({date}): each phase's figure is the sweep's closed-loop level at that concurrency "
                     "(a separate run of at most its --requests, after its own warm-up); no per-request timings, so settled = whole and "
                     "their TPOT is the same for every window")
    else:
        raise ValueError(f"--statics-from {path}: neither a phases.json nor a sweep.json")
    if wspec is not None and theirs:
        diffs = [f"{k} {theirs.get(k)!r} there, {v!r} here" for k, v in asdict(wspec).items()
                 if k in theirs and (list(v) if isinstance(v, tuple) else v) != theirs.get(k)]
        if diffs:
            notes.append(f"statics from {path}: another workload ({'; '.join(diffs)})")
    if not runs:
        notes.append(f"statics from {path}: no static config with figures in it")
    return runs, notes
