"""[limits]: admission control."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LimitsConfig:
    """Admission control. Over a limit is RESOURCE_EXHAUSTED or INVALID_ARGUMENT, naming the limit."""

    max_concurrent_streams: int = 64
    """Completion streams open at once, all clients together."""
    max_streams_per_client: int = 32
    """Streams open at once per client (bearer token, or peer address)."""
    max_prompt_tokens: int | None = None
    """Longest rendered prompt. None: model.max_model_len less 16 tokens."""
    prompt_budget_tokens: int | None = None
    """Prompt size clients should aim for (announced in GetServerInfo). None: the preset's."""
    default_max_tokens: int = 64
    """Completion length when a request says 0."""
    max_output_tokens: int = 512
    """Largest max_tokens accepted."""
    max_context_files: int = 32
    """Most context files (other open files, snippets) one request may carry."""
    max_stop_sequences: int = 16
    """Most stop sequences one request may carry."""
    max_stop_length: int = 128
    """Longest stop sequence, in characters."""
    max_request_bytes: int = 1024 * 1024
    """Largest CompleteRequest (prefix + suffix + context files)."""
