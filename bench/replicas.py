"""Session routing against round-robin on replicas (issue 26): several users typing at once.

    quickdraft bench replicas [--replicas 2] [--users 6] [--rounds 2] [--chars 150]
                              [--modes session,round_robin] [--set SECTION.KEY=VALUE] [--out bench/results/replicas]

Each block starts ``quickdraft serve --replicas N --set replicas.routing=MODE``
(fresh engines, so every block starts with empty prefix caches), replays the
same typing workload through it, reads the replicas' prefix-cache counters,
and stops it. Modes alternate within a round, the order reversed every other
round (session, round_robin, round_robin, session, ...), so drift on a shared
machine hits both alike; every ratio is of two blocks of this run.

**Workload.** ``--users`` users type at once, each in a repository of its own
(a copy of one held-out package under a folder named for the user and the
round: the prompt's repository name) and one file of it, a function body of
that file typed again top to bottom (bench/typing_session.py's targets, at
least ``--chars`` characters per user). The prompts are the LSP bridge's own
(its context engine, stable prompts, its token budget), built in process
before the blocks, so both modes of a round send exactly the same requests.
A user asks at the end of each word and line (where a typist pauses), waits
for the answer, then types the next word at about 6 keys a second: one
stream per user, as the bridge's debounce and cancellation leave it. The
requests carry ``repo_name`` and no ``session``: the server keys the session
by caller and repository, as it does for the bridge.

**Figures per mode**: the prefix-cache hit rate (the replicas' vLLM counters,
``GetServerInfo.replicas``: hit tokens over looked-up tokens, summed over
replicas), prompt tokens computed per request, TTFT at the client (request
sent to first text, or to the end for an empty answer) and as the replica
measured it (``CompleteFinal.ttft_ms``), p50 and p95, and each replica's
share of the looked-up tokens. Ratios round-robin / session per round and
pooled (percentiles over all requests of a mode). Written as JSON and
Markdown to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SESSION, ROUND_ROBIN = "session", "round_robin"
KEYS_PER_S = 6.0
PROMPT_BUDGET_TOKENS = 768  # what the server announces for the embedded model (GetServerInfo.limits)
CHARS_PER_TOKEN = 3.45


@dataclass
class UserPlan:
    """One user's requests, in order, and the characters typed before each."""

    user: int
    repo: str
    file: str
    requests: list = field(default_factory=list)  # pb.CompleteRequest
    typed: list[int] = field(default_factory=list)


def pause_points(span: str) -> list[int]:
    """Offsets in ``span`` after which the typist pauses and the editor asks:
    the end of each word (the next character is blank) and each line (after
    Enter and the next line's indentation). Always the end of the span."""
    from quickdraft.bench.typing_session import next_chunk

    out, i = [], 0
    while i < len(span):
        chunk = next_chunk(span, i)
        i += len(chunk)
        if chunk.startswith("\n") or i >= len(span) or span[i] in " \n":
            out.append(i)
    return out


