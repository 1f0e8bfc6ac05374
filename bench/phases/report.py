"""phases.md: the targets, the controller against the best static config per
phase, every config's figures, and the controller's switches."""

from __future__ import annotations

from typing import Sequence

from quickdraft.bench.phases.timeline import Phase, phase_at, schedule, streams
from quickdraft.bench.report import fmt


def _fmt(v, digits: int = 2, suffix: str = "") -> str:
    return fmt(v, digits, suffix)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.1f}%"


def _ci(v) -> str:
    return "-" if not v else f"[{100 * v[0]:+.0f}%, {100 * v[1]:+.0f}%]"


def _yes(v) -> str:
    return "-" if v is None else ("yes" if v else "**no**")


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _picks(picks: dict | None) -> str:
    """The cross-fit's pick per held-out round: one name when it is the same in every round."""
    if not picks:
        return "-"
    names = set(picks.values())
    return next(iter(names)) if len(names) == 1 else ", ".join(f"r{q} {lab}" for q, lab in picks.items())


def _n(v) -> str:
    return "?" if v is None else str(v)


def _repeats(doc: dict) -> str:
    """How many requests met a prompt seen before in their server's run (their phase ran past its tasks)."""
    counts = [sum((r.get("repeated_prompts") or {}).values()) for r in doc["runs"] if r.get("source", "this run") == "this run" and "repeated_prompts" in r]
    if not counts:
        return ""
    return f"; each phase has its own slice of the tasks, and {max(counts)} request(s) at most per server repeated a prompt (the phase ran past its slice)"


def server_clock_table(doc: dict, phases: Sequence[Phase]) -> list[str]:
    """Beside client-side figures, every config's mean per-request TPOT as the
    server timed it (its first to last generated token, from the final
    message): where text is held back (random weights) or a step has none
    (a stop token), the two clocks disagree, and by config. Nothing where the
    run is timed by the server already or no run has the figure."""
    if doc["spec"].get("clock") == "server":
        return []
    rows = []
    for run in doc["runs"]:
        cells = []
        for p in phases:
            ph = next((x for x in run.get("phases") or [] if x and x.get("phase") == p.index), None)
            cells.append((((ph or {}).get("settled") or {}).get("server_tpot_ms") or {}).get("mean"))
        if any(c is not None for c in cells):
            name = run["label"] + (f" (round {run['round']})" if run.get("round") else "")
            rows.append(f"| {name} | {' | '.join(_fmt(c) for c in cells)} |")
    if not rows:
        return []
    head = " | ".join(f"phase {p.index + 1}: {streams(p.concurrency)}" for p in phases)
    return ["## Every config on the server's clock: mean TPOT per request, ms (settled)", "",
            "The server's own figure per request, from its first to its last generated token: it counts steps whose "
            "text the client received late or not at all (held back, or a stop token), which the client-side figures "
            "above leave out. `--clock server` times the whole run this way.", "",
            f"| config | {head} |", "|---|" + "---|" * len(phases), *rows, ""]


