"""Checking a CompleteRequest and turning it into engine input.

Everything here is per request, never per token. Errors are ``RequestError``
with a status code shared by the gRPC and HTTP front ends and a message that
names the field and the limit.
"""

from __future__ import annotations

import functools
import hashlib
import math
import uuid
from array import array
from dataclasses import dataclass

from quickdraft.client.request import PROMPT_LIMIT_KEY, PROMPT_TOKENS_KEY
from quickdraft.prompt_format import CodeContext, segments
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.prompt_tokens import PromptTokenizer
from quickdraft.v1 import completion_pb2 as pb

LATENCY_CLASSES = {
    pb.LATENCY_CLASS_UNSPECIFIED: "inline",
    pb.LATENCY_CLASS_INLINE: "inline",
    pb.LATENCY_CLASS_CHAT: "chat",
    pb.LATENCY_CLASS_BATCH: "batch",
}
MAX_TEMPERATURE = 2.0
MAX_REQUEST_ID = 128


class RequestError(Exception):
    """A request the server refuses. ``code`` is a gRPC status name;
    ``metadata`` goes out as trailing metadata (machine-readable details)."""

    HTTP_STATUS = {"INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "INTERNAL": 500}

    def __init__(self, code: str, message: str, metadata: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = metadata or {}

    @property
    def http_status(self) -> int:
        return self.HTTP_STATUS.get(self.code, 500)


def invalid(message: str) -> RequestError:
    return RequestError("INVALID_ARGUMENT", message)


@dataclass
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    seed: int | None

    def to_vllm(self, stop_token_ids: list[int]):
        SamplingParams, RequestOutputKind = _vllm_sampling()
        return SamplingParams(
            n=1,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop or None,
            seed=self.seed,
            stop_token_ids=stop_token_ids,
            output_kind=RequestOutputKind.DELTA,
            skip_special_tokens=True,
        )


@functools.cache
def _vllm_sampling():
    """vLLM's sampling classes, imported on first use (vllm's lazy module
    attributes cost about 8 us per lookup, twice per request)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams, RequestOutputKind


@dataclass
class PreparedRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    latency_class: str
    fim: bool
    # Safe to log: sizes and a hash, never the code itself.
    prompt_chars: int
    prompt_sha: str

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def check(req: pb.CompleteRequest, cfg: QuickdraftConfig) -> None:
    """Field checks that need no tokenizer."""
    lim = cfg.limits
    size = req.ByteSize()
    if size > lim.max_request_bytes:
        raise invalid(f"request is {size} bytes; the limit is limits.max_request_bytes = {lim.max_request_bytes}")
    if len(req.request_id) > MAX_REQUEST_ID:
        raise invalid(f"request_id is {len(req.request_id)} characters; at most {MAX_REQUEST_ID}")
    if not req.request_id.isprintable():
        # It is echoed in logs and traces: no newlines or control characters (forged log lines).
        raise invalid("request_id: must be printable characters (no newlines or control characters)")
    if not req.prefix and not req.HasField("suffix") and not req.context_files:
        raise invalid("prefix: empty prompt (send the text before the cursor, a suffix, or context files)")
    if req.raw_prompt and (req.HasField("suffix") or req.context_files):
        raise invalid("raw_prompt: a raw prompt is sent whole in prefix; leave suffix and context_files empty")
    if req.max_tokens < 0:
        raise invalid(f"max_tokens: {req.max_tokens} is negative; use 1..{lim.max_output_tokens}, or 0 for the default ({lim.default_max_tokens})")
    if req.max_tokens > lim.max_output_tokens:
        raise invalid(f"max_tokens: {req.max_tokens} exceeds limits.max_output_tokens = {lim.max_output_tokens}")
    if req.HasField("temperature") and not (math.isfinite(req.temperature) and 0.0 <= req.temperature <= MAX_TEMPERATURE):
        raise invalid(f"temperature: {req.temperature} is outside 0..{MAX_TEMPERATURE}")
    if req.HasField("top_p") and not (math.isfinite(req.top_p) and 0.0 < req.top_p <= 1.0):
        raise invalid(f"top_p: {req.top_p} is outside (0, 1]")
    if req.HasField("seed") and req.seed < 0:
        raise invalid(f"seed: {req.seed} is negative; use 0..2^63-1")
    if len(req.stop) > lim.max_stop_sequences:
        raise invalid(f"stop: {len(req.stop)} stop sequences; the limit is limits.max_stop_sequences = {lim.max_stop_sequences}")
    for i, s in enumerate(req.stop):
        if not s:
            raise invalid(f"stop[{i}]: empty stop sequence")
        if len(s) > lim.max_stop_length:
            raise invalid(f"stop[{i}]: {len(s)} characters; the limit is limits.max_stop_length = {lim.max_stop_length}")
    if len(req.context_files) > lim.max_context_files:
        raise invalid(f"context_files: {len(req.context_files)} files; the limit is limits.max_context_files = {lim.max_context_files}")
    for i, f in enumerate(req.context_files):
        if not f.path or "\x00" in f.path or "\n" in f.path:
            raise invalid(f"context_files[{i}].path: must be a non-empty path without NUL or newline characters")
    if "\n" in req.file_path or "\x00" in req.file_path:
        raise invalid("file_path: must not contain NUL or newline characters")
    if req.latency_class not in LATENCY_CLASSES:
        raise invalid(f"latency_class: unknown value {req.latency_class}; use INLINE, CHAT or BATCH")


def tokenize(tokens: PromptTokenizer, req: pb.CompleteRequest, prompt_format: str) -> list[int]:
    """Token ids of the rendered prompt. User text never becomes a control
    token (special-token parsing is off for it), except in raw mode."""
    if req.raw_prompt:
        return tokens.raw(req.prefix)
    ctx = CodeContext(
        prefix=req.prefix,
        suffix=req.suffix if req.HasField("suffix") else None,
        file_path=req.file_path,
        repo_name=req.repo_name,
        context_files=[(f.path, f.content) for f in req.context_files],
    )
    ids: list[int] = []
    for special, text in segments(ctx, prompt_format):
        if special:
            tid = tokens.special(text)
            if tid is None:
                raise RequestError("INTERNAL", f"the model's tokenizer has no {text!r} token, which prompt format {prompt_format!r} (the preset's) needs; "
                                               "use the preset of the model's family, or send raw_prompt")
            ids.append(tid)
        else:
            ids.extend(tokens.text(text))
    return ids


def prepare(req: pb.CompleteRequest, cfg: QuickdraftConfig, tokens: PromptTokenizer) -> PreparedRequest:
    check(req, cfg)
    ids = tokenize(tokens, req, cfg.preset.prompt_format)
    if not ids:
        raise invalid("prefix: the prompt tokenizes to nothing")
    limit = cfg.max_prompt_tokens()
    if len(ids) > limit:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"prompt is {len(ids)} tokens; the limit is limits.max_prompt_tokens = {limit} "
            f"(aim for GetServerInfo.limits.prompt_budget_tokens = {cfg.prompt_budget_tokens()})",
            {PROMPT_TOKENS_KEY: str(len(ids)), PROMPT_LIMIT_KEY: str(limit)},
        )
    lim = cfg.limits
    max_tokens = req.max_tokens or lim.default_max_tokens
    # Never ask the engine for more than the context window holds.
    max_tokens = max(1, min(max_tokens, cfg.max_model_len() - len(ids)))
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=req.temperature if req.HasField("temperature") else 0.0,
        top_p=req.top_p if req.HasField("top_p") else 1.0,
        stop=list(req.stop),
        seed=req.seed if req.HasField("seed") else None,
    )
    text_len = len(req.prefix) + len(req.suffix) + sum(len(f.content) for f in req.context_files)
    return PreparedRequest(
        request_id=req.request_id or uuid.uuid4().hex,
        prompt_token_ids=ids,
        sampling=sampling,
        latency_class=LATENCY_CLASSES[req.latency_class],
        fim=req.HasField("suffix"),
        prompt_chars=text_len,
        prompt_sha=hashlib.sha256(array("i", ids).tobytes()).hexdigest()[:12],
    )
