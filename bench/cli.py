"""``quickdraft bench``: load generator, sweep, CI gates.

    quickdraft bench run    --server 127.0.0.1:50051 --concurrency 4 --requests 100
    quickdraft bench run    --serve --set speculation.num_speculative_tokens=3 --mode open --rate 2
    quickdraft bench sweep  [--concurrency 1,4,8,16] [--configs off,p5,vllm-serve] [--preset NAME]
    quickdraft bench gate   (= python -m quickdraft.bench.gate)
    quickdraft bench micro  (= python -m quickdraft.bench.micro)
    quickdraft bench phases (= python -m quickdraft.bench.phases)
    quickdraft bench live-switch (= python -m quickdraft.bench.live_switch)
    quickdraft bench typing (= python -m quickdraft.bench.typing_session)
    quickdraft bench replicas (= python -m quickdraft.bench.replicas)
    quickdraft bench windows OBSERVATIONS.jsonl (offline: how well measurement windows rank configs)

``quickdraft/cli.py`` calls ``add_subparsers`` when this module imports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from quickdraft.bench.workload import HELDOUT_PACKAGES_SOURCE, WorkloadSpec


def _floats(text: str, n: int) -> tuple[float, ...]:
    parts = tuple(float(x) for x in text.split(","))
    if len(parts) != n:
        raise argparse.ArgumentTypeError(f"expected {n} comma-separated numbers, got {text!r}")
    return parts


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _slo(text: str) -> dict[str, float]:
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--slo expects class=seconds[,class=seconds], got {text!r}")
        out[name.strip()] = float(value)
    return out


def _overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"quickdraft bench: --set expects section.key=value, got {item!r}")
        out[key] = value
    return out


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--source-dir", help="cut FIM tasks from the source files under DIR (default: the held-out prompts)")
    g.add_argument("--heldout-packages", action="store_true",
                   help="cut distinct FIM tasks from the installed held-out distributions (as many as --tasks; no prompt repeats)")
    g.add_argument("--tasks", type=int, default=256, help="distinct tasks (requests cycle over them)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--single-line-share", type=float, default=0.5, help="share of single-line tasks (stop at newline)")
    g.add_argument("--single-line-max-tokens", type=int, default=24)
    g.add_argument("--multi-line-max-tokens", type=int, default=64)
    g.add_argument("--cancel-share", type=float, default=0.3, help="share of inline requests cancelled by typing")
    g.add_argument("--cancel-after-ms", type=lambda s: _floats(s, 2), default=(20.0, 150.0), metavar="LO,HI", help="cancellation delay range")
    g.add_argument("--chat-share", type=float, default=0.1, help="share of requests in the chat latency class (never cancelled)")
    g.add_argument("--slo", type=_slo, default={}, metavar="CLASS=S,...", help="TTFT SLOs in seconds (default inline=0.3,chat=1.0)")


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        source=args.source_dir or (HELDOUT_PACKAGES_SOURCE if args.heldout_packages else "heldout"),
        tasks=args.tasks,
        seed=args.seed,
        single_line_share=args.single_line_share,
        single_line_max_tokens=args.single_line_max_tokens,
        multi_line_max_tokens=args.multi_line_max_tokens,
        cancel_share=args.cancel_share,
        cancel_after_ms=tuple(args.cancel_after_ms),
        chat_share=args.chat_share,
    )


# --- run -----------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from quickdraft.bench import report, servers
    from quickdraft.bench.figures import one_line, result_rows, summarize_run
    from quickdraft.bench.loadgen import GrpcTarget, OpenAITarget, RunSpec, run_load
    from quickdraft.bench.workload import Workload

    if bool(args.server) == bool(args.serve):
        print("quickdraft bench run: give --server HOST:PORT or --serve (start one)", file=sys.stderr)
        return 2
    try:
        wspec = workload_spec(args)
        workload = Workload.from_spec(wspec)
        rspec = RunSpec(mode=args.mode, concurrency=args.concurrency, rate_per_s=args.rate, max_requests=args.requests, duration_s=args.duration, warmup_requests=args.warmup, seed=args.seed)
        rspec.validate()
    except ValueError as e:
        print(f"quickdraft bench run: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    server = None
    if args.serve:
        if args.protocol != "grpc":
            print("quickdraft bench run: --serve starts a gRPC server; use --protocol grpc", file=sys.stderr)
            return 2
        server = servers.quickdraft_server("bench-run", _overrides(args.set), out / "logs", preset=args.preset)
        print(f"quickdraft bench: starting quickdraft serve on 127.0.0.1:{server.port} (log {server.log_path})", file=sys.stderr)
        server.launch(servers.server_env(offline=args.preset in (None, "embedded")))
        address = f"127.0.0.1:{server.port}"
    else:
        address = args.server
    token = Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("QUICKDRAFT_AUTH_TOKEN")
    try:
        if args.protocol == "grpc":
            target = GrpcTarget(address, token=token)
        else:
            stop_ids = []
            if args.render_fim:
                from quickdraft.bench.sweep import quickdraft_defaults, stop_token_ids

                # The stop tokens quickdraft's engine adds, from the preset's tokenizer.
                stop_ids = stop_token_ids(quickdraft_defaults(args.preset).target_path())
            target = OpenAITarget(address, model=args.model, render_fim=args.render_fim, stop_token_ids=stop_ids)
    except ValueError as e:
        print(f"quickdraft bench run: {e}", file=sys.stderr)
        if server:
            server.stop()
        return 2

    async def go():
        if server is not None:
            await servers.wait_grpc_serving(server)
        await target.open()
        try:
            bar = tqdm(total=rspec.max_requests, unit="req", desc=f"{rspec.mode} loop", disable=args.no_progress, dynamic_ncols=True)
            run = await run_load(target, workload, rspec, lambda r: bar.update(1))
            bar.close()
            return run
        finally:
            await target.close()

    try:
        run = asyncio.run(go())
    finally:
        if server is not None:
            server.stop()
    fig = summarize_run(run, args.slo)
    doc = {
        **report.header(),
        "target": target.name,
        "server": {"self_started": server is not None, "overrides": _overrides(args.set), "preset": args.preset, "start_s": server and server.start_s},
        "workload": {**workload.describe(), "source": wspec.source},
        "run": vars(rspec),
        "figures": fig,
        "requests": result_rows(run.results) if args.per_request else None,
    }
    report.write_json(out / "run.json", doc)
    md = report.run_table([(args.label or target.name, fig)])
    (out / "run.md").write_text(md + "\n")
    print(md)
    print(one_line(fig))
    print(f"quickdraft bench: wrote {out / 'run.json'} and {out / 'run.md'}")
    return 0 if fig["failed"] == 0 else 1


# --- sweep ---------------------------------------------------------------------


def _sweep(args: argparse.Namespace) -> int:
    from quickdraft.bench.sweep import SweepSpec, all_configs, run_sweep

    labels = [c.label for c in all_configs()]
    configs = labels if args.configs == "all" else [c for c in args.configs.split(",") if c]
    if args.no_peer:
        configs = [c for c in configs if c != "vllm-serve"]
    spec = SweepSpec(configs=configs, concurrency=args.concurrency, requests=args.requests, level_seconds=args.level_seconds,
                     warmup_requests=args.warmup, controller_warmup_s=args.controller_warmup, preset=args.preset,
                     overrides=_overrides(args.set), slo_s=args.slo)
    try:
        doc = run_sweep(spec, workload_spec(args), Path(args.out), show_progress=not args.no_progress)
    except ValueError as e:
        print(f"quickdraft bench sweep: {e}", file=sys.stderr)
        return 2
    print((Path(args.out) / "sweep.md").read_text())
    failed = [r["label"] for r in doc["runs"] if r.get("error")]
    if failed:
        print(f"quickdraft bench sweep: configs failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _gate(args: argparse.Namespace) -> int:
    from quickdraft.bench import gate

    return gate.run(args)


def _micro(args: argparse.Namespace) -> int:
    from quickdraft.bench import micro

    return micro.run(args)


def add_subparsers(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="load generator, config sweep and CI performance gates", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = bench.add_subparsers(dest="bench_command", required=True)

    p = sub.add_parser("run", help="drive a server with editor-like traffic and report latency figures")
    t = p.add_argument_group("target")
    t.add_argument("--server", help="HOST:PORT of a running quickdraft server (gRPC), or http://HOST:PORT for --protocol openai; loopback only")
    t.add_argument("--serve", action="store_true", help="start `quickdraft serve` on a free port for the run, stop it after")
    t.add_argument("--preset", help="with --serve: model preset; with --render-fim: whose tokenizer gives the stop tokens")
    t.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="with --serve: config override (repeatable)")
    t.add_argument("--protocol", choices=["grpc", "openai"], default="grpc")
    t.add_argument("--model", default="embedded", help="--protocol openai: model name")
    t.add_argument("--render-fim", action="store_true", help="--protocol openai: render the FIM prompt here (for upstream vllm serve)")
    t.add_argument("--token-file", help="bearer token file (default: $QUICKDRAFT_AUTH_TOKEN)")
    l = p.add_argument_group("load")  # noqa: E741
    l.add_argument("--mode", choices=["closed", "open"], default="closed", help="closed: fixed concurrency; open: Poisson arrivals")
    l.add_argument("--concurrency", type=int, default=1)
    l.add_argument("--rate", type=float, default=1.0, help="open loop: mean requests per second")
    l.add_argument("--requests", type=int, default=64, help="bound on requests sent")
    l.add_argument("--duration", type=float, default=120.0, help="bound on seconds spent sending")
    l.add_argument("--warmup", type=int, default=2, help="requests sent first, one at a time, not recorded")
    add_workload_args(p)
    p.add_argument("--label", help="row label in the table")
    p.add_argument("--per-request", action="store_true", help="keep every request's figures in run.json")
    p.add_argument("--out", default="bench/results/run")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_run)

    p = sub.add_parser("sweep", help="every speculative config x concurrency, with upstream vllm serve alongside")
    p.add_argument("--configs", default="all", help="comma list of off,ar1,ar3,ar5,ar7,p1,p3,p5,p7,controller,vllm-serve (default all)")
    p.add_argument("--no-peer", action="store_true", help="leave out the vllm serve peer")
    p.add_argument("--concurrency", type=_ints, default=[1, 4, 8, 16])
    p.add_argument("--requests", type=int, default=48, help="requests per concurrency level (at least 4 x concurrency)")
    p.add_argument("--level-seconds", type=float, default=120.0, help="bound on seconds spent sending per level")
    p.add_argument("--warmup", type=int, default=3, help="warm-up requests per server")
    p.add_argument("--controller-warmup", type=float, default=60.0, help="seconds of load before the controller's levels")
    p.add_argument("--preset", help="model preset (default embedded; qwen3-coder-30b-p-eagle on a GPU)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="config override for every quickdraft server (repeatable); engine.max_num_seqs also sets the peer's --max-num-seqs")
    add_workload_args(p)
    p.add_argument("--out", default="bench/results/sweep")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_sweep)

    from quickdraft.bench import gate, micro

    p = sub.add_parser("gate", help="CI macro gate: speed ratios measured in this run against committed thresholds",
                       description=gate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gate.add_arguments(p)
    p.set_defaults(func=_gate)
    p = sub.add_parser("micro", help="CI micro gate: hot-path micro-benchmarks against the committed baseline",
                       description=micro.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    micro.add_arguments(p)
    p.set_defaults(func=_micro)
    import quickdraft.bench.phases as phases
    from quickdraft.bench.phases import cli as phases_cli

    p = sub.add_parser("phases", help="the controller under a 1 -> 8 -> 1 stream load change, against every static config",
                       description=phases.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    phases_cli.add_arguments(p)
    p.set_defaults(func=phases_cli.run)
    from quickdraft.bench import fairness, live_switch

    p = sub.add_parser("fairness", help="a victim's TTFT while other clients loop maximum-size prompts, against the victim alone",
                       description=fairness.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fairness.add_arguments(p)
    p.set_defaults(func=fairness.run)

    from quickdraft.bench import typing_session

    p = sub.add_parser("typing", help="typing sessions through the LSP bridge: stable prompts and prefetch against the old prompts",
                       description=typing_session.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    typing_session.add_arguments(p)
    p.set_defaults(func=typing_session.run)

    from quickdraft.bench import replicas

    p = sub.add_parser("replicas", help="session routing against round-robin on engine replicas: prefix-cache hit rate and TTFT, several users typing",
                       description=replicas.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    replicas.add_arguments(p)
    p.set_defaults(func=replicas.run)

    from quickdraft.bench import windows

    p = sub.add_parser("windows", help="how well the controller's measurement windows rank configs, raw and prefill-adjusted (offline)",
                       description=windows.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    windows.add_arguments(p)
    p.set_defaults(func=windows.run)

    p = sub.add_parser("live-switch", help="live speculative switching on one engine: switch latency, and TPOT against engines built per setting",
                       description=live_switch.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    live_switch.add_arguments(p)
    p.set_defaults(func=live_switch.run)


def main(argv: list[str] | None = None) -> int:
    """``python -m quickdraft.bench.cli ...`` = ``quickdraft bench ...``."""
    parser = argparse.ArgumentParser(prog="quickdraft")
    add_subparsers(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
