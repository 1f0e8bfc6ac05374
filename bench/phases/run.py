"""Measuring: every config on its own freshly started server, the phases
back to back under a closed loop, the server watched meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from quickdraft.bench import report, servers
from quickdraft.bench.figures import summarize_run
from quickdraft.bench.loadgen import GrpcTarget, Result, RunOutcome, RunSpec, send_safely
from quickdraft.bench.phases.analysis import verdicts
from quickdraft.bench.phases.plot import plot
from quickdraft.bench.phases.rebuilds import rebuild_accounting
from quickdraft.bench.phases.report import markdown
from quickdraft.bench.phases.statics import load_statics
from quickdraft.bench.phases.timeline import (
    REQ_COLUMNS,
    Phase,
    PhasesSpec,
    Req,
    bucket,
    known_configs,
    phase_at,
    repeated_prompts,
    schedule,
    streams,
    task_slices,
)
from quickdraft.bench.phases.watch import ServerWatch
from quickdraft.bench.sweep import SweepConfig, controller_available
from quickdraft.bench.workload import Planned, Workload, WorkloadSpec


def on_server_clock(r: Result) -> Result:
    """``r`` with its first token and decoding timed by the server (PhasesSpec.clock)."""
    if r.outcome != "ok":
        return r
    decode = None if r.server_tpot_s is None or r.tokens < 2 else r.server_tpot_s * (r.tokens - 1)
    return dataclasses.replace(r, ttft_s=r.server_ttft_s, decode_s=decode)


async def drive(target, workload: Workload, phases: Sequence[Phase], slices: dict[int, tuple[int, int]], origin: float,
                on_request: Callable[[Result, Req], None] | None = None, clock: str = "client") -> list[tuple[Result, Req]]:
    """A closed loop whose concurrency follows ``phases`` without a pause:
    slot j sends while the current phase has more than j streams, and sleeps
    (after its request in flight ends) while it has not. Nothing is sent after
    the last phase; requests in flight then finish. Times are relative to
    ``origin`` (a perf_counter value: the first measured phase's start);
    ``clock`` says whose clock times each request (PhasesSpec.clock)."""
    out: list[tuple[Result, Req]] = []
    counters = {p.index: 0 for p in phases}
    end = phases[-1].end_s

    def now() -> float:
        return time.perf_counter() - origin

    async def slot(j: int) -> None:
        while True:
            t = now()
            if t >= end:
                return
            p = phase_at(t, phases)
            if p is None:  # before the first phase
                await asyncio.sleep(max(0.001, phases[0].start_s - t))
                continue
            if j >= p.concurrency:
                nxt = next((q for q in phases if q.start_s >= p.end_s and j < q.concurrency), None)
                if nxt is None:
                    return
                await asyncio.sleep(max(0.001, nxt.start_s - t))
                continue
            k = counters[p.index]
            counters[p.index] += 1
            planned = workload.planned(slices[p.index][0] + k)
            t0 = now()
            r = await send_safely(target, planned, origin)
            if clock == "server":
                r = on_server_clock(r)
            q = Req.from_result(r, t0, now())
            out.append((r, q))
            if on_request is not None:
                on_request(r, q)

    await asyncio.gather(*(slot(j) for j in range(max(p.concurrency for p in phases))))
    return sorted(out, key=lambda x: x[1].start_s)


def _figures(results: list[Result], concurrency: int, wall_s: float) -> dict:
    fig = summarize_run(RunOutcome(RunSpec(concurrency=concurrency), sorted(results, key=lambda r: r.index), max(wall_s, 1e-9)))
    fig.pop("histograms", None)  # every request's timing is kept in the run's "requests"
    return fig


def phase_figures(pairs: Sequence[tuple[Result, Req]], phases: Sequence[Phase], settle_s: float) -> list[dict]:
    """Per measured phase: the load generator's figures over the whole phase and over its settled part."""
    # (Workload indices can repeat across phases: bucket the pairs themselves.)
    groups = bucket(pairs, phases, settle_s, start=lambda pair: pair[1].start_s)
    out = []
    for p in phases:
        if not p.measured:
            continue
        g = groups[p.index]
        out.append({
            "phase": p.index,
            "concurrency": p.concurrency,
            "whole": _figures([r for r, _ in g["whole"]], p.concurrency, p.seconds),
            "settled": _figures([r for r, _ in g["settled"]], p.concurrency, p.seconds - settle_s),
        })
    return out


@dataclass
class Started:
    argv: list[str]
    log_path: str | None
    address: str = ""
    start_s: float | None = None
    obj: object = None


class SubprocessLauncher:
    """``quickdraft serve`` as a child process per config (bench/servers.py)."""

    def __init__(self, spec: PhasesSpec, log_dir: Path):
        self.spec = spec
        self.log_dir = log_dir
        self.started: dict[str, int] = {}

    def create(self, conf: SweepConfig, overrides: dict[str, str]) -> Started:
        n = self.started[conf.label] = self.started.get(conf.label, 0) + 1
        name = conf.label if n == 1 else f"{conf.label}.{n}"  # one log per server, rounds included
        s = servers.quickdraft_server(name, {**self.spec.overrides, **dict(conf.overrides), **overrides}, self.log_dir, preset=self.spec.preset,
                                      config=self.spec.config)
        return Started(argv=s.argv, log_path=str(s.log_path), address=f"127.0.0.1:{s.port}", obj=s)

    async def launch(self, h: Started) -> None:
        h.obj.launch(servers.server_env(offline=self.spec.preset in (None, "embedded")))
        await servers.wait_grpc_serving(h.obj)
        h.start_s = h.obj.start_s

    async def stop(self, h: Started):
        await asyncio.to_thread(h.obj.stop)
        return h.obj.exit_code


class Progress:
    """A time-based progress bar over all configs' load seconds (engine starts not included)."""

    def __init__(self, total_s: float, show: bool = True):
        from tqdm import tqdm

        # Into a log file (not a terminal) a line every 30 s, not every half second.
        self.bar = tqdm(total=max(1, round(total_s)), unit="s", desc="phases", disable=not show, dynamic_ncols=True,
                        mininterval=0.5 if sys.stderr.isatty() else 30.0,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s of load [{elapsed}<{remaining}{postfix}]")
        self.done_s = 0.0
        self.counts = {"ok": 0, "cancelled": 0, "failed": 0}

    def note(self, msg: str) -> None:
        self.bar.set_description_str(msg[:48])
        self.bar.write(f"[{time.strftime('%H:%M:%S')}] {msg}")

    def request(self, r: Result, q: Req) -> None:
        self.counts[r.outcome if r.outcome in self.counts else "failed"] += 1

    async def follow(self, label: str, phases: Sequence[Phase], origin: float) -> None:
        first = phases[0].start_s
        span = phases[-1].end_s - first
        while True:
            t = time.perf_counter() - origin
            p = phase_at(t, phases)
            if p is not None:
                self.bar.set_description_str(f"{label} {p.name()} ({streams(p.concurrency)})", refresh=False)
            self.bar.set_postfix_str(f"{self.counts['ok']} done, {self.counts['failed']} failed", refresh=False)
            self.bar.update(max(0, min(self.bar.total, round(self.done_s + min(span, max(0.0, t - first)))) - self.bar.n))
            await asyncio.sleep(0.5)

    def finish_config(self, seconds: float) -> None:
        self.done_s += seconds
        self.bar.update(max(0, min(self.bar.total, round(self.done_s)) - self.bar.n))

    def close(self) -> None:
        self.bar.close()


async def measure_config(conf: SweepConfig, spec: PhasesSpec, workload: Workload, launcher, ui: Progress, profile_dir: str | None = None) -> dict:
    """Start conf's server, warm it up, run the phases back to back while polling its state, stop it; the run's record."""
    is_ctl = conf.mode == "controller"
    row: dict = {"label": conf.label, "mode": conf.mode, "k": conf.k, "overrides": dict(conf.overrides), "source": "this run", "phases": []}
    extra = {"controller.profile_dir": profile_dir} if is_ctl and profile_dir else {}
    if extra:
        row["controller_profile_dir"] = profile_dir
    row["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    h = launcher.create(conf, extra)
    row["argv"], row["server_log"] = h.argv, h.log_path
    warm_s = spec.controller_warmup_s if is_ctl else 0.0
    phases = schedule(spec.concurrency, spec.phase_seconds, warm_s)
    ui.note(f"{conf.label}: starting server")
    try:
        await launcher.launch(h)
        row["server_start_s"] = None if h.start_s is None else round(h.start_s, 1)
        ui.note(f"{conf.label}: serving after {h.start_s or 0:.0f} s" + (f"; {warm_s:g} s of load before phase 1 (the controller explores)" if warm_s else ""))
        target = GrpcTarget(h.address)
        await target.open()
        watch = None
        try:
            warm_fail = 0
            for i in range(spec.warmup_requests):
                p = workload.planned(-1 - i)
                r = await send_safely(target, Planned(p.index, p.task, p.latency_class, None), time.perf_counter())
                warm_fail += r.outcome != "ok"
            row["warmup_failures"] = warm_fail
            origin = time.perf_counter() + warm_s
            watch = ServerWatch(h.address, origin, spec.poll_s, spec.state_every_s, controller=is_ctl)
            await watch.open()
            await watch.read_state("before")
            stop = asyncio.Event()
            tasks = [asyncio.create_task(watch.run(stop)), asyncio.create_task(watch.at_boundaries(phases))]
            follower = asyncio.create_task(ui.follow(conf.label, phases, origin))
            try:
                slices = task_slices(len(workload.tasks), phases)
                pairs = await drive(target, workload, phases, slices, origin, on_request=ui.request, clock=spec.clock)
                await tasks[1]
                stop.set()
                await tasks[0]
                await watch.read_state("end")
            finally:
                for t in (*tasks, follower):
                    t.cancel()
            row["wall_s"] = round(time.perf_counter() - origin + warm_s, 2)
            row["phases"] = phase_figures(pairs, phases, spec.settle_s)
            row["warmup_phase"] = None if not warm_s else {"seconds": warm_s, "requests": sum(q.start_s < 0 for _, q in pairs),
                                                            "failed": sum(q.start_s < 0 and q.outcome == "failed" for _, q in pairs)}
            row["requests"] = {"columns": REQ_COLUMNS, "rows": [q.row() for _, q in pairs]}
            row["repeated_prompts"] = repeated_prompts([q for _, q in pairs], phases, slices)
            row["server"] = watch.to_dict()
            row["engine_configs_seen"] = sorted({s[3] for s in watch.samples})
            if not is_ctl and row["engine_configs_seen"] and row["engine_configs_seen"] != [conf.label]:
                row["warning"] = f"the server reported running {', '.join(row['engine_configs_seen'])}, not {conf.label}"
            row["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            if is_ctl:
                row["controller"] = rebuild_accounting(row, phases)
            figs = ", ".join(f"{x['concurrency']}: {report.fmt(x['settled']['tpot_ms_token_weighted'], 2)} ms" for x in row["phases"])
            ui.note(f"{conf.label}: TPOT settled per phase {figs}; {sum(x['whole']['failed'] for x in row['phases'])} failed")
        finally:
            await target.close()
            if watch is not None:
                await watch.close()
    except Exception as e:  # noqa: BLE001 - one config failing must not lose the others
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
        ui.note(f"{conf.label}: FAILED: {row['error'][:300]}")
    finally:
        row["server_exit_code"] = await launcher.stop(h)
        ui.finish_config(sum(p.seconds for p in phases))
    return row


def inline_slo_s(spec: PhasesSpec) -> float | None:
    """The inline TTFT SLO (p95, s) the controller's server runs under: its default, or what
    ``--set controller.ttft_slo_s=...`` made it (the phases' requests are all inline)."""
    from quickdraft.server.config import load_config

    return load_config(spec.config, env={}, overrides=spec.overrides).controller.ttft_slo_s.get("inline")


def run_bench(spec: PhasesSpec, wspec: WorkloadSpec, out: Path, show_progress: bool = True, launcher=None) -> dict:
    spec.validate()
    known = known_configs()
    unknown = [c for c in spec.configs if c not in known]
    if unknown:
        raise ValueError(f"unknown configs {unknown}; choose from {', '.join(known)}")
    if not spec.configs and not spec.statics_from:
        raise ValueError("nothing to measure: give --configs or --statics-from")
    workload = Workload.from_spec(wspec)
    out.mkdir(parents=True, exist_ok=True)
    phases = schedule(spec.concurrency, spec.phase_seconds)
    doc: dict = {**report.header(), "benchmark": "controller_phases", "spec": asdict(spec), "workload": {**workload.describe(), "source": wspec.source},
                 "phases": [p.to_dict() for p in phases], "runs": [], "notes": []}
    loaded: list[dict] = []
    for f in spec.statics_from:
        runs, notes = load_statics(Path(f), spec, wspec)
        loaded += runs
        doc["notes"] += notes
    ok, why = controller_available()
    confs = []
    for label in spec.configs:
        if label == "controller" and not ok:
            doc["runs"].append({"label": "controller", "mode": "controller", "k": None, "phases": [], "skipped": why})
            continue
        confs.append(known[label])
    src = None
    if spec.controller_profile_dir and any(c.mode == "controller" for c in confs):
        src = Path(spec.controller_profile_dir).expanduser()
        if not src.is_dir():
            raise ValueError(f"--controller-profile-dir {src}: not a directory")

    def fresh_profile_dir() -> str:
        # The controller starts cold (or from copies of --controller-profile-dir's profiles), every
        # round alike, and writes nothing into the user's cache or that directory.
        d = tempfile.mkdtemp(prefix="controller-profile-", dir=out)
        copied = []
        for f in sorted(src.glob("*.json")) if src else ():
            shutil.copy2(f, d)
            copied.append(f.name)
        doc["controller_profile"] = {"dir": d, "fresh": src is None, "copied_from": spec.controller_profile_dir, "files": copied}
        return d

    if launcher is None and spec.one_server:
        from quickdraft.bench.phases.shared import SharedServerLauncher

        launcher = SharedServerLauncher(spec, out / "logs", fresh_profile_dir())
    launcher = launcher or SubprocessLauncher(spec, out / "logs")
    total = spec.rounds * sum(len(spec.concurrency) * spec.phase_seconds + (spec.controller_warmup_s if c.mode == "controller" else 0) for c in confs)
    ui = Progress(total, show_progress)
    t0 = time.time()
    try:
        for rnd in range(spec.rounds):
            for conf in confs if rnd % 2 == 0 else confs[::-1]:
                profile_dir = fresh_profile_dir() if conf.mode == "controller" and not spec.one_server else None
                row = asyncio.run(measure_config(conf, spec, workload, launcher, ui, profile_dir))
                if spec.rounds > 1:
                    row["round"] = rnd + 1
                doc["runs"].append(row)
                doc["wall_s"] = round(time.time() - t0, 1)
                report.write_json(out / "phases.json", doc)
    finally:
        ui.close()
        close = getattr(launcher, "close", None)
        if close is not None:
            doc["one_server"] = {"exit_code": close(), "pins": launcher.pins}
    measured = {r["label"] for r in doc["runs"] if r.get("phases")}
    taken_from: dict[str, str] = {}  # label -> the file its runs come from (all its rounds there)
    for r in loaded:
        if r["label"] in measured:
            doc["notes"].append(f"{r['label']}: measured in this run; the one from {r['source']} is left out")
            continue
        if taken_from.setdefault(r["label"], r["source"]) != r["source"]:
            continue  # an earlier file has this config
        doc["runs"].append(r)
    doc["machine_at_end"] = report.machine()
    doc["verdicts"] = verdicts(doc["runs"], phases, spec.settle_s, spec.tolerance, spec.seed_config, inline_slo_s(spec))
    where = ("on one server (--one-server): each static pinned on its live engine (PinSpeculation; K up to speculation.max_k), "
             "then the pin released for the controller; a pin that needed another engine rebuilt it (one_server.pins)"
             if spec.one_server else "each on a freshly started server")
    doc["notes"].append(f"Configs ran one after another, {where}; machine noise between them is not averaged out "
                        "(load averages before and after each are in phases.json)." if spec.rounds == 1 else
                        f"Configs ran one after another, {where}, in {spec.rounds} rounds (order reversed every other "
                        "round); a config's figures pool its requests over the rounds, and the per-round figures show the machine's noise.")
    report.write_json(out / "phases.json", doc)
    (out / "phases.md").write_text(markdown(doc))
    plot(doc, out / "phases.png")
    return doc