def build_plans(users: int, rounds: int, chars: int, seed: int, workdir: Path) -> list[list[UserPlan]]:
    """Per round, per user: the bridge's requests for that user's typing, built in process."""
    from transformers import AutoTokenizer

    from quickdraft.bench.typing_session import _position, pick_targets
    from quickdraft.lsp_bridge.completer import make_request
    from quickdraft.lsp_bridge.context import Budget, ContextEngine
    from quickdraft.lsp_bridge.settings import Settings
    from quickdraft.lsp_bridge.token_ratio import BytesPerToken, prompt_bytes
    from quickdraft.lsp_bridge.workspace import Change, Workspace
    from quickdraft.server.presets import embedded_dir
    from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize

    # The bridge learns its bytes per token from the server's counts: the same here, from the embedded tokenizer.
    tokens = PromptTokenizer(AutoTokenizer.from_pretrained(str(embedded_dir() / "target")))
    settings = Settings()
    picked = pick_targets(rounds * users, chars, seed)
    plans: list[list[UserPlan]] = []
    for r in range(rounds):
        round_plans = []
        for u in range(users):
            targets = picked[r * users + u]
            pkg = Path(targets[0].package_dir).name
            repo = workdir / f"user{u + 1}-round{r + 1}-{pkg}"
            plan = UserPlan(u + 1, repo.name, targets[0].rel)
            for target in targets:
                dest = repo / Path(target.package_dir).name
                if not dest.exists():
                    shutil.copytree(target.package_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
                ws = Workspace([str(repo)])
                engine = ContextEngine(ws, stable=settings.stable_prompt)
                for rel in target.tabs():
                    ws.open((repo / rel).as_uri(), (repo / rel).read_text(encoding="utf-8"), language_id="python")
                before, span = target.texts()
                opened = ws.open((repo / target.rel).as_uri(), before, language_id="python", version=1)
                ratio = BytesPerToken(CHARS_PER_TOKEN)
                text, cursor, i = before, target.start, 0
                for stop in pause_points(span):
                    chunk = span[i:stop]
                    at = _position(text, cursor)
                    ws.change(opened.uri, opened.doc.version + 1, [Change(chunk, at, at)])
                    text, cursor, i = text[:cursor] + chunk + text[cursor:], cursor + len(chunk), stop
                    request, _ = make_request(ws, engine, opened, opened.doc.offset_at(*_position(text, cursor)),
                                              Budget(PROMPT_BUDGET_TOKENS, ratio.value(opened.uri, "python")), settings)
                    ratio.observe(opened.uri, "python", prompt_bytes(request), len(tokenize(tokens, request, "qwen-fim")))
                    plan.requests.append(request)
                    plan.typed.append(len(chunk))
            round_plans.append(plan)
        plans.append(round_plans)
    return plans


# --- one block -----------------------------------------------------------------------


async def replica_counters(address: str) -> list[dict]:
    """Each replica's id and prefix-cache counters, as GetServerInfo lists them."""
    from quickdraft.client import AsyncCompletionClient, RetryPolicy

    async with AsyncCompletionClient(address, retry=RetryPolicy(max_attempts=1)) as c:
        info = await c.server_info()
    return [{"replica_id": r.replica_id, "state": r.state, "queried": r.prefix_cache_queried_tokens,
             "hit": r.prefix_cache_hit_tokens, "speculative_config": r.speculative_config} for r in info.replicas]


async def settled_counters(address: str, previous: list[dict] | None = None, timeout_s: float = 20.0) -> list[dict]:
    """The counters once two reads a poll apart agree (the front end polls the replicas every second)."""
    end = time.monotonic() + timeout_s
    last = previous
    while True:
        await asyncio.sleep(1.5)
        now = await replica_counters(address)
        if now == last or time.monotonic() > end:
            return now
        last = now


async def wait_replicas(address: str, n: int, timeout_s: float = 120.0) -> list[dict]:
    end = time.monotonic() + timeout_s
    while True:
        got = await replica_counters(address)
        if sum(r["state"] == "serving" for r in got) >= n:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"{n} replicas not serving after {timeout_s:.0f} s: {got}")
        await asyncio.sleep(1.0)


async def warm_up(address: str, replicas: int) -> None:
    """A few small requests of sessions of their own until every replica has
    served one: the first request of an engine is slow, in either mode."""
    from quickdraft.client import AsyncCompletionClient

    async with AsyncCompletionClient(address, timeout=120) as c:
        for i in range(8 * replicas):
            await c.complete(prefix=f"# warm-up {i}\ndef f(x):\n    return ", max_tokens=4, session=f"warm-up-{i}").text()
            if i + 1 >= replicas:
                counts = await settled_counters(address)
                if all(r["queried"] > 0 for r in counts) and len(counts) >= replicas:
                    return


