"""phases.png: TPOT over time per config with the phase changes and the
controller's switches, and settled TPOT per phase."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from quickdraft.bench.phases.analysis import tpot_in
from quickdraft.bench.phases.timeline import SEED_CONFIG, Phase, Req, reqs_of, streams, window_tpot_ms
from quickdraft.bench.report import pyplot


def short_label(label: str) -> str:
    """The controller's "parallel K=5" / "autoregressive K=3" as p5 / ar3 (other labels as they are)."""
    for long, short in (("parallel K=", "p"), ("autoregressive K=", "ar")):
        if label.startswith(long) and label[len(long):].isdigit():
            return short + label[len(long):]
    return label


def rolling_tpot(reqs: Sequence[Req], window_s: float, t0: float, t1: float) -> tuple[list[float], list[float]]:
    """Token-weighted TPOT (ms) of the requests that started within ``window_s`` before each point, every window/4."""
    xs, ys = [], []
    step = window_s / 4
    t = t0 + window_s
    while t <= t1 + 1e-9:
        v = window_tpot_ms(reqs, t - window_s, t)
        if v is not None:
            xs.append(t - window_s / 2)
            ys.append(v)
        t += step
    return xs, ys


def plot(doc: dict, path: Path, window_s: float | None = None) -> Path | None:
    runs = [r for r in doc["runs"] if r.get("phases")]
    if not runs:
        return None
    plt = pyplot()
    spec = doc["spec"]
    phases = [Phase(**p) for p in doc["phases"]]
    window_s = window_s or max(0.5, min(10.0, spec["phase_seconds"] / 6))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [3, 2]})
    seed = spec.get("seed_config", SEED_CONFIG)
    palette = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i not in (2, 3)]  # green: the controller, red: the seed config
    others = [r["label"] for r in runs if r.get("mode") != "controller" and r["label"] != seed]

    def color(r: dict):
        if r.get("mode") == "controller":
            return "green"
        if r["label"] == seed:
            return "red"
        return palette[others.index(r["label"]) % len(palette)]
    t_lo = min([phases[0].start_s] + [-spec["controller_warmup_s"] for r in runs if r.get("mode") == "controller"])
    for i, r in enumerate(runs):
        reqs = reqs_of(r)
        is_ctl = r.get("mode") == "controller"
        style = {"color": color(r), "linewidth": 2.4, "zorder": 5} if is_ctl else \
                {"color": color(r), "linestyle": "--", "linewidth": 1.6} if r["label"] == seed else \
                {"color": color(r), "linewidth": 1.0, "alpha": 0.8}
        if reqs is not None:
            xs, ys = rolling_tpot(reqs, window_s, t_lo if is_ctl else phases[0].start_s, phases[-1].end_s)
            ax.plot(xs, ys, label=r["label"], **style)
        else:  # figures only: one level per phase
            for p in phases:
                v = tpot_in(r, p, 1.0)
                if v is not None:
                    ax.hlines(v, p.start_s, p.end_s, label=r["label"] if p.index == 0 else None, linestyles=":", **{k: val for k, val in style.items() if k != "linestyle"})
    ymax = ax.get_ylim()[1]
    for p in phases:
        ax.axvline(p.start_s, color="black", linewidth=0.8)
        ax.axvspan(p.start_s, min(p.end_s, p.start_s + spec["settle_s"]), color="grey", alpha=0.08)
        ax.text(p.start_s + 0.5, ymax, f" {streams(p.concurrency)}", va="top", fontsize=8)
    ctl = next((r for r in runs if r.get("mode") == "controller" and r.get("server")), None)
    if ctl is not None:
        for d in ctl["server"]["decisions"]:
            if d["action"] != "hold":
                ax.axvline(d["t"], color="green", linestyle=":", linewidth=1)
                ax.text(d["t"], ymax * 0.97, f" →{short_label(d['to'])}", rotation=90, va="top", fontsize=7, color="green")
    ax.set_xlabel("seconds since phase 1 began (request start)")
    ax.set_ylabel(f"TPOT ms, token-weighted over {window_s:.0f}-s windows")
    ax.set_title("TPOT over time (shaded: the first seconds after each phase change)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    # per-phase bars: settled TPOT, every config
    n = len(runs)
    width = 0.8 / max(1, n)
    for i, r in enumerate(runs):
        vals = [tpot_in(r, p, spec["settle_s"]) for p in phases]
        bx.bar([j + (i - (n - 1) / 2) * width for j in range(len(phases))], [x if x is not None else 0 for x in vals], width,
               label=r["label"], color=color(r), alpha=0.9 if r.get("mode") == "controller" else 0.6)
    bx.set_xticks(range(len(phases)))
    bx.set_xticklabels([f"phase {p.index + 1}\n{streams(p.concurrency)}" for p in phases])
    bx.set_ylabel("TPOT ms, token-weighted, settled")
    bx.set_title(f"per phase, after its first {spec['settle_s']:g} s", fontsize=9)
    bx.grid(alpha=0.3, axis="y")
    bx.legend(fontsize=7, ncol=2)
    model = spec.get("preset") or (f"config {spec['config']}" if spec.get("config") else "embedded model")
    fig.suptitle(f"Controller under a changing load — {doc['machine']['hardware']}, {model}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
