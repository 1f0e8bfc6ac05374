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
    """Longest rendered prompt; a longer one is cut to fit, nearest the cursor
    kept (refused, with the request's strict_prompt). None: model.max_model_len
    less 16 tokens."""
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
    max_prompt_chars: int | None = None
    """Longest prompt text (prefix + suffix + context files, in characters) a
    tokenizer is handed: a longer prompt is cut to it by characters before
    any tokenizer runs (refused, with strict_prompt). None: max_prompt_tokens
    x 8 (code runs 3-4 characters per token, so only a prompt far over
    max_prompt_tokens meets it)."""
    tokenizer_threads: int = 2
    """Threads that tokenize long prompts off the event loop. Each client
    runs at most one tokenization at a time; the others wait their turn."""
    tokenizer_share: float = 0.05
    """Most of one tokenizer thread's time one client may use, averaged over
    about 10 s; past it, that client's long prompts wait. A busy tokenizer
    thread takes a core from the engine, so this bounds what one client's
    oversized prompts can cost everyone else's streams: 0.05 is 0.5 s of
    tokenizing per 10 s, some 150 prompts at the embedded model's largest
    (8,064 characters), 25 at the GPU preset's. 1.0: a whole thread."""
    blank_line_from_line_start: bool = True
    """A fill-in-the-middle request whose cursor sits in a blank line's
    indentation (only whitespace before it on its line and after it) is asked
    from that line's start, as the LSP bridge asks: the model writes the
    whole line with its indentation, as in its training, and the server drops
    the indentation the client already typed from the answer's start. False:
    the prompt is cut at the cursor as sent (for a model trained otherwise).
    Prompts already cut at a line start (the bridge's), raw prompts and the
    "plain" prompt format are never changed."""
    prefix_only: str = "plain"
    """How a request without a suffix is rendered in a fill-in-the-middle
    prompt format: "plain" (the prefix as text for the model to continue) or
    "fim" (an empty suffix: the middle at the end of the file). The embedded
    model answers prefix-only prompts far better as "fim" (docs/lsp.md,
    "Prefix-only requests"); the benchmarks' prefix-only prompts are measured
    as "plain". A client that sends an empty suffix always gets "fim"; raw
    prompts and the "plain" prompt format are never changed."""
    max_health_watchers: int = 16
    """grpc.health.v1 Watch streams open at once (all callers together);
    more are RESOURCE_EXHAUSTED."""
