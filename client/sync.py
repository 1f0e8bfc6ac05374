"""Blocking client: ``CompletionClient``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

import grpc

from quickdraft.client.request import RetryPolicy, build_report, build_request, call_metadata, channel_options, check_token_transport
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionStub


@dataclass
class CompletionResult:
    text: str
    final: pb.CompleteFinal

    @property
    def prompt_fit(self) -> pb.PromptFit:
        """What the server cut from the prompt to fit its budget (``truncated`` false: nothing)."""
        return self.final.prompt_fit


class CompletionStream:
    """Iterates over text deltas; ``final`` is set once the stream has ended.

    Leaving the loop early does not cancel by itself (the iterator may be
    resumed); call ``cancel()`` or use the stream as a context manager.
    """

    def __init__(self, start_call, retry: RetryPolicy):
        self._start_call = start_call
        self._retry = retry
        self._call = None
        self._cancelled = False
        self.final: pb.CompleteFinal | None = None

    @property
    def prompt_fit(self) -> pb.PromptFit | None:
        """What the server cut from the prompt to fit its budget; None until the stream has ended."""
        return None if self.final is None else self.final.prompt_fit

    def __iter__(self) -> Iterator[str]:
        attempt = 0
        got_tokens = False
        while True:
            attempt += 1
            self._call = self._start_call()
            try:
                for msg in self._call:
                    if msg.HasField("final"):
                        self.final = msg.final
                    if msg.text:
                        got_tokens = True
                        yield msg.text
                return
            except grpc.RpcError as err:
                if self._cancelled:
                    return
                code = err.code() if hasattr(err, "code") else None
                if not self._retry.should_retry(code, attempt, got_tokens):
                    raise
                time.sleep(self._retry.backoff(attempt))

    def cancel(self) -> None:
        """Cancel the RPC; the server aborts the engine request."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> "CompletionStream":
        return self

    def __exit__(self, *exc) -> None:
        if self.final is None:
            self.cancel()


class CompletionClient:
    """Blocking client for the quickdraft gRPC API.

    ``target`` is ``host:port``. ``credentials`` turns on TLS (see
    ``quickdraft.client.request.make_credentials``); ``token`` is sent as a
    bearer token in the call metadata; without ``credentials`` it is only
    allowed to a loopback target (127.0.0.0/8, ::1, localhost, unix:), else
    ``PlaintextTokenError`` is raised here, before anything is sent.
    """

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
            grpc.secure_channel(target, credentials, options=opts)
            if credentials
            else grpc.insecure_channel(target, options=opts)
        )
        self._stub = CompletionStub(self._channel)
        self._metadata = call_metadata(token, metadata)
        self._timeout = timeout
        self._retry = retry

    def complete(self, request: pb.CompleteRequest | None = None, *, timeout: float | None = None, **fields) -> CompletionStream:
        """Start a streaming completion; see ``build_request`` for the fields."""
        msg = build_request(request, **fields)
        deadline = timeout if timeout is not None else self._timeout
        return CompletionStream(
            lambda: self._stub.Complete(msg, timeout=deadline, metadata=self._metadata), self._retry
        )

    def complete_text(self, request: pb.CompleteRequest | None = None, *, timeout: float | None = None, **fields) -> CompletionResult:
        """Run a completion to its end and return the whole text with the final figures."""
        stream = self.complete(request, timeout=timeout, **fields)
        text = "".join(stream)
        assert stream.final is not None, "server closed the stream without a final message"
        return CompletionResult(text=text, final=stream.final)

    def server_info(self, timeout: float | None = 10.0) -> pb.ServerInfo:
        return self._stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout, metadata=self._metadata)

    def controller_state(self, timeout: float | None = 10.0) -> pb.ControllerState:
        return self._stub.GetControllerState(pb.GetControllerStateRequest(), timeout=timeout, metadata=self._metadata)

    def pin_speculation(self, config: str, *, allow_rebuild: bool = False, timeout: float | None = 600.0) -> pb.PinSpeculationResponse:
        """Fix the speculative config (e.g. "p5", "ar3", "off") until released with ""."""
        return self._stub.PinSpeculation(pb.PinSpeculationRequest(config=config, allow_rebuild=allow_rebuild), timeout=timeout,
                                         metadata=self._metadata)

    def report_outcomes(self, outcomes: Iterable[pb.Outcome], *, request_id_prefix: str = "", timeout: float | None = 5.0) -> pb.ReportOutcomesResponse:
        """Tell the server what became of its suggestions (shown, accepted, rejected)."""
        return self._stub.ReportOutcomes(build_report(outcomes, request_id_prefix), timeout=timeout, metadata=self._metadata)

    def outcome_stats(self, timeout: float | None = 10.0) -> pb.OutcomeStats:
        """Acceptance rate, accepted characters and wasted tokens since the server started."""
        return self._stub.GetOutcomeStats(pb.GetOutcomeStatsRequest(), timeout=timeout, metadata=self._metadata)

    def wait_ready(self, timeout: float = 60.0) -> None:
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "CompletionClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
