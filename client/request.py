"""Request building, channel options and the retry policy shared by both clients."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from typing import Iterable, Mapping

import grpc

from quickdraft.v1.completion_pb2 import CompleteRequest, ContextFile, Outcome, ReportOutcomesRequest
from quickdraft.wire import AUTHORIZATION_KEY, LATENCY_CLASSES, bearer

# gRPC target schemes that never leave this machine.
_LOCAL_SCHEMES = ("unix:", "unix-abstract:")


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
    strict_prompt: bool = False,
    session: str = "",
) -> CompleteRequest:
    """A CompleteRequest from keyword arguments (or the given one, unchanged).

    A prompt over the server's budget is cut to fit, nearest the cursor kept
    (the final message's ``prompt_fit`` says what went); ``strict_prompt``
    makes it INVALID_ARGUMENT instead, for callers that fit prompts themselves.
    ``session`` (e.g. "user/repository") keeps a session's requests on one
    engine replica of a replicated server, where its prefix cache is; empty:
    the server derives it from the caller and ``repo_name``.
    """
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
        strict_prompt=strict_prompt,
        session=session,
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


def build_report(outcomes: Iterable[Outcome], request_id_prefix: str = "") -> ReportOutcomesRequest:
    """A ReportOutcomesRequest; ``request_id_prefix`` (the session's request id
    prefix) opts this session's requests into the server's never-shown count."""
    return ReportOutcomesRequest(outcomes=list(outcomes), request_id_prefix=request_id_prefix)


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


class PlaintextTokenError(ValueError):
    """A bearer token would cross the network unencrypted."""


def is_loopback_host(host: str) -> bool:
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # any other name may resolve anywhere
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _split_host(address: str) -> str:
    """The host of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    if address.startswith("["):
        return address[: address.find("]") + 1] if "]" in address else address
    if address.count(":") > 1:  # bare IPv6, maybe with a port after its last colon
        try:
            ipaddress.ip_address(address.split("%")[0])
            return address
        except ValueError:
            pass
    return address.rpartition(":")[0] if ":" in address else address


def target_hosts(target: str) -> list[str] | None:
    """The hosts a gRPC target names; None for a local (unix) socket."""
    if target.startswith(_LOCAL_SCHEMES):
        return None
    if target.startswith(("ipv4:", "ipv6:")):
        return [_split_host(a) for a in target.partition(":")[2].split(",")]
    if target.startswith("dns:"):
        rest = target[len("dns:") :]
        if rest.startswith("//"):
            authority, _, rest = rest[2:].partition("/")
            if authority:  # that DNS server may answer anything for "localhost"
                host = _split_host(rest)
                return [host if host.lower().rstrip(".") != "localhost" else f"{host} (via {authority})"]
        return [_split_host(rest)]
    return [_split_host(target)]


def is_loopback_target(target: str) -> bool:
    """Whether ``target`` only reaches this machine: 127.0.0.0/8, ::1,
    localhost, or a unix socket. Anything else (a name, another scheme) is
    not."""
    hosts = target_hosts(target)
    return hosts is None or (bool(hosts) and all(is_loopback_host(h) for h in hosts))


def check_token_transport(
    target: str, *, secure: bool, token: str | None, metadata: Mapping[str, str] | None = None
) -> None:
    """Refuse a bearer token on a plaintext channel to another machine: anyone
    on the path could read it and reuse it (and read the code sent with it)."""
    has_token = bool(token) or any(k.lower() == AUTHORIZATION_KEY for k in (metadata or {}))
    if secure or not has_token or is_loopback_target(target):
        return
    hosts = target_hosts(target) or [target]
    raise PlaintextTokenError(
        f"refusing to send a bearer token without TLS to {', '.join(hosts)} ({target}): "
        "turn on TLS (credentials=make_credentials(...); `--tls` / the `tls` setting in the editor) "
        "or connect to a loopback address (127.0.0.1, ::1, localhost) or a unix: socket"
    )
