"""What the LSP bridge adds over calling gRPC directly (target: <= 5 ms at p50).

For cursors at the ends of lines of a realistic file, times

- direct: ``AsyncCompletionClient.complete`` with the very request the bridge
  would build for that cursor (built beforehand, not timed), and
- bridge: ``textDocument/inlineCompletion`` sent by an LSP client to
  ``python -m quickdraft.lsp_bridge`` over stdio, to the response,

alternating the two per cursor. The bridge's share is everything it does:
JSON-RPC over pipes, the syntax gate, context building, the gRPC call and
post-processing. Without ``--server`` a fake Completion servicer answers in
this process (so the gRPC part is tiny and the difference is all bridge).

    python -m quickdraft.bench.lsp_overhead [--server HOST:PORT] [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time

import grpc.aio
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from quickdraft.bench.lsp_common import generate_python, percentiles, report, start_bridge
from quickdraft.client import AsyncCompletionClient, RetryPolicy
from quickdraft.lsp_bridge.completer import make_request
from quickdraft.lsp_bridge.context import Budget, ContextEngine
from quickdraft.lsp_bridge.postprocess import gate
from quickdraft.lsp_bridge.settings import Settings
from quickdraft.lsp_bridge.workspace import Workspace
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionServicer, add_CompletionServicer_to_server

TARGET_P50_MS = 5.0


class CannedCompletion(CompletionServicer):
    """Answers every request at once with the same short completion."""

    async def Complete(self, request, context):
        for delta in ("value = ", "compute(", "item)"):
            yield pb.CompleteResponse(text=delta)
        yield pb.CompleteResponse(final=pb.CompleteFinal(finish_reason=pb.FINISH_REASON_STOP))

    async def GetServerInfo(self, request, context):
        return pb.ServerInfo(server_version="canned", limits=pb.Limits(prompt_budget_tokens=1536, chars_per_token=3.5))


async def _start_canned() -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add_CompletionServicer_to_server(CannedCompletion(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _bridge_client(address: str, root: str) -> tuple[LanguageClient, asyncio.Event]:
    client, up, _ = await start_bridge(address, root, "lsp-overhead-bench", settings={"debounceMs": 0})
    return client, up


async def run(args: argparse.Namespace) -> dict:
    server = None
    address = args.server
    if address is None:
        server, address = await _start_canned()
    direct = AsyncCompletionClient(address, retry=RetryPolicy(max_attempts=1))
    info = await direct.server_info()
    budget = Budget(info.limits.prompt_budget_tokens or 1536, info.limits.chars_per_token or 3.5)

    with tempfile.TemporaryDirectory() as root:
        text = generate_python(args.lines, args.seed)
        uri = "file://" + os.path.join(root, "service.py")
        ws = Workspace([root])
        opened = ws.open(uri, text, language_id="python")
        engine = ContextEngine(ws)
        settings = Settings(max_tokens=args.max_tokens)
        doc = opened.doc
        rng = random.Random(args.seed)
        lines = [i for i in range(doc.line_count) if doc.line_text(i).strip()]
        rng.shuffle(lines)
        cursors = []
        for line in lines:
            offset = doc.line_range(line)[1]
            if gate(opened, opened.tree, offset, in_comments=False, in_strings=False) is None:
                cursors.append((line, doc.position_at(offset)[1], make_request(ws, engine, opened, offset, budget, settings)[0]))
            if len(cursors) == args.samples + args.warmup:
                break

        client, up = await _bridge_client(address, root)
        await up.wait()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )
        direct_ms, bridge_ms = [], []
        empty = 0
        for i, (line, character, request) in enumerate(cursors):
            params = types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line, character),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            )
            order = ("direct", "bridge") if i % 2 == 0 else ("bridge", "direct")
            for which in order:
                t0 = time.perf_counter()
                if which == "direct":
                    await direct.complete(request).text()
                else:
                    result = await client.text_document_inline_completion_async(params)
                    empty += not result.items
                elapsed = (time.perf_counter() - t0) * 1e3
                if i >= args.warmup:
                    (direct_ms if which == "direct" else bridge_ms).append(elapsed)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    await direct.close()
    if server is not None:
        await server.stop(0)

    d, b = percentiles(direct_ms), percentiles(bridge_ms)
    overhead_p50 = b["p50_ms"] - d["p50_ms"]
    rows = [
        {"path": "direct gRPC", **d},
        {"path": "through the bridge", **b},
        {"path": "bridge overhead (p50 difference)", "n": b["n"], "p50_ms": overhead_p50, "vs_target": overhead_p50 / TARGET_P50_MS},
    ]
    report(
        f"Bridge overhead over direct gRPC ({'fake servicer' if args.server is None else address}, target p50 <= {TARGET_P50_MS} ms)",
        rows,
        [("path", "path"), ("n", "n"), ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"), ("vs_target", "p50 overhead / target")],
        args.json,
        {"server": args.server or "fake", "empty_bridge_results": empty, "target_p50_ms": TARGET_P50_MS},
    )
    return {"rows": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", help="HOST:PORT of a real quickdraft server (default: a fake servicer in process)")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="lsp_overhead.json")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
