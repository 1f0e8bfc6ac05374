"""The sweep: every speculative config x every concurrency on this machine,
with upstream ``vllm serve`` alongside on the same model and workload.

Configs: speculation off, autoregressive EAGLE-3 K in {1,3,5,7}, P-EAGLE K in
{1,3,5,7}, the adaptive controller (when the server has it), and the peer:
``vllm serve`` with the seed's config ``{"method": "eagle3",
"num_speculative_tokens": 5, "parallel_drafting": true}`` over
OpenAI-compatible HTTP streaming. Each config gets its own freshly started
server (engine starts dominate: 20-45 s each on 2 cores), which then serves
all concurrency levels, lowest first. Every level sends different requests
(so the engine's prefix cache cannot replay an earlier level), and the same
requests as the same level of every other config.

Output (``--out``, default bench/results/sweep): sweep.json (machine,
versions, workload, configs, all figures, ratios), sweep.md (tables),
tpot_vs_k.png, ttft_vs_k.png, vs_concurrency.png, and the servers' logs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from quickdraft.bench import report, servers
from quickdraft.bench.figures import summarize_run
from quickdraft.bench.loadgen import GrpcTarget, OpenAITarget, RunSpec, run_load
from quickdraft.bench.stats import ratio
from quickdraft.bench.workload import Workload, WorkloadSpec

KS = (1, 3, 5, 7)
CONCURRENCY = (1, 4, 8, 16)
# The seed's config, and what `vllm serve` users run with a P-EAGLE head (anchors.md).
PEER_SPECULATIVE = {"method": "eagle3", "num_speculative_tokens": 5, "parallel_drafting": True}
PEER_TWIN = "p5"  # our config that matches the peer's


@dataclass(frozen=True)
class SweepConfig:
    label: str
    mode: str  # off | autoregressive | parallel | controller | peer
    k: int | None = None
    overrides: tuple[tuple[str, str], ...] = ()


def all_configs() -> list[SweepConfig]:
    out = [SweepConfig("off", "off", 0, (("speculation.enabled", "false"),))]
    for mode, short, parallel in (("autoregressive", "ar", "false"), ("parallel", "p", "true")):
        for k in KS:
            # A static config is an engine built for it, as `vllm serve` runs it, not a live engine pinned to it.
            out.append(SweepConfig(f"{short}{k}", mode, k, (("speculation.enabled", "true"), ("speculation.parallel_drafting", parallel),
                                                            ("speculation.num_speculative_tokens", str(k)), ("speculation.live_switching", "false"))))
    out.append(SweepConfig("controller", "controller", None, (("controller.enabled", "true"),)))
    out.append(SweepConfig("vllm-serve", "peer", PEER_SPECULATIVE["num_speculative_tokens"]))
    return out


def controller_available() -> tuple[bool, str]:
    """The server's controller loop is being integrated; without it, controller.enabled fails at start."""
    try:
        found = importlib.util.find_spec("quickdraft.server.controller_loop") is not None
    except (ImportError, ValueError) as e:
        return False, f"quickdraft.server.controller_loop cannot be imported ({e})"
    return (True, "") if found else (False, "quickdraft.server.controller_loop is not importable yet (the controller is not integrated in the server)")


@dataclass
class SweepSpec:
    configs: list[str] = field(default_factory=lambda: [c.label for c in all_configs()])
    concurrency: list[int] = field(default_factory=lambda: list(CONCURRENCY))
    requests: int = 48  # per level (at least 4 x the concurrency)
    level_seconds: float = 120.0  # stop sending after this, per level
    warmup_requests: int = 3
    controller_warmup_s: float = 60.0  # load before the controller's measured levels: it explores first
    preset: str | None = None  # None: embedded
    overrides: dict[str, str] = field(default_factory=dict)  # --set for every quickdraft server (and the peer's batch size)
    slo_s: dict[str, float] = field(default_factory=dict)

    def level_requests(self, c: int) -> int:
        return max(self.requests, 4 * c)


def quickdraft_defaults(preset: str | None, overrides: dict[str, str] | None = None):
    """The configuration the sweep's quickdraft servers run with (the peer copies model, context and batch size from it)."""
    from quickdraft.server.config import load_config

    return load_config(env={}, overrides={**(overrides or {}), **({"model.preset": preset} if preset else {})})