def markdown(doc: dict) -> str:
    spec = doc["spec"]
    phases = [Phase(**p) for p in doc["phases"]]
    v = doc.get("verdicts") or {}
    w = doc["workload"]
    settle, tol = spec["settle_s"], spec["tolerance"]
    prof = doc.get("controller_profile")
    lines = [
        f"# quickdraft bench phases — {doc['date']}", "",
        f"Machine: {doc['machine']['hardware']}, load average at start {doc['machine']['load_average']}"
        + (f", at end {doc['machine_at_end']['load_average']}" if doc.get("machine_at_end") else "")
        + f"; vLLM {doc['versions']['vllm']}; quickdraft {doc['versions']['quickdraft']} ({doc['versions']['git']}).", "",
        f"Command: `{doc['command']}`", "",
        f"Load: closed loop, {' → '.join(streams(p.concurrency) for p in phases)}, {spec['phase_seconds']:.0f} s per phase, back to back "
        f"on one server per config (after {spec['warmup_requests']} warm-up request(s)). Workload: {w['tasks']} tasks from {w['source']}, "
        f"{w['single_line_share']:.0%} single-line, cancel share {w['cancel_share']:.0%}, chat share {w['chat_share']:.0%}, greedy; "
        "request k of phase p is the same for every config" + _repeats(doc) + ".", "",
        "TPOT is token-weighted (decode time / decode tokens, "
        + ("on the server's clock: its first to last generated token, per request" if spec.get("clock") == "server" else "client-side")
        + ") over the requests that *started* in the phase; "
        f"**settled** leaves out those that started in its first {settle:g} s. Regret = controller / best static − 1.",
    ]
    if v.get("regret_basis_note"):
        lines.append("")
        lines.append(f"Best static: {v['regret_basis_note']}.")
    if prof or any(r.get("mode") == "controller" for r in doc["runs"]):
        lines.append("")
        lines.append(f"Controller: {spec['controller_warmup_s']:.0f} s of load at {streams(spec['concurrency'][0])} before phase 1; "
                     + ("no profile (a cold start)" if not prof or prof.get("fresh")
                        else f"started from the profiles in {prof.get('copied_from')} ({', '.join(prof.get('files') or []) or 'none found: a cold start'})") + ".")
    lines.append("")
    if v.get("targets"):
        t, acc = v["targets"], v["controller"]
        per = v["phases"]
        xf = v.get("regret_basis") == "crossfit"  # the targets read the cross-fitted figures
        sfx, ci_key = ("_crossfit", "regret_crossfit_ci95") if xf else ("", "regret_ci95")
        basis_text = "the cross-fitted best static" if xf else "the minimum of the measured statics, upward-biased regret"
        miss = ", ".join(f"phase {r['phase'] + 1} {_pct(r['regret' + sfx])}" for r in per if r["within_tolerance" + sfx] is False)
        per_phase_rebuilds = ", ".join(f"phase {x['phase'] + 1}: {_n(x['engine_rebuilds'])}" for x in acc["per_phase"])
        within = t["within_tolerance_every_phase"]
        within_text = "-" if within is None else "met" if within else "**missed**" + (f" ({miss})" if miss else "")
        ruled = t.get("within_tolerance_not_ruled_out_every_phase")
        intervals = ", ".join(f"phase {r['phase'] + 1} {_ci(r.get(ci_key))}" for r in per) + (
            "" if ruled is None else f"; within {tol:.0%} " + ("not ruled out in any phase" if ruled else "**ruled out** in "
                                                               + ", ".join(f"phase {r['phase'] + 1}" for r in per
                                                                           if r.get(ci_key) and r[ci_key][0] > tol)))
        reached_text = ", ".join("never" if r["reached_s"] is None else _fmt(r["reached_s"], 0, " s") for r in per)
        lines += ["## Targets", "", "| target | result |", "|---|---|",
                  f"| every phase: controller TPOT within {tol:.0%} of the best static config (settled; {basis_text}) | {within_text} |",
                  f"| ... reached within {settle:g} s of the phase change | {_yes(t['reached_within_settle_every_phase'])} (from {reached_text}) |",
                  f"| ... what this run can resolve: regret's 95% bootstrap interval per phase | {intervals} |",
                  f"| engine rebuilds | {_n(acc['engine_rebuilds'])} ({per_phase_rebuilds}; {acc['switches_in_warmup']} switch(es) in the warm-up) |",
                  f"| requests failed during rebuilds (target 0) | {acc['failed_during_rebuilds']}{' ✓' if acc['failed_during_rebuilds'] == 0 else ''} "
                  f"(failed in all phases: {acc['failed']}, of which {acc.get('refused_as_invalid', 0)} refused as invalid, "
                  "e.g. a prompt over the limit, as on every config) |"]
        switch_ms = sorted(x for r in doc["runs"] if r.get("mode") == "controller"
                           for x in (r.get("server") or {}).get("live_switch_ms") or ())
        if switch_ms:
            lines.append(f"| live switches on the controller's server (pins included; the last 1,000) | {len(switch_ms)}: round trip "
                         f"p50 {_fmt(_quantile(switch_ms, 0.5))} ms, p99 {_fmt(_quantile(switch_ms, 0.99))} ms, "
                         f"max {_fmt(switch_ms[-1])} ms |")
        if v.get("ttft_slo_s") is not None:
            vs_f = t.get("within_tolerance_vs_feasible_every_phase")
            miss_f = ", ".join(f"phase {r['phase'] + 1} {_pct(r['regret_vs_feasible' + sfx])}" for r in per if r.get("within_tolerance_vs_feasible" + sfx) is False)
            lines.append(f"| every phase: within {tol:.0%} of the best static config that met the TTFT SLO ({1000 * v['ttft_slo_s']:.0f} ms p95; {basis_text}) "
                         f"| {'-' if vs_f is None else 'met' if vs_f else '**missed**' + (f' ({miss_f})' if miss_f else '')} |")
        lines.append("")
    if v.get("phases"):
        xf = v.get("regret_basis") == "crossfit"
        lines += ["## Controller vs the best static config, per phase", "",
                  "Min of measured: the static with the lowest TPOT, picked and measured on the same requests (biased low, "
                  "so its regret is biased high). Cross-fitted (two or more rounds): for each round, the static with the lowest TPOT "
                  "on the other rounds, measured on that round (picks by held-out round). "
                  f"Within {tol:.0%} and from when: against the {'cross-fitted' if xf else 'min of measured'} figure, as the targets.", "",
                  f"| phase | load | min of measured statics (settled) | its TPOT ms | controller TPOT ms | regret vs min settled | 95% interval "
                  f"| cross-fitted best static | its TPOT ms | regret cross-fitted | 95% interval | best static (whole) | regret whole "
                  f"| within {tol:.0%} | within {tol:.0%} from | {v['seed_config']} TPOT ms | controller / {v['seed_config']} settled | whole |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in v["phases"]:
            lines.append(f"| {r['phase'] + 1} | {streams(r['concurrency'])} | {r['best_static'] or '-'} | {_fmt(r['best_static_tpot_ms'])} "
                         f"| {_fmt(r['controller_tpot_ms'])} | {_pct(r['regret'])} | {_ci(r.get('regret_ci95'))} "
                         f"| {_picks(r.get('best_static_crossfit_picks'))} | {_fmt(r.get('best_static_crossfit_tpot_ms'))} "
                         f"| {_pct(r.get('regret_crossfit'))} | {_ci(r.get('regret_crossfit_ci95'))} | {r['best_static_whole'] or '-'} | {_pct(r['regret_whole'])} "
                         f"| {_yes(r['within_tolerance_crossfit' if xf else 'within_tolerance'])} "
                         f"| {_fmt(r['reached_s'], 0, ' s') if r['reached_s'] is not None else '-'} "
                         f"| {_fmt(r['seed_tpot_ms'])} | {_fmt(r['controller_vs_seed'], 3, 'x')} | {_fmt(r['controller_vs_seed_whole'], 3, 'x')} |")
        lines.append("")
        if v.get("ttft_slo_s") is not None:
            lines += [f"Within the inline TTFT SLO ({1000 * v['ttft_slo_s']:.0f} ms at p95, settled), the SLO the controller works under:", "",
                      "| phase | min of measured statics within the SLO | its TPOT ms | regret vs min | cross-fitted best within the SLO "
                      "| its TPOT ms | regret cross-fitted | controller TTFT p95 ms | static TTFT p95 ms |", "|---|---|---|---|---|---|---|---|---|"]
            for r in v["phases"]:
                p95s = ", ".join(f"{k} {_fmt(x, 0)}" for k, x in (r.get("static_ttft_p95_ms") or {}).items())
                lines.append(f"| {r['phase'] + 1} | {r.get('best_feasible_static') or 'none'} | {_fmt(r.get('best_feasible_static_tpot_ms'))} "
                             f"| {_pct(r.get('regret_vs_feasible'))} | {_picks(r.get('best_feasible_static_crossfit_picks'))} "
                             f"| {_fmt(r.get('best_feasible_static_crossfit_tpot_ms'))} | {_pct(r.get('regret_vs_feasible_crossfit'))} "
                             f"| {_fmt(r.get('controller_ttft_p95_ms'), 0)} | {p95s} |")
            lines.append("")
        per_round = [r for r in v["phases"] if r.get("rounds")]
        if per_round:
            lines += ["Round by round (the controller's round i against round i of the min-of-measured static, settled): "
                      + "; ".join(f"phase {r['phase'] + 1}: " + ", ".join(
                          f"{_fmt(c)} vs {_fmt(b)} ms ({_pct(g)})" for c, b, g in
                          zip(r["rounds"]["controller_tpot_ms"], r["rounds"]["best_static_tpot_ms"], r["rounds"]["regret"])) for r in per_round) + ".", ""]
    head = " | ".join(f"phase {p.index + 1}: {streams(p.concurrency)}" for p in phases)
    lines += ["## Every config: token-weighted TPOT ms per phase (settled / whole), requests done / failed", "",
              f"| config | {head} | source |", "|---|" + "---|" * len(phases) + "---|"]
    best = {r["phase"]: r["best_static"] for r in v.get("phases", [])}
    for run in doc["runs"]:
        if not run.get("phases"):
            continue
        cells = []
        for p in phases:
            ph = next((x for x in run["phases"] if x and x.get("phase") == p.index), None)
            if ph is None or ph.get("whole") is None:
                cells.append("-")
                continue
            s, wh = ph["settled"] or {}, ph["whole"]
            cell = f"{_fmt(s.get('tpot_ms_token_weighted'))} / {_fmt(wh.get('tpot_ms_token_weighted'))} ({wh.get('completed', '-')} / {wh.get('failed', '-')})"
            cells.append(f"**{cell}**" if best.get(p.index) == run["label"] else cell)
        name = run["label"] + (f" (round {run['round']})" if run.get("round") else "")
        lines.append(f"| {name} | {' | '.join(cells)} | {run.get('source', 'this run')} |")
    lines += ["", "Bold: the static config with the lowest TPOT of the phase (settled, all rounds pooled).", ""]
    lines += server_clock_table(doc, phases)
    for ctl in [r for r in doc["runs"] if r.get("mode") == "controller" and r.get("server")]:
        decisions = [d for d in ctl["server"]["decisions"] if d["action"] != "hold"]
        lines += ["## The controller's engine switches" + (f" (round {ctl['round']})" if ctl.get("round") else ""), ""]
        if decisions:
            lines += ["| t (s) | phase | action | from → to | reason |", "|---|---|---|---|---|"]
            for d in decisions:
                p = phase_at(d["t"], schedule(spec["concurrency"], spec["phase_seconds"], spec["controller_warmup_s"]))
                lines.append(f"| {d['t']:.1f} | {p.name() if p else '-'} | {d['action']} | {d['from']} → {d['to']} | {d['reason'][:160]} |")
        else:
            lines.append("None: the controller kept its start config throughout.")
        acc = (v.get("controller") or {})
        windows = [x for x in acc.get("windows") or [] if x.get("round") == ctl.get("round")]
        if windows:
            live = not acc.get("engine_rebuilds")
            lines += ["", ("Switch windows (decision → first poll that saw the new config; all live, no engine was rebuilt): " if live
                           else "Rebuild windows (decision → first poll that found the server serving again): ")
                      + "; ".join(f"{x['start_s']:.1f}-{x['end_s']:.1f} s ({x['from']} → {x['to']})" for x in windows) + "."]
        if ctl["server"].get("errors"):
            lines += ["", "Polling errors: " + "; ".join(ctl["server"]["errors"][:5])]
        lines.append("")
    notes = list(doc.get("notes", []))
    notes += [f"{r['label']}: {r.get('skipped') or r.get('error') or r.get('warning')}" for r in doc["runs"] if r.get("skipped") or r.get("error") or r.get("warning")]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
