"""Checking a CompleteRequest's fields against the API's rules and the
configured limits, before any tokenizer runs.

Every refusal is a ``RequestError`` that names the field and the limit. A
prompt over its budget is refused here only with ``strict_prompt``; otherwise
``prompt_fitting`` cuts it, by characters before any tokenizer runs, then by
tokens where they are known.
"""

from __future__ import annotations

import math

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.errors import invalid
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import LATENCY_CLASSES

# Latency class names by enum value; unset means inline, what editors send most.
LATENCY_CLASS_NAMES: dict[int, str] = {pb.LATENCY_CLASS_UNSPECIFIED: "inline", **{v: k for k, v in LATENCY_CLASSES.items()}}
MAX_TEMPERATURE = 2.0
MAX_REQUEST_ID = 128


def prompt_chars(req: pb.CompleteRequest) -> int:
    """Characters of prompt text: prefix, suffix and context files."""
    return len(req.prefix) + len(req.suffix) + sum(len(f.content) for f in req.context_files)


def check(req: pb.CompleteRequest, cfg: QuickdraftConfig) -> None:
    """Field checks that need no tokenizer, sizes first: nothing here reads a
    string character by character before its size has passed."""
    lim = cfg.limits
    size = req.ByteSize()
    if size > lim.max_request_bytes:
        raise invalid(None, f"request is {size} bytes; the limit is limits.max_request_bytes = {lim.max_request_bytes}")
    chars = prompt_chars(req)
    if req.strict_prompt and chars > cfg.max_prompt_chars():
        # Refused here, before any tokenizer runs: a prompt this long costs the
        # tokenizer real time, and cannot fit max_prompt_tokens anyway.
        raise invalid("prefix", f"the prompt is {chars} characters; the limit is limits.max_prompt_chars = {cfg.max_prompt_chars()}, "
                                f"far past limits.max_prompt_tokens = {cfg.max_prompt_tokens()} "
                                f"(aim for GetServerInfo.limits.prompt_budget_tokens = {cfg.prompt_budget_tokens()} tokens); "
                                "strict_prompt is set, so the server does not cut it")
    if len(req.request_id) > MAX_REQUEST_ID:
        raise invalid("request_id", f"{len(req.request_id)} characters; at most {MAX_REQUEST_ID}")
    if not req.request_id.isprintable():
        # It is echoed in logs and traces: no newlines or control characters (forged log lines).
        raise invalid("request_id", "must be printable characters (no newlines or control characters)")
    if not req.prefix and not req.HasField("suffix") and not req.context_files:
        raise invalid("prefix", "empty prompt (send the text before the cursor, a suffix, or context files)")
    if req.raw_prompt and (req.HasField("suffix") or req.context_files):
        raise invalid("raw_prompt", "a raw prompt is sent whole in prefix; leave suffix and context_files empty")
    if req.max_tokens < 0:
        raise invalid("max_tokens", f"{req.max_tokens} is negative; use 1..{lim.max_output_tokens}, or 0 for the default ({lim.default_max_tokens})")
    if req.max_tokens > lim.max_output_tokens:
        raise invalid("max_tokens", f"{req.max_tokens} exceeds limits.max_output_tokens = {lim.max_output_tokens}")
    if req.HasField("temperature") and not (math.isfinite(req.temperature) and 0.0 <= req.temperature <= MAX_TEMPERATURE):
        raise invalid("temperature", f"{req.temperature} is outside 0..{MAX_TEMPERATURE}")
    if req.HasField("top_p") and not (math.isfinite(req.top_p) and 0.0 < req.top_p <= 1.0):
        raise invalid("top_p", f"{req.top_p} is outside (0, 1]")
    if req.HasField("seed") and req.seed < 0:
        raise invalid("seed", f"{req.seed} is negative; use 0..2^63-1")
    if len(req.stop) > lim.max_stop_sequences:
        raise invalid("stop", f"{len(req.stop)} stop sequences; the limit is limits.max_stop_sequences = {lim.max_stop_sequences}")
    for i, s in enumerate(req.stop):
        if not s:
            raise invalid("stop", "empty stop sequence", at=f"[{i}]")
        if len(s) > lim.max_stop_length:
            raise invalid("stop", f"{len(s)} characters; the limit is limits.max_stop_length = {lim.max_stop_length}", at=f"[{i}]")
    if len(req.context_files) > lim.max_context_files:
        raise invalid("context_files", f"{len(req.context_files)} files; the limit is limits.max_context_files = {lim.max_context_files}")
    for i, f in enumerate(req.context_files):
        if not f.path or "\x00" in f.path or "\n" in f.path:
            raise invalid("context_files", "must be a non-empty path without NUL or newline characters", at=f"[{i}].path")
    if "\n" in req.file_path or "\x00" in req.file_path:
        raise invalid("file_path", "must not contain NUL or newline characters")
    if req.latency_class not in LATENCY_CLASS_NAMES:
        raise invalid("latency_class", f"unknown value {req.latency_class}; use INLINE, CHAT or BATCH")