async def run_user(address: str, plan: UserPlan, seed: str, rows: list[dict], tags: dict) -> None:
    """One user: type, ask, wait for the answer; repeat."""
    import grpc

    from quickdraft.client import AsyncCompletionClient, RetryPolicy

    rng = random.Random(seed)
    async with AsyncCompletionClient(address, timeout=120, retry=RetryPolicy(max_attempts=1)) as c:
        for n, (request, typed) in enumerate(zip(plan.requests, plan.typed)):
            # The word (or line) before this request, typed at a human pace.
            await asyncio.sleep(sum(rng.lognormvariate(0.0, 0.35) for _ in range(max(1, typed))) / KEYS_PER_S)
            row = {**tags, "user": plan.user, "n": n, "ok": False}
            t0 = time.perf_counter()
            stream = c.complete(request)
            first = None
            try:
                async for _ in stream:
                    if first is None:
                        first = time.perf_counter()
                end = time.perf_counter()
                row.update(ok=True, ttft_ms=((first or end) - t0) * 1e3, total_ms=(end - t0) * 1e3,
                           server_ttft_ms=stream.final.ttft_ms if stream.final else None,
                           prompt_tokens=stream.final.prompt_tokens if stream.final else None)
            except grpc.aio.AioRpcError as e:
                row["error"] = e.code().name
            rows.append(row)


async def run_block(address: str, plans: list[UserPlan], replicas: int, round_no: int, mode: str, seed: int) -> tuple[dict, list[dict]]:
    from quickdraft.server.replicas.routing import home_order

    await wait_replicas(address, replicas)
    await warm_up(address, replicas)
    before = await settled_counters(address)
    # Each user's home under session routing: the server keys an unauthenticated
    # caller's session by peer host and repository.
    ids = [r["replica_id"] for r in before]
    homes = {rid: sum(home_order(f"ipv4:127.0.0.1/{p.repo}", ids)[0] == rid for p in plans) for rid in ids}
    rows: list[dict] = []
    tags = {"mode": mode, "round": round_no}
    t0 = time.monotonic()
    await asyncio.gather(*(run_user(address, p, f"{seed}-{round_no}-{p.user}", rows, tags) for p in plans))
    elapsed = time.monotonic() - t0
    after = await settled_counters(address, before)
    was = {r["replica_id"]: r for r in before}
    per_replica = [{"replica_id": r["replica_id"], "homed_users": homes.get(r["replica_id"], 0), "queried": r["queried"] - was.get(r["replica_id"], {}).get("queried", 0),
                    "hit": r["hit"] - was.get(r["replica_id"], {}).get("hit", 0), "speculative_config": r["speculative_config"]}
                   for r in after]
    block = {"mode": mode, "round": round_no, "seconds": elapsed, "replicas": per_replica,
             "requests": len(rows), "failed": sum(not r["ok"] for r in rows)}
    return block, rows


# --- figures -------------------------------------------------------------------------


def figures(blocks: list[dict], rows: list[dict]) -> dict:
    """Figures of a set of blocks (one mode, one round or all rounds)."""
    from quickdraft.bench.stats import percentile

    queried = sum(r["queried"] for b in blocks for r in b["replicas"])
    hit = sum(r["hit"] for b in blocks for r in b["replicas"])
    ok = [r for r in rows if r["ok"]]
    ttft = [r["ttft_ms"] for r in ok]
    server = [r["server_ttft_ms"] for r in ok if r.get("server_ttft_ms")]
    shares = []
    for b in blocks:
        total = sum(r["queried"] for r in b["replicas"])
        if total:
            shares.append(max(r["queried"] for r in b["replicas"]) / total)
    return {
        "requests": len(rows),
        "failed": len(rows) - len(ok),
        "prefix_cache_hit_rate": hit / queried if queried else float("nan"),
        "prompt_tokens_queried": queried,
        "computed_tokens_per_request": (queried - hit) / len(ok) if ok else float("nan"),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
        "server_ttft_p50_ms": percentile(server, 50),
        "server_ttft_p95_ms": percentile(server, 95),
        "busiest_replica_share": max(shares) if shares else float("nan"),
    }


RATIO_KEYS = ("prefix_cache_hit_rate", "computed_tokens_per_request", "ttft_p50_ms", "ttft_p95_ms", "server_ttft_p50_ms", "server_ttft_p95_ms")


