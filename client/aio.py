"""asyncio client: ``AsyncCompletionClient``."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable, Mapping

import grpc
import grpc.aio

from quickdraft.client.request import RetryPolicy, build_report, build_request, call_metadata, channel_options, check_token_transport
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionStub


class AsyncCompletionStream:
    """``async for`` over text deltas; ``final`` is set once the stream has ended.

    Breaking out of the loop, ``cancel()``, or cancelling the task that
    iterates cancels the RPC.
    """

    def __init__(self, start_call, retry: RetryPolicy):
        self._start_call = start_call
        self._retry = retry
        self._call: grpc.aio.UnaryStreamCall | None = None
        self._cancelled = False
        self.final: pb.CompleteFinal | None = None

    @property
    def prompt_fit(self) -> pb.PromptFit | None:
        """What the server cut from the prompt to fit its budget; None until the stream has ended."""
        return None if self.final is None else self.final.prompt_fit

    async def __aiter__(self) -> AsyncIterator[str]:
        attempt = 0
        got_tokens = False
        while True:
            attempt += 1
            self._call = self._start_call()
            try:
                async for msg in self._call:
                    if msg.HasField("final"):
                        self.final = msg.final
                    if msg.text:
                        got_tokens = True
                        yield msg.text
                return
            except grpc.aio.AioRpcError as err:
                if self._cancelled:
                    return
                if not self._retry.should_retry(err.code(), attempt, got_tokens):
                    raise
                await asyncio.sleep(self._retry.backoff(attempt))
            finally:
                if self.final is None and self._call is not None and not self._call.done():
                    self._call.cancel()

    def cancel(self) -> None:
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    async def text(self) -> str:
        return "".join([t async for t in self])


class AsyncCompletionClient:
    """asyncio client for the quickdraft gRPC API (same arguments as CompletionClient)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy = RetryPolicy(),
        metadata: Mapping[str, str] | None = None,
    ):
        check_token_transport(target, secure=credentials is not None, token=token, metadata=metadata)
        opts = channel_options()
        self._channel = (
            grpc.aio.secure_channel(target, credentials, options=opts)
            if credentials
            else grpc.aio.insecure_channel(target, options=opts)
        )
        self._stub = CompletionStub(self._channel)
        self._metadata = call_metadata(token, metadata)
        self._timeout = timeout
        self._retry = retry

    def complete(self, request: pb.CompleteRequest | None = None, *, timeout: float | None = None, **fields) -> AsyncCompletionStream:
        msg = build_request(request, **fields)
        deadline = timeout if timeout is not None else self._timeout
        return AsyncCompletionStream(
            lambda: self._stub.Complete(msg, timeout=deadline, metadata=self._metadata), self._retry
        )

    async def server_info(self, timeout: float | None = 10.0) -> pb.ServerInfo:
        return await self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout, metadata=self._metadata)

    async def controller_state(self, timeout: float | None = 10.0) -> pb.ControllerState:
        return await self._stub.GetControllerState(
            pb.GetControllerStateRequest(), timeout=timeout, metadata=self._metadata
        )

    async def pin_speculation(self, config: str, *, allow_rebuild: bool = False, timeout: float | None = 600.0) -> pb.PinSpeculationResponse:
        """Fix the speculative config (e.g. "p5", "ar3", "off") until released with ""."""
        return await self._stub.PinSpeculation(
            pb.PinSpeculationRequest(config=config, allow_rebuild=allow_rebuild), timeout=timeout, metadata=self._metadata
        )

    async def report_outcomes(self, outcomes: Iterable[pb.Outcome], *, request_id_prefix: str = "",
                              timeout: float | None = 5.0) -> pb.ReportOutcomesResponse:
        """Tell the server what became of its suggestions (shown, accepted, rejected)."""
        return await self._stub.ReportOutcomes(build_report(outcomes, request_id_prefix), timeout=timeout, metadata=self._metadata)

    async def outcome_stats(self, timeout: float | None = 10.0) -> pb.OutcomeStats:
        """Acceptance rate, accepted characters and wasted tokens since the server started."""
        return await self._stub.GetOutcomeStats(pb.GetOutcomeStatsRequest(), timeout=timeout, metadata=self._metadata)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncCompletionClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
