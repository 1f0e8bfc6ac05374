"""The gRPC side: one channel to the quickdraft server, its limits, its health.

While the server is unreachable, completions are answered at once with
nothing (no RPC is attempted) and a background task probes it with
exponential backoff; the first successful probe marks it up again and
refreshes the prompt budget from ``GetServerInfo``. A configuration the
client refuses (a bearer token without TLS to another machine) leaves the
backend "refused": nothing is sent, and ``error`` says why. The bytes-per-token ratio
that turns the budget into bytes is learned from every answer
(``token_ratio.py``); a prompt refused as too long is reported as such, so
the caller can rebuild it smaller once.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import grpc.aio

from quickdraft.client import AsyncCompletionClient, PlaintextTokenError, RetryPolicy
from quickdraft.client.request import make_credentials
from quickdraft.lsp_bridge.context import Budget
from quickdraft.lsp_bridge.token_ratio import BytesPerToken, prompt_bytes
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import PROMPT_TOKENS_KEY

log = logging.getLogger(__name__)

UP = "up"
DOWN = "down"
UNKNOWN = "unknown"
REFUSED = "refused"  # the configuration itself is unsafe; no retry until it changes

# Codes that mean "the server is not there (right now)", as opposed to a bad request.
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class Outcome(enum.Enum):
    ANSWERED = "answered"  # fully, or until the caller stopped it
    FAILED = "failed"  # unreachable, cancelled or refused
    PROMPT_TOO_LONG = "prompt too long"  # refused for its length; the ratio has been corrected


@dataclass(frozen=True)
class Sized:
    """What ``complete_within_budget`` did: its outcome, the request that ran last, and whether it was rebuilt."""

    outcome: Outcome
    request: pb.CompleteRequest
    rebuilt: bool


@dataclass(frozen=True)
class BackendConfig:
    address: str = "127.0.0.1:50051"
    token: str | None = None
    tls: bool = False
    tls_root_cert: bytes | None = None
    request_timeout_s: float = 10.0
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0


class Backend:
    def __init__(self, config: BackendConfig, on_state: Callable[[str, pb.ServerInfo | None], None] | None = None):
        self.config = config
        self.state = UNKNOWN
        self.info: pb.ServerInfo | None = None
        self.budget = Budget()
        self.ratio = BytesPerToken(self.budget.chars_per_token)
        self._on_state = on_state
        self._reconnect_task: asyncio.Task | None = None
        # Why the configuration was refused (None: it was not).
        self.error: str | None = None
        self._client = self._make_client(config)

    def _make_client(self, config: BackendConfig) -> AsyncCompletionClient | None:
        credentials = make_credentials(config.tls_root_cert) if config.tls else None
        try:
            # No retries inside the client: a stale inline completion is worthless,
            # and reconnecting is this class's job.
            client = AsyncCompletionClient(
                config.address, credentials=credentials, token=config.token, retry=RetryPolicy(max_attempts=1)
            )
        except PlaintextTokenError as err:
            # Refused before anything is sent; the editor hears why (state REFUSED)
            # and the bridge keeps running for a corrected configuration.
            self.error = str(err)
            log.error("%s", err)
            return None
        self.error = None
        return client

    async def reconfigure(self, config: BackendConfig) -> None:
        if config == self.config:
            return
        old = self._client
        self.config = config
        self._client = self._make_client(config)
        self._stop_reconnect()
        self.state = UNKNOWN
        if old is not None:
            await old.close()
        self.start()

    def start(self) -> None:
        """Fetch the server's limits in the background (and keep trying while it is down)."""
        if self._client is None:
            self._set_state(REFUSED)
            return
        if self._reconnect_task is None or self._reconnect_task.done():
            self._reconnect_task = asyncio.ensure_future(self._reconnect())

    async def close(self) -> None:
        self._stop_reconnect()
        if self._client is not None:
            await self._client.close()

    def _stop_reconnect(self) -> None:
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            self._reconnect_task = None

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        log.info("quickdraft server %s is %s", self.config.address, state)
        if self._on_state is not None:
            self._on_state(state, self.info)

    def _mark_down(self, err: grpc.aio.AioRpcError) -> None:
        log.warning("quickdraft server %s unreachable: %s", self.config.address, err.code().name)
        self._set_state(DOWN)
        self.start()

    async def _reconnect(self) -> None:
        assert self._client is not None
        delay = self.config.initial_backoff_s
        while True:
            try:
                info = await self._client.server_info(timeout=max(1.0, delay))
            except grpc.aio.AioRpcError as err:
                if err.code() not in _UNREACHABLE:
                    # Reachable but refusing (auth, unimplemented): complete anyway with defaults.
                    log.warning("GetServerInfo failed: %s %s", err.code().name, err.details())
                    self._set_state(UP)
                    return
                self._set_state(DOWN)
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self.config.max_backoff_s)
                continue
            self._apply_info(info)
            self._set_state(UP)
            return

    def _apply_info(self, info: pb.ServerInfo) -> None:
        self.info = info
        limits = info.limits
        self.budget = Budget(
            tokens=limits.prompt_budget_tokens or Budget().tokens,
            chars_per_token=limits.chars_per_token or Budget().chars_per_token,
        )
        self.ratio.announced = self.budget.chars_per_token

    def budget_for(self, document: str, language: str) -> Budget:
        """The server's token budget in this document's learned bytes per token."""
        return Budget(self.budget.tokens, self.ratio.value(document, language))

    @property
    def available(self) -> bool:
        return self._client is not None and self.state != DOWN

    async def report_outcomes(self, outcomes: list[pb.Outcome], request_id_prefix: str) -> grpc.StatusCode | None:
        """Send one batch of suggestion outcomes; None when the server took it,
        else why not (the batch is not retried: outcomes are figures, not work)."""
        if not self.available or self._client is None:
            return grpc.StatusCode.UNAVAILABLE
        try:
            await self._client.report_outcomes(outcomes, request_id_prefix=request_id_prefix, timeout=self.config.request_timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() not in _UNREACHABLE:
                log.warning("ReportOutcomes failed: %s %s", err.code().name, err.details())
            return err.code()
        return None

    async def complete_within_budget(
        self, build: Callable[[Budget], tuple[pb.CompleteRequest, Callable[[str], bool]]], *, document: str, language: str
    ) -> Sized:
        """``build(budget)`` -> (request, on_text); the prompt is built in this
        document's learned budget and, if the server refuses it as too long,
        built again once with the corrected ratio."""
        for attempt in range(2):
            request, on_text = build(self.budget_for(document, language))
            outcome = await self.complete(request, on_text, document=document, language=language)
            if outcome is not Outcome.PROMPT_TOO_LONG:
                break
        return Sized(outcome, request, rebuilt=attempt > 0)

    async def complete(self, request: pb.CompleteRequest, on_text: Callable[[str], bool], *, document: str = "", language: str = "") -> Outcome:
        """Stream one completion into ``on_text``, which returns True to stop early.

        ``document`` and ``language`` key what is learned about the prompt's
        bytes per token. Cancelling the calling task cancels the RPC, which
        aborts the request in the engine.
        """
        if not self.available or self._client is None:
            return Outcome.FAILED
        stream = self._client.complete(request, timeout=self.config.request_timeout_s)
        try:
            async for text in stream:
                if on_text(text):
                    stream.cancel()
                    break
        except grpc.aio.AioRpcError as err:
            if err.code() in _UNREACHABLE:
                self._mark_down(err)
            elif err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                tokens = dict(err.trailing_metadata() or ()).get(PROMPT_TOKENS_KEY)
                if tokens is not None and tokens.isdigit():
                    self.ratio.refused(document, language, prompt_bytes(request), int(tokens))
                    log.info("prompt of %s tokens refused as too long; shrinking to %.2f bytes per token", tokens, self.ratio.value(document, language))
                    return Outcome.PROMPT_TOO_LONG
                log.warning("Complete refused: %s", err.details())
            elif err.code() != grpc.StatusCode.CANCELLED:
                log.warning("Complete failed: %s %s", err.code().name, err.details())
            return Outcome.FAILED
        except asyncio.CancelledError:
            stream.cancel()
            raise
        if stream.final is not None:
            self.ratio.observe(document, language, prompt_bytes(request), stream.final.prompt_tokens)
        if self.state != UP:
            self._set_state(UP)
        return Outcome.ANSWERED