def peer_server(cfg, log_dir: Path) -> servers.ServerProcess:
    return servers.vllm_peer(
        "vllm-serve", cfg.target_path(), cfg.drafter_path(True), PEER_SPECULATIVE, log_dir,
        served_name=cfg.preset.name, max_model_len=cfg.max_model_len(), max_num_seqs=cfg.engine.max_num_seqs,
        cpu=cfg.device() == "cpu",
        extra_args=["--tensor-parallel-size", str(cfg.engine.tensor_parallel_size)] if cfg.engine.tensor_parallel_size > 1 else None,
    )


def stop_token_ids(target: str) -> list[int]:
    """The ids quickdraft's engine stops on (prompt_format.STOP_TOKENS), for the peer's requests."""
    from transformers import AutoTokenizer

    from quickdraft import prompt_format

    return prompt_format.stop_token_ids(AutoTokenizer.from_pretrained(target).get_vocab())


async def measure_config(conf: SweepConfig, spec: SweepSpec, workload: Workload, log_dir: Path, progress: Callable, note: Callable[[str], None]) -> dict:
    """Start conf's server, run every concurrency level, stop it; the run's record."""
    cfg = quickdraft_defaults(spec.preset, spec.overrides)
    row: dict = {"label": conf.label, "mode": conf.mode, "k": conf.k, "overrides": dict(conf.overrides), "levels": []}
    if conf.mode == "peer":
        server = peer_server(cfg, log_dir)
        target = OpenAITarget(f"http://127.0.0.1:{server.port}", model=cfg.preset.name, render_fim=True, stop_token_ids=stop_token_ids(cfg.target_path()))
        row["speculative_config"] = server.extra["speculative_config"]
    else:
        server = servers.quickdraft_server(conf.label, {**spec.overrides, **dict(conf.overrides)}, log_dir, preset=spec.preset)
        target = GrpcTarget(f"127.0.0.1:{server.port}")
    row["argv"] = server.argv
    row["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    note(f"{conf.label}: starting server")
    server.launch(servers.server_env(offline=cfg.model.preset == "embedded"))
    try:
        if conf.mode == "peer":
            await servers.wait_http_ready(server)
        else:
            await servers.wait_grpc_serving(server)
        row["server_start_s"] = round(server.start_s, 1)
        note(f"{conf.label}: serving after {server.start_s:.0f} s")
        await target.open()
        try:
            if conf.mode == "controller" and spec.controller_warmup_s > 0:
                note(f"{conf.label}: {spec.controller_warmup_s:.0f} s of load before measuring (the controller explores first)")
                await run_load(target, workload, RunSpec(concurrency=1, max_requests=100_000, duration_s=spec.controller_warmup_s, warmup_requests=0, offset=500_000))
            offset = 0
            for i, c in enumerate(spec.concurrency):
                n = spec.level_requests(c)
                before = await servers.scrape_spec_counters(server.port) if conf.mode == "peer" else None
                run = await run_load(target, workload, RunSpec(concurrency=c, max_requests=n, duration_s=spec.level_seconds, warmup_requests=spec.warmup_requests if i == 0 else 0, offset=offset), progress)
                offset += n
                fig = summarize_run(run, spec.slo_s)
                if before:
                    after = await servers.scrape_spec_counters(server.port)
                    drafts = after.get("drafts", 0) - before.get("drafts", 0)
                    # Engine-wide counters: they include the steps of cancelled requests too.
                    fig["mean_acceptance_length"] = round(1 + (after.get("accepted", 0) - before.get("accepted", 0)) / drafts, 3) if drafts else None
                fig["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
                row["levels"].append(fig)
        finally:
            await target.close()
    except Exception as e:  # noqa: BLE001 - one config failing must not lose the others
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
        note(f"{conf.label}: FAILED: {row['error'][:300]}")
    finally:
        server.stop()
        row["server_exit_code"] = server.exit_code
        row["server_log"] = str(server.log_path)
    return row


def comparisons(runs: list[dict]) -> dict:
    """quickdraft against the peer per concurrency (ratios < 1: quickdraft is faster), and the best config per level."""
    by_label = {r["label"]: r for r in runs if r.get("levels")}
    peer = next((r for r in runs if r["mode"] == "peer" and r.get("levels")), None)

    def level(r: dict, c: int) -> dict | None:
        return next((lv for lv in r["levels"] if lv["concurrency"] == c), None)

    out: dict = {"vs_peer": [], "best": []}
    levels = sorted({lv["concurrency"] for r in by_label.values() for lv in r["levels"]})
    ours = [r for r in by_label.values() if r["mode"] != "peer"]
    for c in levels:
        candidates = [(r, level(r, c)) for r in ours if r["mode"] != "controller"]
        candidates = [(r, lv) for r, lv in candidates if lv and lv["tpot_ms_token_weighted"]]
        best = min(candidates, key=lambda x: x[1]["tpot_ms_token_weighted"], default=None)
        if best:
            best_by_mode = {}
            for mode in ("autoregressive", "parallel"):
                m = [(r, lv) for r, lv in candidates if r["mode"] == mode]
                if m:
                    r, lv = min(m, key=lambda x: x[1]["tpot_ms_token_weighted"])
                    best_by_mode[mode] = r["label"]
            out["best"].append({"concurrency": c, "config": best[0]["label"], "tpot_ms_token_weighted": best[1]["tpot_ms_token_weighted"], "best_k_by_mode": best_by_mode})
        if peer is None or level(peer, c) is None:
            continue
        pv = level(peer, c)
        roles: dict[str, list[str]] = {}
        for role, label in (("same config", PEER_TWIN), ("controller", "controller"), ("best static", best[0]["label"] if best else None)):
            if label in by_label:
                roles.setdefault(label, []).append(role)
        for ours_label, why in roles.items():
            lv = level(by_label[ours_label], c)
            if lv is None:
                continue
            out["vs_peer"].append({
                "concurrency": c,
                "quickdraft": ours_label,
                "role": ", ".join(why),
                "ttft_p50_ratio": _r(lv["ttft_ms"].get("p50"), pv["ttft_ms"].get("p50")),
                "ttft_p95_ratio": _r(lv["ttft_ms"].get("p95"), pv["ttft_ms"].get("p95")),
                "tpot_p50_ratio": _r(lv["tpot_ms"].get("p50"), pv["tpot_ms"].get("p50")),
                "tpot_token_weighted_ratio": _r(lv["tpot_ms_token_weighted"], pv["tpot_ms_token_weighted"]),
                "output_tokens_per_s_ratio": _r(lv["output_tokens_per_s"], pv["output_tokens_per_s"]),
            })
    return out


def _r(a, b) -> float | None:
    v = ratio(a, b)
    return None if math.isnan(v) else round(v, 3)


def markdown(doc: dict) -> str:
    lines = [f"# quickdraft bench sweep — {doc['date']}", "", f"Machine: {doc['machine']['hardware']}, load average at start {doc['machine']['load_average']}; "
             f"vLLM {doc['versions']['vllm']}; quickdraft {doc['versions']['quickdraft']} ({doc['versions']['git']}).", "",
             f"Command: `{doc['command']}`", "", f"Workload: {doc['workload']['tasks']} tasks from {doc['workload']['source']}, "
             f"{doc['workload']['single_line_share']:.0%} single-line, {doc['workload']['cancel_share']:.0%} of inline requests cancelled after "
             f"{doc['workload']['cancel_after_ms'][0]:.0f}-{doc['workload']['cancel_after_ms'][1]:.0f} ms, {doc['workload']['chat_share']:.0%} chat class. "
             "Client-side timings; TTFT/TPOT/e2e over completed requests.", ""]
    rows = [(r["label"], lv) for r in doc["runs"] for lv in r.get("levels", [])]
    lines += ["## All configs", "", report.run_table(rows), ""]
    if doc["comparisons"]["best"]:
        lines += ["## Best static config per concurrency (token-weighted TPOT)", "", "| concurrency | best | TPOT ms | best EAGLE-3 | best P-EAGLE |", "|---|---|---|---|---|"]
        for b in doc["comparisons"]["best"]:
            lines.append(f"| {b['concurrency']} | {b['config']} | {b['tpot_ms_token_weighted']:.2f} | {b['best_k_by_mode'].get('autoregressive', '-')} | {b['best_k_by_mode'].get('parallel', '-')} |")
        lines.append("")
    if doc["comparisons"]["vs_peer"]:
        lines += ["## quickdraft / vllm serve (same model, machine, workload; < 1: quickdraft faster)", "",
                  "| concurrency | quickdraft config | TTFT p50 | TTFT p95 | TPOT p50 | TPOT token-weighted | output tok/s |", "|---|---|---|---|---|---|---|"]
        for v in doc["comparisons"]["vs_peer"]:
            lines.append(f"| {v['concurrency']} | {v['quickdraft']} ({v['role']}) | {_x(v['ttft_p50_ratio'])} | {_x(v['ttft_p95_ratio'])} | {_x(v['tpot_p50_ratio'])} | {_x(v['tpot_token_weighted_ratio'])} | {_x(v['output_tokens_per_s_ratio'])} |")
        lines.append("")
    for n in doc.get("notes", []):
        lines.append(f"- {n}")
    failed = [r for r in doc["runs"] if r.get("error") or r.get("skipped")]
    for r in failed:
        lines.append(f"- {r['label']}: {r.get('skipped') or r.get('error')}")
    return "\n".join(lines) + "\n"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def run_sweep(spec: SweepSpec, wspec: WorkloadSpec, out: Path, show_progress: bool = True) -> dict:
    from tqdm import tqdm

    known = {c.label: c for c in all_configs()}
    unknown = [c for c in spec.configs if c not in known]
    if unknown:
        raise ValueError(f"unknown configs {unknown}; choose from {', '.join(known)}")
    workload = Workload.from_spec(wspec)
    doc = {**report.header(), "workload": {**workload.describe(), "source": wspec.source}, "sweep": asdict(spec), "runs": [], "notes": []}
    ok, why = controller_available()
    confs = []
    for label in spec.configs:
        if label == "controller" and not ok:
            doc["runs"].append({"label": "controller", "mode": "controller", "k": None, "levels": [], "skipped": why})
            continue
        confs.append(known[label])
    total = sum(spec.level_requests(c) for c in spec.concurrency) * len(confs)
    bar = tqdm(total=total, unit="req", desc="sweep", disable=not show_progress, dynamic_ncols=True)

    def progress(_r) -> None:
        bar.update(1)

    def note(msg: str) -> None:
        bar.set_description_str(msg[:60])
        bar.write(f"[{time.strftime('%H:%M:%S')}] {msg}")

    t0 = time.time()
    log_dir = out / "logs"
    for conf in confs:
        row = asyncio.run(measure_config(conf, spec, workload, log_dir, progress, note))
        doc["runs"].append(row)
        # Keep the bar's total honest when a config stopped early (time bound, failure).
        sent = sum(lv["requests"] for lv in row["levels"])
        bar.total -= sum(spec.level_requests(c) for c in spec.concurrency) - sent
        bar.refresh()
        doc["comparisons"] = comparisons(doc["runs"])
        doc["wall_s"] = round(time.time() - t0, 1)
        report.write_json(out / "sweep.json", doc)
    bar.close()
    doc["machine_at_end"] = report.machine()
    doc["comparisons"] = comparisons(doc["runs"])
    doc["notes"].append("Configs ran one after another on a freshly started server each; machine noise between them is not averaged out (see load averages in sweep.json).")
    report.write_json(out / "sweep.json", doc)
    (out / "sweep.md").write_text(markdown(doc))
    title = f"{doc['machine']['hardware']}, {spec.preset or 'embedded'} model"
    report.plot_vs_k(doc, "tpot_ms", "p50", out / "tpot_vs_k.png", f"TPOT p50 vs K — {title}")
    report.plot_vs_k(doc, "ttft_ms", "p50", out / "ttft_vs_k.png", f"TTFT p50 vs K — {title}")
    report.plot_vs_concurrency(doc, out / "vs_concurrency.png", f"vs concurrency — {title}")
    return doc
