"""Fairness under abuse: a victim's TTFT while other clients loop maximum-size prompts.

    quickdraft bench fairness [--phase-seconds 20] [--rounds 2] [--out bench/results/fairness]

Starts one ``quickdraft serve`` (embedded model) with per-user tokens
(``security.auth_tokens_file``): four victim users with their own tokens and
one "attackers" user whose token the attackers share. Victims send held-out
code back to back (8 tokens each) and measure TTFT at the client: from the
call to the first text. Attackers run in their own processes (their client
work must not slow the victims' clock) and loop, back to back:

- ``bytes``: a prompt just under ``limits.max_request_bytes`` (1 MiB), refused
  by its size;
- ``chars``: a prompt just under ``limits.max_prompt_chars``, the longest a
  server tokenizes before it can tell it is too long (refused after).

Scenarios, each a pair of phases (victims alone, then attacked) repeated
``--rounds`` times in turn so drift on a shared machine hits both alike:

- 1 victim against 1 attacker, in each attack mode;
- 4 victims (4 users) against 4 attackers sharing one token, ``chars`` mode.

Reported: victim TTFT p50/p99 alone and attacked, their ratio (target
<= 1.2x at p99), and the attackers' refused requests per second (the attack
ran). Written as JSON and a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

from quickdraft.bench.servers import quickdraft_server, server_env, wait_grpc_serving
from quickdraft.bench.workload import load_prompts

ATTACK_MODES = ("bytes", "chars")
VICTIM_MAX_TOKENS = 8


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# --- attackers: their own processes ------------------------------------------------------


def attack_prompt(mode: str, max_request_bytes: int, max_prompt_chars: int) -> str:
    # Code-like text, so the tokenizer does its usual work per character.
    unit = "    value = compute(alpha, beta) + 42  # note\n"
    n = max_request_bytes - 256 if mode == "bytes" else max_prompt_chars - 1
    return (unit * (n // len(unit) + 1))[:n]


def _attacker(port: int, token: str, mode: str, max_request_bytes: int, max_prompt_chars: int, stop_at: float, conn) -> None:
    import grpc

    from quickdraft.client import CompletionClient, RetryPolicy

    prompt = attack_prompt(mode, max_request_bytes, max_prompt_chars)
    refused = other = 0
    with CompletionClient(f"127.0.0.1:{port}", token=token, timeout=30, retry=RetryPolicy(max_attempts=1)) as c:
        while time.time() < stop_at:
            try:
                # strict: refused as over the budget, never cut to fit and run.
                c.complete_text(prefix=prompt, max_tokens=1, strict_prompt=True)
                other += 1
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                    refused += 1
                else:
                    other += 1
    conn.send({"refused": refused, "other": other})


# --- victims: one asyncio client per user ---------------------------------------------------


async def _victims(port: int, tokens: list[str], seconds: float, prompts: list[dict]) -> dict:
    from quickdraft.client import AsyncCompletionClient, RetryPolicy

    ttft: list[float] = []
    failures = 0
    stop_at = time.monotonic() + seconds

    async def victim(i: int, token: str) -> None:
        nonlocal failures
        async with AsyncCompletionClient(f"127.0.0.1:{port}", token=token, timeout=30, retry=RetryPolicy(max_attempts=1)) as c:
            j = i
            while time.monotonic() < stop_at:
                p = prompts[j % len(prompts)]
                j += len(tokens)
                t0 = time.perf_counter()
                first = None
                try:
                    stream = c.complete(prefix=p["prefix"], suffix=p["suffix"], max_tokens=VICTIM_MAX_TOKENS)
                    async for _ in stream:
                        if first is None:
                            first = time.perf_counter() - t0
                except Exception:  # noqa: BLE001 - counted; a victim must not fail
                    failures += 1
                    continue
                if first is not None:
                    ttft.append(first)

    await asyncio.gather(*(victim(i, t) for i, t in enumerate(tokens)))
    return {"ttft_s": ttft, "failures": failures}


def run_phase(port: int, victim_tokens: list[str], attacker_token: str | None, attackers: int, mode: str,
              seconds: float, prompts: list[dict], limits: dict) -> dict:
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    if attackers:
        stop_at = time.time() + seconds + 1.0  # past the victims' phase: no quiet tail
        for _ in range(attackers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_attacker, args=(port, attacker_token, mode, limits["max_request_bytes"], limits["max_prompt_chars"], stop_at, child))
            p.start()
            procs.append(p)
            conns.append(parent)
        time.sleep(2.0)  # the attackers' processes start (imports) before the clock runs
    result = asyncio.run(_victims(port, victim_tokens, seconds, prompts))
    attack = {"refused": 0, "other": 0}
    for p, c in zip(procs, conns):
        p.join(60)
        if c.poll(5):
            for k, v in c.recv().items():
                attack[k] += v
    result["attack_refused_per_s"] = attack["refused"] / seconds if attackers else 0.0
    result["attack_other"] = attack["other"]
    return result


def summarize(alone: list[float], attacked: list[float]) -> dict:
    a50, a99 = _quantile(alone, 0.5), _quantile(alone, 0.99)
    b50, b99 = _quantile(attacked, 0.5), _quantile(attacked, 0.99)
    return {"alone_p50_ms": a50 * 1e3, "alone_p99_ms": a99 * 1e3, "attacked_p50_ms": b50 * 1e3, "attacked_p99_ms": b99 * 1e3,
            "ratio_p50": b50 / a50, "ratio_p99": b99 / a99, "samples_alone": len(alone), "samples_attacked": len(attacked)}


def run(args: argparse.Namespace) -> int:
    from quickdraft.server.auth import TokensFile
    from quickdraft.server.config import load_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = dict(kv.split("=", 1) for kv in args.set)
    cfg = load_config(env={}, overrides=sets)
    limits = {"max_request_bytes": cfg.limits.max_request_bytes, "max_prompt_chars": cfg.max_prompt_chars()}
    tf = TokensFile()
    victims = [tf.add(f"victim{i}") for i in range(4)]
    attacker = tf.add("attackers")
    tmp = Path(tempfile.mkdtemp(prefix="quickdraft-fairness-"))
    tokens_path = tmp / "tokens.toml"
    tf.write(tokens_path)
    prompts = load_prompts(64)
    scenarios = [
        ("1 victim vs 1 attacker, bytes", 1, 1, "bytes"),
        ("1 victim vs 1 attacker, chars", 1, 1, "chars"),
        ("4 users vs 4 attackers sharing one token, chars", 4, 4, "chars"),
    ]
    scenarios = [s for s in scenarios if not args.scenarios or any(k in s[0] for k in args.scenarios.split(","))]
    server = quickdraft_server("fairness", {**sets, "security.auth_tokens_file": str(tokens_path)}, out)
    env = server_env()
    results: dict[str, dict] = {}
    with server:
        server.launch(env)
        asyncio.run(wait_grpc_serving(server))
        print(f"fairness: server ready in {server.start_s:.0f} s; {len(scenarios)} scenarios x {args.rounds} rounds x 2 phases of {args.phase_seconds:.0f} s",
              flush=True)
        run_phase(server.port, victims[:1], None, 0, "bytes", 3.0, prompts, limits)  # warm-up
        pooled = {name: {"alone": [], "attacked": [], "refused_per_s": [], "failures": 0, "attack_other": 0} for name, *_ in scenarios}
        for r in range(args.rounds):
            for name, n_victims, n_attackers, mode in scenarios:
                for attacked in (False, True):
                    res = run_phase(server.port, victims[:n_victims], attacker, n_attackers if attacked else 0, mode,
                                    args.phase_seconds, prompts, limits)
                    p = pooled[name]
                    p["attacked" if attacked else "alone"].extend(res["ttft_s"])
                    p["failures"] += res["failures"]
                    if attacked:
                        p["refused_per_s"].append(res["attack_refused_per_s"])
                        p["attack_other"] += res["attack_other"]
                    print(f"  round {r + 1} {name} {'attacked' if attacked else 'alone'}: {len(res['ttft_s'])} requests, "
                          f"p50 {_quantile(res['ttft_s'], 0.5) * 1e3:.1f} ms, p99 {_quantile(res['ttft_s'], 0.99) * 1e3:.1f} ms"
                          + (f", attack refused {res['attack_refused_per_s']:.0f}/s" if attacked else ""), flush=True)
        for name, p in pooled.items():
            results[name] = {**summarize(p["alone"], p["attacked"]), "victim_failures": p["failures"],
                             "attack_refused_per_s": sum(p["refused_per_s"]) / max(1, len(p["refused_per_s"])),
                             "attack_not_refused": p["attack_other"]}
    from quickdraft.server.engine import hardware_description

    report = {"machine": hardware_description(), "settings": sets, "phase_seconds": args.phase_seconds, "rounds": args.rounds,
              "victim_max_tokens": VICTIM_MAX_TOKENS, "limits": limits, "scenarios": results,
              "command": "quickdraft bench fairness " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "fairness"] else sys.argv[1:])}
    (out / "fairness.json").write_text(json.dumps(report, indent=2))
    lines = ["| scenario | victim TTFT p50 alone / attacked | p99 alone / attacked | ratio p50 | ratio p99 | attack refused/s |",
             "|---|---|---|---|---|---|"]
    for name, s in results.items():
        lines.append(f"| {name} | {s['alone_p50_ms']:.1f} / {s['attacked_p50_ms']:.1f} ms | {s['alone_p99_ms']:.1f} / {s['attacked_p99_ms']:.1f} ms "
                     f"| {s['ratio_p50']:.2f} | {s['ratio_p99']:.2f} | {s['attack_refused_per_s']:.0f} |")
    table = "\n".join(lines)
    (out / "fairness.md").write_text(f"Machine: {report['machine']}\n\n{table}\n")
    print(table)
    bad = [n for n, s in results.items() if s["victim_failures"]]
    if bad:
        print(f"fairness: victims failed in {bad}", file=sys.stderr)
    return 1 if bad else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--phase-seconds", type=float, default=20.0, help="seconds per phase (alone, attacked)")
    p.add_argument("--rounds", type=int, default=2, help="times each scenario's pair of phases runs, in turn")
    p.add_argument("--scenarios", default="", help="comma list of words picking scenarios (bytes, chars, sharing); default all")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="server setting (repeatable), e.g. limits.tokenizer_share=0.1")
    p.add_argument("--out", default="bench/results/fairness")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m quickdraft.bench.fairness", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
