"""The calibration sweep behind ``quickdraft tune``."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..config.controller import ControllerSettings
from ..speculative import SpecConfig
from ._linalg import median, quantile
from .controller import Controller
from .observation import Observation
from .profile import ProfileKey, ProfileStore, save_from

log = logging.getLogger(__name__)

Measure = Callable[[SpecConfig, int], "list[Observation]"]
DEFAULT_CONCURRENCY = (1, 4, 8, 16)


@dataclass(frozen=True)
class SweepRow:
    config: SpecConfig
    concurrency: int
    requests: int
    tpot_s: float
    """Median TPOT over the requests."""
    tpot_token_weighted_s: float
    """Decode time over decode tokens, pooled over the requests: the TPOT
    the controller predicts and the phases benchmark reports."""
    ttft_p50_s: float
    ttft_p95_s: float
    acceptance_length: float
    """Tokens per verification step, bonus included (1.0 when off)."""
    error: str = ""
    """Why the measurement failed (the row's numbers are NaN then)."""

    def to_dict(self) -> dict:
        return {"config": self.config.label(), "concurrency": self.concurrency, "requests": self.requests,
                "tpot_ms": _ms(self.tpot_s),
                "tpot_token_weighted_ms": _ms(self.tpot_token_weighted_s), "ttft_p50_ms": _ms(self.ttft_p50_s),
                "ttft_p95_ms": _ms(self.ttft_p95_s), "acceptance_length": round(self.acceptance_length, 4),
                "error": self.error}


@dataclass
class SweepResult:
    rows: list[SweepRow]
    best: dict[int, str]
    """Per concurrency, the model's pick (a label, with its K schedule)."""
    start: SpecConfig
    """The engine setting to start with (the pick at ``start_load``)."""
    controller: Controller
    profile_path: Path | None = None
    plot_path: Path | None = None
    plot_skipped: str = ""
    """Why no plot was written (e.g. matplotlib missing)."""
    failed: list[str] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    """Every request measured, in order (``quickdraft tune --json`` writes them)."""

    def table(self) -> str:
        """Markdown table of the measurements."""
        lines = ["| config | concurrency | requests | TPOT ms (median) | TPOT ms (token-weighted) | TTFT p50 ms "
                 "| TTFT p95 ms | accepted length |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            lines.append(f"| {r.config.label()} | {r.concurrency} | {r.requests} | {_ms(r.tpot_s)} | "
                         f"{_ms(r.tpot_token_weighted_s)} | "
                         f"{_ms(r.ttft_p50_s)} | {_ms(r.ttft_p95_s)} | {r.acceptance_length:.2f} |")
        return "\n".join(lines)


def run_sweep(
    measure: Measure,
    *,
    controller: Controller | None = None,
    settings: ControllerSettings | None = None,
    configs: Sequence[SpecConfig] | None = None,
    concurrencies: Iterable[int] = DEFAULT_CONCURRENCY,
    store: ProfileStore | None = None,
    key: ProfileKey | None = None,
    plot_path: str | Path | None = None,
    start_load: float = 1.0,
    progress: bool = True,
) -> SweepResult:
    """Measure every config at every concurrency, feed the controller, pick the
    start config, write the profile (if ``store`` and ``key``) and the plot.

    ``measure(config, concurrency)`` runs requests at that concurrency on an
    engine with that config and returns their observations; it is called
    config-major, so an engine-backed callback rebuilds once per config. A
    callback that raises fails that row only.
    """
    from tqdm.auto import tqdm

    ctl = controller or Controller(settings)
    configs = list(configs or ctl.settings.candidates)
    concurrencies = sorted(set(int(c) for c in concurrencies))
    if not configs or not concurrencies or concurrencies[0] < 1:
        raise ValueError("run_sweep needs at least one config and concurrencies >= 1")
    rows: list[SweepRow] = []
    failed: list[str] = []
    measured: list[Observation] = []
    bar = tqdm(total=len(configs) * len(concurrencies), desc="tune", unit="run", disable=not progress)
    try:
        for cfg in configs:
            for c in concurrencies:
                bar.set_description(f"tune {cfg.label()} x{c}")
                try:
                    obs = list(measure(cfg, c))
                except Exception as e:  # one broken config must not end the sweep
                    log.warning("measuring %s at concurrency %d failed: %s", cfg.label(), c, e)
                    failed.append(f"{cfg.label()} x{c}: {e}")
                    rows.append(SweepRow(cfg, c, 0, math.nan, math.nan, math.nan, math.nan, math.nan, str(e)))
                    bar.update(1)
                    continue
                for o in obs:
                    ctl.observe(o)
                measured.extend(obs)
                row = _summarise(cfg, c, obs)
                rows.append(row)
                if progress:
                    tqdm.write(f"{cfg.label()} x{c}: {row.requests} requests, TPOT {_ms(row.tpot_token_weighted_s)} ms "
                               f"(token-weighted; median {_ms(row.tpot_s)}), "
                               f"TTFT p50 {_ms(row.ttft_p50_s)} ms, accepted length {row.acceptance_length:.2f}")
                bar.set_postfix_str(f"TPOT {_ms(row.tpot_token_weighted_s)} ms")
                bar.update(1)
    finally:
        bar.close()
    best = {c: ctl.recommend(c).engine.label() for c in concurrencies}
    ctl.reset_load()  # the sweep's concurrency says nothing about real traffic
    start = ctl.recommend(start_load).engine
    ctl.activate(start)
    result = SweepResult(rows, best, start, ctl, failed=failed, observations=measured)
    if store is not None and key is not None:
        result.profile_path = save_from(ctl, store, key)
    if plot_path is not None:
        result.plot_path, result.plot_skipped = plot_sweep(rows, plot_path)
    return result


def _summarise(cfg: SpecConfig, c: int, obs: list[Observation]) -> SweepRow:
    tp = [o.tpot_s for o in obs if o.output_tokens > 1]
    decode_s = sum(o.tpot_s * (o.output_tokens - 1) for o in obs if o.output_tokens > 1)
    decode_tokens = sum(o.output_tokens - 1 for o in obs if o.output_tokens > 1)
    tt = [o.ttft_s for o in obs]
    drafts = sum(o.drafts for o in obs)
    acc = sum(o.num_accepted_tokens for o in obs)
    nan = math.nan
    return SweepRow(
        cfg, c, len(obs),
        median(tp) if tp else nan,
        decode_s / decode_tokens if decode_tokens else nan,
        median(tt) if tt else nan,
        quantile(tt, 0.95) if tt else nan,
        1.0 + acc / drafts if drafts else 1.0,
    )


def plot_sweep(rows: Sequence[SweepRow], path: str | Path) -> tuple[Path | None, str]:
    """TPOT and TTFT p95 against K, both drafting modes, one line per
    concurrency. Returns (path, "") or (None, why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install 'quickdraft[bench]'); no plot written"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    good = [r for r in rows if not r.error]
    concs = sorted({r.concurrency for r in good})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, attr, title in ((axes[0], "tpot_token_weighted_s", "TPOT (ms, token-weighted)"), (axes[1], "ttft_p95_s", "TTFT p95 (ms)")):
        for i, c in enumerate(concs):
            color = colors[i % len(colors)]
            off = [r for r in good if r.concurrency == c and not r.config.enabled]
            for parallel, style, marker in ((True, "-", "o"), (False, "--", "s")):
                pts = sorted((r.config.k, getattr(r, attr) * 1e3) for r in good
                             if r.concurrency == c and r.config.enabled and r.config.parallel == parallel)
                pts = [(0, getattr(off[0], attr) * 1e3)] + pts if off else pts
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker, color=color,
                            label=f"{'parallel' if parallel else 'autoregressive'}, {c} concurrent")
        ax.set_xlabel("K (draft tokens per step; 0 = speculation off)")
        ax.set_ylabel(title)
        ax.set_title(title + " by K")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("quickdraft tune: solid = parallel drafting, dashed = autoregressive")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path, ""


def _ms(v: float) -> float:
    return round(v * 1e3, 4) if not math.isnan(v) else math.nan
