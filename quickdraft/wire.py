"""What clients and the server share beyond the protobuf messages.

The wire layer is ``quickdraft.v1`` (messages and stubs generated from
``proto/``), this module (metadata keys and names the API gives its enums)
and ``quickdraft.prompt_format`` (the model's prompt format). The server and
the clients both import it; it imports neither of them.
"""

from __future__ import annotations

from quickdraft.v1.completion_pb2 import LatencyClass

# Trailing metadata of a Complete refused (INVALID_ARGUMENT) for its prompt's
# length: the prompt's true token count and the limit, so a client without the
# model's tokenizer (the LSP bridge) can size its next prompt.
PROMPT_TOKENS_KEY = "quickdraft-prompt-tokens"
PROMPT_LIMIT_KEY = "quickdraft-prompt-limit"

# The metadata key (gRPC) and header (HTTP) that carry the bearer token.
AUTHORIZATION_KEY = "authorization"

# Latency classes by the name clients, metrics and the controller use.
LATENCY_CLASSES: dict[str, int] = {
    "inline": LatencyClass.LATENCY_CLASS_INLINE,
    "chat": LatencyClass.LATENCY_CLASS_CHAT,
    "batch": LatencyClass.LATENCY_CLASS_BATCH,
}


def bearer(token: str) -> str:
    """The authorization value for ``token``, as clients send it and the server expects it."""
    return f"Bearer {token}"
