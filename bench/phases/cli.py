"""``quickdraft bench phases`` (= ``python -m quickdraft.bench.phases``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import quickdraft.bench.phases as phases
from quickdraft.bench import report
from quickdraft.bench.phases.analysis import verdicts
from quickdraft.bench.phases.plot import plot
from quickdraft.bench.phases.report import markdown
from quickdraft.bench.phases.run import inline_slo_s, run_bench
from quickdraft.bench.phases.statics import load_statics
from quickdraft.bench.phases.timeline import PHASE_CONCURRENCY, SETTLE_S, TOLERANCE, Phase, PhasesSpec, known_configs


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from quickdraft.bench.cli import _ints, add_workload_args

    ap.add_argument("--configs", default=None,
                    help=f"comma list of {','.join(known_configs())} (default: all, less those --statics-from provides)")
    ap.add_argument("--phases", type=_ints, default=list(PHASE_CONCURRENCY), metavar="C,C,...", help="concurrent streams per phase (default 1,8,1)")
    ap.add_argument("--phase-seconds", type=float, default=60.0, help="seconds per phase (default 60)")
    ap.add_argument("--settle-seconds", type=float, default=SETTLE_S, help="left out of each phase's settled figures (default 30)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="target: controller TPOT within this of the best static (default 0.05)")
    ap.add_argument("--controller-warmup", type=float, default=60.0, help="seconds of load before the controller's phase 1 (default 60)")
    ap.add_argument("--controller-profile-dir", metavar="DIR",
                    help="start the controller from the profiles in DIR, e.g. the one `quickdraft tune` wrote (copied into a fresh "
                         "directory under --out; DIR is left as it is). Default: no profile, a cold start")
    ap.add_argument("--statics-from", action="append", default=[], metavar="FILE",
                    help="static configs' figures from an earlier phases.json or sweep.json (repeatable; a config measured in this "
                         "run wins, then the first file that has it)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up requests per server (default 3)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every config this many times, the order reversed every other round; figures pool the rounds, "
                         "and the report shows each round's (default 1)")
    ap.add_argument("--one-server", action="store_true",
                    help="one live-switching server for every config: each static pinned in turn, then the controller "
                         "(no engine build per config; a static then runs on a live engine)")
    ap.add_argument("--clock", choices=("client", "server"), default="client",
                    help="whose clock times each request's first token and decoding: the load generator's (default), or the "
                         "server's (its first and last generated token), which leaves out text the server holds back, e.g. "
                         "the partial characters random weights write")
    ap.add_argument("--poll-seconds", type=float, default=1.0, help="GetServerInfo poll interval, every server alike (default 1)")
    ap.add_argument("--preset", help="model preset (default embedded)")
    ap.add_argument("--config", help="TOML configuration for every server (quickdraft serve --config), under --set")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override for every server (repeatable)")
    add_workload_args(ap)
    # Like with like: no typing cancellations, no chat class (greedy either way).
    ap.set_defaults(cancel_share=0.0, chat_share=0.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/phases"))
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--reanalyse", type=Path, metavar="PHASES_JSON",
                    help="measure nothing: recompute the verdicts, phases.md and phases.png of an earlier run's phases.json into --out")


def spec_from_args(args: argparse.Namespace) -> PhasesSpec:
    from quickdraft.bench.cli import _overrides

    all_labels = list(known_configs())
    if args.configs is None or args.configs == "all":
        configs = all_labels
        if args.statics_from and args.configs is None:
            provided = set()
            for f in args.statics_from:
                provided |= {r["label"] for r in load_statics(Path(f), PhasesSpec(concurrency=list(args.phases), phase_seconds=args.phase_seconds,
                                                                                   settle_s=min(args.settle_seconds, args.phase_seconds / 2)))[0]}
            configs = [c for c in all_labels if c not in provided]
    else:
        configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    return PhasesSpec(configs=configs, concurrency=list(args.phases), phase_seconds=args.phase_seconds, settle_s=args.settle_seconds,
                      tolerance=args.tolerance, warmup_requests=args.warmup, controller_warmup_s=args.controller_warmup,
                      controller_profile_dir=args.controller_profile_dir, statics_from=list(args.statics_from), poll_s=args.poll_seconds,
                      preset=args.preset, config=args.config, overrides=_overrides(args.set), rounds=args.rounds,
                      one_server=args.one_server, clock=args.clock)


def reanalyse(path: Path, out: Path) -> dict:
    """An earlier run's phases.json with its verdicts recomputed by this code (the measurements as
    they were), written with its report into ``out``."""
    doc = json.loads(path.read_text())
    spec = PhasesSpec(**doc["spec"])
    phases = [Phase(**p) for p in doc["phases"]]
    doc["verdicts"] = verdicts(doc["runs"], phases, spec.settle_s, spec.tolerance, spec.seed_config, inline_slo_s(spec))
    v = report.versions()
    doc["notes"] = [*doc.get("notes", []), f"Verdicts recomputed from {path} by quickdraft {v['quickdraft']} ({v['git']})."]
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "phases.json", doc)
    (out / "phases.md").write_text(markdown(doc))
    plot(doc, out / "phases.png")
    return doc


def run(args: argparse.Namespace) -> int:
    from quickdraft.bench.cli import workload_spec

    if args.reanalyse is not None:
        if Path(args.out).resolve() == args.reanalyse.resolve().parent:
            print("quickdraft bench phases: --reanalyse writes into --out; give another folder than the run's own", file=sys.stderr)
            return 2
        reanalyse(args.reanalyse, Path(args.out))
        print((Path(args.out) / "phases.md").read_text())
        return 0
    try:
        spec = spec_from_args(args)
        wspec = workload_spec(args)
        doc = run_bench(spec, wspec, Path(args.out), show_progress=not args.no_progress)
    except ValueError as e:
        print(f"quickdraft bench phases: {e}", file=sys.stderr)
        return 2
    print((Path(args.out) / "phases.md").read_text())
    print(f"quickdraft bench phases: wrote {Path(args.out) / 'phases.json'}, phases.md, phases.png")
    failed = [r["label"] for r in doc["runs"] if r.get("error")]
    if failed:
        print(f"quickdraft bench phases: configs failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quickdraft.bench.phases", description=phases.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))
