"""Engine rebuilds of the controller's server and the requests that failed
while one was under way."""

from __future__ import annotations

from typing import Sequence

from quickdraft.bench.phases.timeline import Phase, Req, bucket, reqs_of

SWITCHING_STATES = ("switching", "restarting")  # ServerInfo.state while an engine is being (re)built


def rebuild_windows(decisions: Sequence[dict], samples: Sequence[Sequence], end_s: float) -> list[dict]:
    """When the server was building another engine: from each decision that
    is not a hold to the first poll sent after it that found the server no
    longer switching (the end of the run if none did); plus any polled stretch
    of switching/restarting that no decision explains (an engine restart),
    from the last poll that saw it serving to the first that saw it serving again."""
    wins = []
    for d in sorted(decisions, key=lambda d: d["t"]):
        if d["action"] == "hold":
            continue
        after = [s for s in samples if s[0] > d["t"] and s[2] not in SWITCHING_STATES]
        wins.append({"start_s": d["t"], "end_s": min(after[0][1], end_s) if after else end_s, "action": d["action"], "from": d["from"], "to": d["to"]})
    i = 0
    ordered = sorted(samples, key=lambda s: s[0])
    while i < len(ordered):
        if ordered[i][2] not in SWITCHING_STATES:
            i += 1
            continue
        j = i
        while j < len(ordered) and ordered[j][2] in SWITCHING_STATES:
            j += 1
        start = ordered[i - 1][1] if i > 0 else ordered[i][0]
        end = ordered[j][1] if j < len(ordered) else end_s
        if not any(w["start_s"] <= ordered[i][1] and ordered[i][0] <= w["end_s"] for w in wins):
            wins.append({"start_s": start, "end_s": end, "action": ordered[i][2], "from": ordered[i - 1][3] if i > 0 else "", "to": ordered[j][3] if j < len(ordered) else ""})
        i = j
    return sorted(wins, key=lambda w: w["start_s"])


def refused_as_invalid(r: Req) -> bool:
    """Refused for what it asked (e.g. a prompt over the limit): it fails the same on every config,
    at any time, so a rebuild did not lose it."""
    return r.outcome == "failed" and r.error.startswith("INVALID_ARGUMENT")


def failed_during(reqs: Sequence[Req], windows: Sequence[dict]) -> list[Req]:
    """Failed requests (any status but OK, not the client's own cancel, not refused as invalid) in
    flight during a rebuild window."""
    return [r for r in reqs if r.outcome == "failed" and not refused_as_invalid(r)
            and any(r.start_s <= w["end_s"] and r.end_s >= w["start_s"] for w in windows)]


def rebuild_accounting(run: dict, phases: Sequence[Phase]) -> dict:
    """Engine rebuilds per phase (GetControllerState's engine_rebuilds at the
    phase boundaries; the switch decisions it listed) and the requests that
    failed per phase and during rebuilds."""
    server = run.get("server") or {}
    reads = server.get("controller_reads") or []
    decisions = server.get("decisions") or []
    samples = server.get("samples") or []
    reqs = reqs_of(run) or []
    measured = [p for p in phases if p.measured]
    end_s = max([measured[-1].end_s] + [r.end_s for r in reqs]) if measured else 0.0

    def read(tag: str) -> int | None:
        r = next((r for r in reads if r["tag"] == tag), None)
        return None if r is None else r["engine_rebuilds"]

    marks = [read(f"phase {p.index} start") for p in measured] + [read("end")]
    windows = rebuild_windows(decisions, samples, end_s)
    during = failed_during(reqs, windows)
    groups = bucket(reqs, phases, 0.0)
    per_phase = []
    for i, p in enumerate(measured):
        a, b = marks[i], marks[i + 1]
        switches = [d for d in decisions if d["action"] != "hold" and p.start_s <= d["t"] < p.end_s]
        per_phase.append({
            "phase": p.index,
            "engine_rebuilds": None if a is None or b is None else b - a,
            "switch_decisions": len(switches),
            "failed": sum(r.outcome == "failed" for r in groups[p.index]["whole"]),
            "refused_as_invalid": sum(refused_as_invalid(r) for r in groups[p.index]["whole"]),
            "failed_during_rebuilds": sum(1 for r in during if p.start_s <= r.start_s < p.end_s),
        })
    total = None if marks[0] is None or marks[-1] is None else marks[-1] - marks[0]
    if total is None and all(x["engine_rebuilds"] is None for x in per_phase):
        total = sum(x["switch_decisions"] for x in per_phase)  # no reads: count the decisions
        source = "switch decisions (GetControllerState could not be read at the boundaries)"
    else:
        source = "GetControllerState engine_rebuilds at the phase boundaries"
    warmup = [d for d in decisions if d["action"] != "hold" and d["t"] < 0]
    return {
        "engine_rebuilds": total,
        "source": source,
        "switches_in_warmup": len(warmup),
        "per_phase": per_phase,
        "windows": windows,
        "failed": sum(x["failed"] for x in per_phase),
        "refused_as_invalid": sum(x["refused_as_invalid"] for x in per_phase),
        "failed_during_rebuilds": len([r for r in during if r.start_s >= 0]),
        "failed_during_rebuilds_examples": sorted({r.error for r in during})[:5],
    }


def combine_accounting(accs: Sequence[dict]) -> dict:
    """Rebuild accounting of several controller rounds, summed."""
    if len(accs) == 1:
        return accs[0]
    total = lambda key: None if any(a[key] is None for a in accs) else sum(a[key] for a in accs)  # noqa: E731
    per_phase = []
    for rows in zip(*(a["per_phase"] for a in accs)):
        per_phase.append({"phase": rows[0]["phase"], **{k: None if any(r[k] is None for r in rows) else sum(r[k] for r in rows)
                                                         for k in ("engine_rebuilds", "switch_decisions", "failed", "refused_as_invalid",
                                                                   "failed_during_rebuilds")}})
    return {
        "engine_rebuilds": total("engine_rebuilds"), "source": accs[0]["source"] + f", summed over {len(accs)} rounds",
        "switches_in_warmup": total("switches_in_warmup"), "per_phase": per_phase,
        "windows": [dict(w, round=i + 1) for i, a in enumerate(accs) for w in a["windows"]],
        "failed": total("failed"), "refused_as_invalid": total("refused_as_invalid"), "failed_during_rebuilds": total("failed_during_rebuilds"),
        "failed_during_rebuilds_examples": sorted({e for a in accs for e in a["failed_during_rebuilds_examples"]})[:5],
    }
