"""Request building, channel options and the retry policy shared by both clients."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Mapping

import grpc

from quickdraft.v1.completion_pb2 import CompleteRequest, ContextFile
from quickdraft.wire import AUTHORIZATION_KEY, LATENCY_CLASSES, bearer


def build_request(
    request: CompleteRequest | None = None,
    *,
    prefix: str | None = None,
    suffix: str | None = None,
    context_files: Iterable[tuple[str, str]] | Mapping[str, str] | None = None,
    language_id: str = "",
    file_path: str = "",
    repo_name: str = "",
    max_tokens: int = 0,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: Iterable[str] = (),
    seed: int | None = None,
    latency_class: str | int = "inline",
    raw_prompt: bool = False,
    request_id: str = "",
) -> CompleteRequest:
    """A CompleteRequest from keyword arguments (or the given one, unchanged)."""
    if request is not None:
        return request
    if isinstance(latency_class, str):
        if latency_class not in LATENCY_CLASSES:
            raise ValueError(f"latency_class must be one of {sorted(LATENCY_CLASSES)}, got {latency_class!r}")
        latency_class = LATENCY_CLASSES[latency_class]
    if isinstance(context_files, Mapping):
        context_files = context_files.items()
    msg = CompleteRequest(
        request_id=request_id,
        prefix=prefix or "",
        context_files=[ContextFile(path=p, content=c) for p, c in (context_files or ())],
        language_id=language_id,
        file_path=file_path,
        repo_name=repo_name,
        max_tokens=max_tokens,
        stop=list(stop),
        latency_class=latency_class,
        raw_prompt=raw_prompt,
    )
    if suffix is not None:
        msg.suffix = suffix
    if temperature is not None:
        msg.temperature = temperature
    if top_p is not None:
        msg.top_p = top_p
    if seed is not None:
        msg.seed = seed
    return msg


@dataclass(frozen=True)
class RetryPolicy:
    """Retry on UNAVAILABLE, only before the first token has arrived.

    A completion that already streamed text is never replayed: the caller
    would see duplicated text.
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number ``attempt`` (1-based), with full jitter."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return random.uniform(0, cap)

    def should_retry(self, code: grpc.StatusCode | None, attempt: int, got_tokens: bool) -> bool:
        return code == grpc.StatusCode.UNAVAILABLE and not got_tokens and attempt < self.max_attempts


def channel_options(max_message_bytes: int = 16 * 1024 * 1024) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # Fail fast while the server is down instead of queueing RPCs.
        ("grpc.enable_retries", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]


def call_metadata(token: str | None, extra: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    md = [(k.lower(), v) for k, v in (extra or {}).items()]
    if token:
        md.append((AUTHORIZATION_KEY, bearer(token)))
    return md


def make_credentials(
    root_certificates: bytes | None = None,
    private_key: bytes | None = None,
    certificate_chain: bytes | None = None,
) -> grpc.ChannelCredentials:
    """TLS credentials; pass key and chain too for mutual TLS."""
    return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