def analyze(blocks: list[dict], rows: list[dict], modes: list[str]) -> dict:
    rounds = sorted({b["round"] for b in blocks})

    def pick(items, mode, round_no=None):
        return [x for x in items if x["mode"] == mode and (round_no is None or x["round"] == round_no)]

    out: dict = {"pooled": {m: figures(pick(blocks, m), pick(rows, m)) for m in modes},
                 "rounds": {r: {m: figures(pick(blocks, m, r), pick(rows, m, r)) for m in modes} for r in rounds}}
    if len(modes) == 2:
        a, b = modes  # ratio b / a: round-robin over session
        ratio = lambda fa, fb, k: fb[k] / fa[k] if fa[k] else float("nan")  # noqa: E731
        out["ratios"] = {k: {"pooled": ratio(out["pooled"][a], out["pooled"][b], k),
                             "rounds": [ratio(out["rounds"][r][a], out["rounds"][r][b], k) for r in rounds]} for k in RATIO_KEYS}
    return out


def markdown(doc: dict) -> str:
    modes = doc["modes"]
    res = doc["result"]
    lines = [f"### Session routing against round-robin: {doc['replicas']} replicas, {doc['users']} users typing, "
             f"{doc['rounds']} rounds", "", "| figure | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    rows = [("requests (failed)", lambda f: f"{f['requests']} ({f['failed']})"),
            ("prefix-cache hit rate", lambda f: f"{f['prefix_cache_hit_rate']:.1%}"),
            ("prompt tokens computed per request", lambda f: f"{f['computed_tokens_per_request']:.0f}"),
            ("TTFT p50, client (ms)", lambda f: f"{f['ttft_p50_ms']:.1f}"),
            ("TTFT p95, client (ms)", lambda f: f"{f['ttft_p95_ms']:.1f}"),
            ("TTFT p50, replica (ms)", lambda f: f"{f['server_ttft_p50_ms']:.1f}"),
            ("TTFT p95, replica (ms)", lambda f: f"{f['server_ttft_p95_ms']:.1f}"),
            ("busiest replica's share of prompt tokens (worst block)", lambda f: f"{f['busiest_replica_share']:.0%}")]
    for label, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(res["pooled"][m]) for m in modes) + " |")
    if "ratios" in res:
        a, b = modes
        lines += ["", f"| ratio {b} / {a} | pooled | per round |", "|---|---:|---|"]
        names = {"prefix_cache_hit_rate": "prefix-cache hit rate", "computed_tokens_per_request": "prompt tokens computed per request",
                 "ttft_p50_ms": "TTFT p50, client", "ttft_p95_ms": "TTFT p95, client",
                 "server_ttft_p50_ms": "TTFT p50, replica", "server_ttft_p95_ms": "TTFT p95, replica"}
        for k, label in names.items():
            r = res["ratios"][k]
            lines.append(f"| {label} | {r['pooled']:.2f} | [{', '.join(f'{x:.2f}' for x in r['rounds'])}] |")
    lines += ["", "Blocks in run order: " + ", ".join(
        f"{b['mode']} r{b['round']} ({b['seconds']:.0f} s; prompt tokens per replica "
        + "/".join(str(r['queried']) for r in b['replicas']) + "; users whose session home it is "
        + "/".join(str(r['homed_users']) for r in b['replicas']) + ")" for b in doc["blocks"])]
    return "\n".join(lines) + "\n"


# --- the run -------------------------------------------------------------------------


