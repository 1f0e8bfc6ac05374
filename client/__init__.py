"""Python clients for the quickdraft gRPC API.

    from quickdraft.client import CompletionClient

    with CompletionClient("127.0.0.1:50051") as client:
        stream = client.complete(prefix="def add(a, b):\\n    ", suffix="\\n")
        for text in stream:
            print(text, end="")
        print(stream.final.ttft_ms)

``AsyncCompletionClient`` has the same surface with ``async for`` and ``await``.
Cancelling a stream (``stream.cancel()``, leaving the loop early, or a deadline)
cancels the RPC, and the server aborts the request inside the engine.
"""

from quickdraft.client.aio import AsyncCompletionClient, AsyncCompletionStream
from quickdraft.client.request import PlaintextTokenError, RetryPolicy, build_report, build_request, is_loopback_target
from quickdraft.client.sync import CompletionClient, CompletionResult, CompletionStream
from quickdraft.v1.completion_pb2 import (
    CompleteFinal,
    CompleteRequest,
    CompleteResponse,
    ContextFile,
    LatencyClass,
    Outcome,
    OutcomeStats,
    ServerInfo,
)

__all__ = [
    "AsyncCompletionClient",
    "AsyncCompletionStream",
    "CompleteFinal",
    "CompleteRequest",
    "CompleteResponse",
    "CompletionClient",
    "CompletionResult",
    "CompletionStream",
    "ContextFile",
    "LatencyClass",
    "Outcome",
    "OutcomeStats",
    "PlaintextTokenError",
    "RetryPolicy",
    "ServerInfo",
    "build_report",
    "build_request",
    "is_loopback_target",
]
