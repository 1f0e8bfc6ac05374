"""A stand-in model for ``quickdraft bench typing --oracle P``: it knows what the typist will type.

The embedded model's suggestions almost never match what comes next in the
held-out code (on the typing sessions, 0.4 matching characters per
suggestion), so the typist accepts none and prefetching after an acceptance
never runs. To measure what the bridge does around acceptances, this gRPC
servicer stands in for the server: it answers each ``Complete`` with the text
the typist is about to type (the rest of the line, or the next lines for a
block), right for a share ``P`` of the places asked (chosen by file and place, so
that every variant meets the same right and wrong answers) and
with a wrong word inserted otherwise, after a fixed time to the first token
and a fixed time per token (4 characters each). It keeps the figures the real
server keeps for the benchmark: output tokens of cancelled requests, and of
finished ones never reported shown (judged when the figures are read, after
``GRACE_S``). Engine figures (the prefix cache) stay 0: there is no engine.

``EngineBacked`` (``--oracle P --oracle-engine``) keeps the engine: each
``Complete`` goes on to the real server, whose stream sets the pace (its time
to the first token, its tokens) and whose figures are read (prefix cache,
wasted tokens, outcomes: the bridge's request ids and reports pass through),
while the text streamed back is the stand-in's, as many characters per
engine chunk as the engine wrote, the rest with the engine's final message.
So acceptances happen as often as ``P`` says, and what prefetching costs and
saves is the engine's.

The stand-in answers for the place the prompt asks about: the cursor, the
start of its line (a blank line's prompt starts it afresh), or the start of
the next line (the bridge's next-line prefetch, asked before Enter).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import grpc.aio

from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionServicer, add_CompletionServicer_to_server

CHARS_PER_TOKEN = 4
GRACE_S = 1.0
BLOCK_LINES = 3


@dataclass
class _Finished:
    tokens: int
    at: float


@dataclass
class Oracle(CompletionServicer):
    """``sessions``: file path (workspace-relative) -> the typing Session typing it."""

    accuracy: float
    ttft_ms: float = 80.0
    tpot_ms: float = 10.0
    sessions: dict = field(default_factory=dict)
    cancelled_tokens: int = 0
    never_shown_tokens: int = 0
    shown: set = field(default_factory=set)
    _finished: dict = field(default_factory=dict)

    def answer(self, request: pb.CompleteRequest) -> str:
        """What the typist will type where the request asks, right or wrong."""
        session = self.sessions.get(request.file_path)
        if session is None or session.typo:
            return "pass"
        final = session.before[: session.start] + session.span + session.before[session.start :]
        asked = asked_at(final, session.start + session.i, request.prefix)
        if asked is None:
            return "pass"
        text = final[asked : session.start + len(session.span)]
        lines = text.split("\n")
        text = lines[0] if "\n" in request.stop else "\n".join(lines[:BLOCK_LINES])
        rng = random.Random(f"{request.file_path}:{asked}")
        if text.strip() and rng.random() >= self.accuracy:
            words = text.split(" ")
            at = rng.randrange(len(words))
            text = " ".join(words[:at] + ["wrong"] + words[at:])
        return text

    async def Complete(self, request, context):
        text = self.answer(request)
        sent = 0
        try:
            await asyncio.sleep(self.ttft_ms / 1000)
            for k in range(0, len(text), CHARS_PER_TOKEN):
                if k:
                    await asyncio.sleep(self.tpot_ms / 1000)
                yield pb.CompleteResponse(text=text[k : k + CHARS_PER_TOKEN])
                sent += 1
        except asyncio.CancelledError:
            self.cancelled_tokens += sent
            raise
        self._finished[request.request_id] = _Finished(sent, time.monotonic())
        prompt = len(request.prefix) + len(request.suffix) + sum(len(f.content) + len(f.path) for f in request.context_files)
        yield pb.CompleteResponse(final=pb.CompleteFinal(finish_reason=pb.FINISH_REASON_STOP, prompt_tokens=max(1, int(prompt / 3.45)),
                                                         completion_tokens=sent))

    async def GetServerInfo(self, request, context):
        return pb.ServerInfo(server_version="typing-oracle", model="oracle", state="serving",
                             limits=pb.Limits(prompt_budget_tokens=768, chars_per_token=3.45))

    async def ReportOutcomes(self, request, context):
        for outcome in request.outcomes:
            if outcome.kind == pb.OUTCOME_KIND_SHOWN:
                self.shown.add(outcome.request_id)
        return pb.ReportOutcomesResponse(recorded=len(request.outcomes))

    async def GetOutcomeStats(self, request, context):
        now = time.monotonic()
        for rid in [r for r, f in self._finished.items() if f.at + GRACE_S <= now]:
            finished = self._finished.pop(rid)
            if rid not in self.shown:
                self.never_shown_tokens += finished.tokens
        return pb.OutcomeStats(total=pb.OutcomeFigures(shown=len(self.shown), wasted_tokens_cancelled=self.cancelled_tokens,
                                                       wasted_tokens_never_shown=self.never_shown_tokens), never_shown_grace_s=GRACE_S)


def asked_at(final: str, cursor: int, prefix: str, tail: int = 200) -> int | None:
    """Where in ``final`` (the file as it will be) a prompt's prefix ends: at the
    cursor, at the start of its line, or after the line break that follows it;
    None when the prefix ends none of these."""
    end = prefix[-tail:]
    line_start = final.rfind("\n", 0, cursor) + 1
    candidates = [cursor, line_start]
    if final.startswith("\n", cursor):
        candidates.append(cursor + 1)
    return next((q for q in candidates if final[:q].endswith(end)), None)


@dataclass
class EngineBacked(Oracle):
    """The stand-in's text at the real server's pace and cost (``upstream``: its HOST:PORT)."""

    upstream: str = ""
    _channel: object = None
    _stub: object = None

    def stub(self):
        if self._stub is None:
            from quickdraft.v1.completion_pb2_grpc import CompletionStub

            self._channel = grpc.aio.insecure_channel(self.upstream)
            self._stub = CompletionStub(self._channel)
        return self._stub

    async def Complete(self, request, context):
        text = self.answer(request)
        call = self.stub().Complete(request)
        sent = 0
        try:
            async for response in call:
                if response.HasField("final"):
                    if sent < len(text):
                        yield pb.CompleteResponse(text=text[sent:])
                    yield response
                    return
                n = max(1, len(response.text))
                if sent < len(text):
                    yield pb.CompleteResponse(text=text[sent : sent + n])
                    sent += n
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details())
        finally:
            call.cancel()  # the bridge cancelled: so does the engine

    async def GetServerInfo(self, request, context):
        return await self.stub().GetServerInfo(request)

    async def ReportOutcomes(self, request, context):
        return await self.stub().ReportOutcomes(request)

    async def GetOutcomeStats(self, request, context):
        return await self.stub().GetOutcomeStats(request)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


async def start(oracle: Oracle) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add_CompletionServicer_to_server(oracle, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