def schedule(modes: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, mode) in run order: every mode each round, the order reversed every other round."""
    out = []
    for r in range(rounds):
        out += [(r + 1, m) for m in (modes if r % 2 == 0 else modes[::-1])]
    return out


def server_overrides(args: argparse.Namespace, mode: str, n: int) -> dict[str, str]:
    import os

    from quickdraft.bench.cli import _overrides

    cpus = max(0.1, min(1.0, (os.cpu_count() or 1) / args.replicas))
    return {"replicas.count": str(args.replicas), "replicas.routing": mode, "replicas.cpus_per_replica": f"{cpus:g}",
            "replicas.app_name": f"qd-bench-{os.getpid()}-{n}", **_overrides(args.set)}


async def _run_all(args: argparse.Namespace, plans: list[list[UserPlan]], out: Path) -> tuple[list[dict], list[dict]]:
    from quickdraft.bench import servers

    blocks: list[dict] = []
    rows: list[dict] = []
    for n, (round_no, mode) in enumerate(schedule(args.modes, args.rounds)):
        server = servers.quickdraft_server(f"replicas-{mode}-r{round_no}", server_overrides(args, mode, n), out / "logs")
        print(f"quickdraft bench replicas: round {round_no}, {mode}: starting {args.replicas} replicas (log {server.log_path})",
              file=sys.stderr, flush=True)
        server.launch(servers.server_env(offline=True))
        try:
            await servers.wait_grpc_serving(server)
            address = f"127.0.0.1:{server.port}"
            block, block_rows = await run_block(address, plans[round_no - 1], args.replicas, round_no, mode, args.seed)
        finally:
            stop_server(server)
        block["start_s"] = server.start_s
        blocks.append(block)
        rows += block_rows
        f = figures([block], block_rows)
        print(f"  {len(block_rows)} requests ({block['failed']} failed) in {block['seconds']:.0f} s: hit rate "
              f"{f['prefix_cache_hit_rate']:.1%}, TTFT p50 {f['ttft_p50_ms']:.0f} ms, p95 {f['ttft_p95_ms']:.0f} ms",
              file=sys.stderr, flush=True)
    return blocks, rows


def stop_server(server, timeout_s: float = 180.0) -> None:
    """SIGTERM to the server alone: it drains, deletes its application and
    shuts its local Ray down. Not to its process group (ServerProcess.stop):
    Ray's raylet is in that group, and the server cannot stop its replicas
    once the raylet is gone."""
    import os
    import signal
    import subprocess

    p = server.proc
    if p is None or p.poll() is not None:
        return
    os.kill(p.pid, signal.SIGTERM)
    try:
        server.exit_code = p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"quickdraft bench replicas: {server.label} did not stop in {timeout_s:.0f} s; killing its process group "
              f"(its Ray workers may outlive it)", file=sys.stderr, flush=True)
        server.stop(10)


def run(args: argparse.Namespace) -> int:
    from quickdraft.bench import report
    from quickdraft.bench.cli import _overrides

    bad = [m for m in args.modes if m not in (SESSION, ROUND_ROBIN)]
    if bad or not args.modes:
        print(f"quickdraft bench replicas: --modes takes {SESSION} and/or {ROUND_ROBIN}, got {','.join(args.modes)}", file=sys.stderr)
        return 2
    if args.replicas < 2 or args.users < 1 or args.rounds < 1:
        print("quickdraft bench replicas: needs --replicas >= 2, --users >= 1, --rounds >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="qd-bench-replicas-"))
    try:
        t0 = time.monotonic()
        plans = build_plans(args.users, args.rounds, args.chars, args.seed, workdir)
        print(f"quickdraft bench replicas: {sum(len(p.requests) for rp in plans for p in rp)} requests per mode built in "
              f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        blocks, rows = asyncio.run(_run_all(args, plans, out))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    doc = {**report.header(), "title": "quickdraft bench replicas", "replicas": args.replicas, "users": args.users,
           "rounds": args.rounds, "chars": args.chars, "modes": args.modes, "overrides": _overrides(args.set),
           "users_plan": [[{"user": p.user, "repo": p.repo, "file": p.file, "requests": len(p.requests)} for p in rp] for rp in plans],
           "blocks": blocks, "result": analyze(blocks, rows, args.modes), "requests": rows}
    report.write_json(out / "replicas.json", doc)
    md = markdown(doc)
    (out / "replicas.md").write_text(md)
    print(md)
    print(f"quickdraft bench replicas: wrote {out / 'replicas.json'} and {out / 'replicas.md'}")
    return 0 if all(b["failed"] == 0 for b in blocks) else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replicas", type=int, default=2, help="engine replicas of each server")
    p.add_argument("--users", type=int, default=6, help="users typing at once, each in a repository of their own")
    p.add_argument("--rounds", type=int, default=2, help="rounds; each runs every mode on fresh servers")
    p.add_argument("--chars", type=int, default=150, help="characters each user types per round (at least)")
    p.add_argument("--modes", type=lambda s: [m for m in s.split(",") if m], default=[SESSION, ROUND_ROBIN],
                   help="replicas.routing values compared (default session,round_robin; ratios are the second over the first)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override for every server (repeatable)")
    p.add_argument("--out", default="bench/results/replicas")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m quickdraft.bench.replicas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
