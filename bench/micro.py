"""The CI micro gate: hot-path micro-benchmarks against the committed baseline, by ratio.

    python -m quickdraft.bench.micro                    # measure, compare, exit 1 on a regression
    python -m quickdraft.bench.micro --update-baseline  # measure and write bench/baselines/micro.json

It runs tests/bench/test_micro.py under pytest-benchmark. Each benchmark's
figure is its fastest round divided by the fixed reference workload's
fastest run, timed in the same test (bench/calibration.py): a unitless cost
that moves little between machines and loads. A benchmark fails when that
figure exceeds its baseline times the margin; the message names the
benchmark, its figure, the baseline and the limit. A failure is measured once
more before it counts (each figure keeps its better session): a regression
shows twice, a bad minute on a shared machine does not. The baseline file
records the measurement that set it (date, machine, command, every figure,
the median of --sessions pytest sessions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quickdraft.bench.report import REPO, header

BASELINE = Path(__file__).resolve().parent / "baselines" / "micro.json"
TESTS = REPO / "tests" / "bench" / "test_micro.py"
DEFAULT_MARGIN = 2.0


@dataclass
class Verdict:
    name: str
    ratio: float
    baseline: float | None
    limit: float | None

    @property
    def passed(self) -> bool | None:
        return None if self.limit is None else self.ratio <= self.limit

    def line(self) -> str:
        if self.limit is None:
            return f"new  {self.name}: {self.ratio:.3f} x reference (no baseline yet)"
        if self.passed:
            return f"ok   {self.name}: {self.ratio:.3f} x reference, baseline {self.baseline:.3f}, limit {self.limit:.3f}"
        return f"FAIL {self.name}: {self.ratio:.3f} x reference is past its limit {self.limit:.3f} (baseline {self.baseline:.3f} x margin {self.limit / self.baseline:.2f})"


def run_benchmarks(json_path: Path, extra: list[str] | None = None) -> int:
    """pytest-benchmark over tests/bench/test_micro.py; its exit code."""
    if not TESTS.exists():
        raise FileNotFoundError(f"{TESTS}: the micro-benchmarks live in the source tree (run from a checkout)")
    cmd = [sys.executable, "-m", "pytest", str(TESTS), "-q", "-p", "no:cacheprovider", "--benchmark-only",
           f"--benchmark-json={json_path}", "--benchmark-disable-gc", *(extra or [])]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.call(cmd, cwd=REPO, env=env)


def figures(bench_json: dict) -> dict[str, float]:
    """benchmark name -> fastest round / reference workload (both seconds, same test)."""
    out = {}
    for b in bench_json["benchmarks"]:
        ref = b.get("extra_info", {}).get("reference_s")
        if not ref:
            raise ValueError(f"{b['name']}: no reference_s in extra_info (use tests/bench/test_micro.py's timed())")
        out[b["name"]] = b["stats"]["min"] / ref
    return out


def compare(measured: dict[str, float], baseline: dict) -> list[Verdict]:
    base = baseline.get("benchmarks", {})
    default_margin = float(baseline.get("margin", DEFAULT_MARGIN))
    verdicts = []
    for name, ratio in sorted(measured.items()):
        b = base.get(name)
        if b is None:
            verdicts.append(Verdict(name, ratio, None, None))
            continue
        margin = float(b.get("margin", default_margin))
        verdicts.append(Verdict(name, ratio, float(b["ratio"]), float(b["ratio"]) * margin))
    return verdicts


def missing(measured: dict[str, float], baseline: dict) -> list[str]:
    """Baseline entries that were not measured (a benchmark skipped or removed)."""
    return sorted(set(baseline.get("benchmarks", {})) - set(measured))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--update-baseline", action="store_true", help="write the measured figures as the new baseline")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="with --update-baseline: allowed slowdown factor")
    ap.add_argument("--json", type=Path, help="keep pytest-benchmark's JSON here")
    ap.add_argument("--from-json", type=Path, help="compare an existing pytest-benchmark JSON instead of running")
    ap.add_argument("--sessions", type=int, default=3, help="with --update-baseline: pytest sessions to take the median of")
    ap.add_argument("--no-confirm", dest="confirm", action="store_false", help="fail on the first session (default: re-measure a failure once)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quickdraft.bench.micro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:

    def session(tag: str) -> dict | None:
        with tempfile.TemporaryDirectory() as tmp:
            path = (args.json.with_name(f"{args.json.stem}{tag}{args.json.suffix}") if args.json else Path(tmp) / "micro.json")
            rc = run_benchmarks(path)
            if rc != 0 or not path.exists():
                print(f"micro: the benchmarks themselves failed (pytest exit {rc}); no verdict", file=sys.stderr)
                return None
            return json.loads(path.read_text())

    if args.from_json:
        bench = json.loads(args.from_json.read_text())
    else:
        bench = session("")
        if bench is None:
            return 2
    measured = figures(bench)
    runs = [measured]
    sessions = 1
    if args.update_baseline:
        # A baseline is worth a few sessions: the median of each figure.
        for i in range(1, args.sessions):
            more = session(f"-{i}")
            if more is None:
                return 2
            runs.append(figures(more))
        measured = {n: statistics.median(r[n] for r in runs) for n in measured}
        sessions = len(runs)
        doc = {
            "about": "Hot-path micro-benchmarks (tests/bench/test_micro.py): fastest round / fixed reference workload, same test. "
                     "A benchmark fails past ratio x margin. Written by `python -m quickdraft.bench.micro --update-baseline`.",
            "measured": {**header(), "sessions": sessions, "figure": "median over sessions of min(round) / min(reference)"},
            "margin": args.margin,
            "benchmarks": {n: {"ratio": round(r, 4), "sessions": [round(run[n], 4) for run in runs]} for n, r in sorted(measured.items())},
        }
        args.baseline.parent.mkdir(parents=True, exist_ok=True)
        args.baseline.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"micro: wrote {args.baseline}")
        for n, r in sorted(measured.items()):
            print(f"     {n}: {r:.3f} x reference")
        return 0
    if not args.baseline.exists():
        print(f"micro: no baseline at {args.baseline}; run with --update-baseline first", file=sys.stderr)
        return 2
    baseline = json.loads(args.baseline.read_text())
    verdicts = compare(measured, baseline)
    if any(v.passed is False for v in verdicts) and args.confirm and not args.from_json:
        # Shared machines have bad minutes: a regression must show twice. Each figure keeps its better session.
        print("micro: " + ", ".join(v.name for v in verdicts if v.passed is False) + " past the limit; measuring again to confirm")
        again = session("-confirm")
        if again is None:
            return 2
        second = figures(again)
        measured = {n: min(r, second.get(n, r)) for n, r in measured.items()}
        verdicts = compare(measured, baseline)
    for v in verdicts:
        print(v.line())
    gone = missing(measured, baseline)
    for name in gone:
        print(f"FAIL {name}: in the baseline but not measured (skipped or removed; update the baseline if on purpose)")
    failed = [v for v in verdicts if v.passed is False]
    print(f"micro: {'FAILED' if failed or gone else 'passed'} ({len(verdicts)} benchmarks, baseline {baseline.get('measured', {}).get('date', '?')})")
    for v in failed:
        print(f"micro: {v.line()}", file=sys.stderr)
    return 1 if failed or gone else 0


if __name__ == "__main__":
    sys.exit(main())
