"""The OpenAI API's shapes: request parameters read into a CompleteRequest,
and the response bodies, stream chunks and errors built from the service's
messages.

Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}},
with ``code`` the status name the gRPC API uses (INVALID_ARGUMENT, ...).

Bodies come from anyone who can reach the port, so reading one is bounded:
``json_body.parse_body`` bounds the parse, and the translators here refuse
oversized lists by count before walking them. Every refusal is an
``ApiError`` naming what was wrong.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from quickdraft.prompt_format import render_chat
from quickdraft.server.errors import RequestError
from quickdraft.server.frontend import FINISH_REASON_NAMES, http_status
from quickdraft.v1 import completion_pb2 as pb

# OpenAI's error "type" by HTTP status (what its client and editors look at).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error"}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
REQUEST_ID_HEADER = "X-Request-Id"
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SSE_DONE = b"data: [DONE]\n\n"


# --- errors -------------------------------------------------------------------


class ApiError(Exception):
    """A request answered with an OpenAI-shaped error."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "INVALID_ARGUMENT"):
        # Lone surrogates (from "\\ud800" in a body) cannot be encoded as UTF-8; escape them.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @classmethod
    def from_request_error(cls, e: RequestError, names: Mapping[str, str]) -> "ApiError":
        """The service's error, its field named as the OpenAI parameter the client sent."""
        param = None if e.field is None else names.get(e.field, e.field)
        return cls(http_status(e.code), e.naming(param), param, e.code)

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def preview(value: Any, limit: int = 40) -> str:
    """A client's value in an error message: short, and never a walk of a big or nested value."""
    if isinstance(value, (dict, list)):
        n = len(value)
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {n} {'key' if isinstance(value, dict) else 'item'}{'' if n == 1 else 's'}"
    if isinstance(value, str):
        text = json.dumps(value[:limit])
    else:
        text = json.dumps(value) if isinstance(value, (int, float)) else repr(value)
    return text if len(text) <= limit + 2 else text[:limit] + "..."


# --- reading OpenAI requests ----------------------------------------------------


class Params:
    """A request's JSON object, read with the parameter named in every error.
    Unknown parameters are ignored, as OpenAI's and vLLM's servers do."""

    def __init__(self, data: Any):
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        self.data = data

    def get(self, name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
        value = self.data.get(name)
        if value is None:
            return default
        # bool is an int in Python, never in JSON.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise bad(name, f"expected {what}, got {preview(value)}")
        return value

    def number(self, name: str) -> float | None:
        return self.get(name, (int, float), "a number")

    def integer(self, name: str) -> int | None:
        return self.get(name, (int,), "an integer")

    def flag(self, name: str) -> bool:
        return self.get(name, (bool,), "true or false", False)

    def unsupported(self, name: str, allowed: tuple = (None,), hint: str = "") -> None:
        """Refuse a parameter quickdraft does not implement, unless it has a no-op value."""
        value = self.data.get(name)
        if value in allowed or (isinstance(value, (list, dict)) and not value and None in allowed):
            return
        raise bad(name, f"{preview(value)} is not supported by this server{hint}")


@dataclass(frozen=True)
class Bounds:
    """Counts a request may not exceed, checked before its lists are walked, so
    that a hostile body costs no more than its parse. The service checks the
    exact limits afterwards."""

    max_stop_sequences: int = 16
    """limits.max_stop_sequences."""
    max_prompt_tokens: int = 1008
    """The config's max_prompt_tokens(): every chat message takes at least one
    token, so more messages (or text parts) than this can never fit."""

    @property
    def max_json_values(self) -> int:
        """Values a body may hold (``json_body.values_bound``): room for as many
        messages and text parts as fit, each an object of a few keys and strings."""
        return 16 * self.max_prompt_tokens + 4096


@dataclass
class Call:
    """One OpenAI request, translated."""

    req: pb.CompleteRequest
    chat: bool
    stream: bool
    include_usage: bool
    # CompleteRequest field -> the OpenAI parameter (or header) it came from, for errors.
    names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.names.setdefault("request_id", REQUEST_ID_HEADER)


def _sampling(p: Params, req: pb.CompleteRequest, max_tokens_name: str, bounds: Bounds) -> None:
    """max_tokens, temperature, top_p, stop, seed: shared by both endpoints.
    Ranges are the service's to check; here only types and what the proto holds."""
    max_tokens = p.integer(max_tokens_name)
    if max_tokens is not None:
        if max_tokens == 0:
            raise bad(max_tokens_name, "0 tokens; ask for at least 1, or leave it out for the server's default")
        # Out-of-range values still reach the service, which names the limit.
        req.max_tokens = max(-1, min(max_tokens, INT32_MAX))
    for name in ("temperature", "top_p"):
        value = p.number(name)
        if value is not None:
            setattr(req, name, value)
    seed = p.integer("seed")
    if seed is not None:
        req.seed = max(-1, min(seed, INT64_MAX))
    stop = p.data.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list):
            raise bad("stop", f"expected a string or a list of strings, got {preview(stop)}")
        if len(stop) > bounds.max_stop_sequences:
            raise bad("stop", f"{len(stop)} stop sequences; the limit is limits.max_stop_sequences = {bounds.max_stop_sequences}")
        if not all(isinstance(s, str) for s in stop):
            raise bad("stop", "expected a string or a list of strings")
        _set(req.stop.extend, stop, "stop")


def _set(setter, value: Any, param: str) -> None:
    """Proto assignment; strings that are not valid Unicode (lone surrogates) are the client's error."""
    try:
        setter(value)
    except ValueError as e:
        raise bad(param, f"cannot be used ({e})") from None


def _strict_prompt(p: Params, req: pb.CompleteRequest) -> None:
    """quickdraft's own parameter: true refuses a prompt over the budget instead of cutting it to fit."""
    req.strict_prompt = p.flag("strict_prompt")


def _session(p: Params, req: pb.CompleteRequest) -> None:
    """quickdraft's own parameter, the gRPC request's ``session``: with
    replicas, a session's requests go to one replica (docs/scaling.md)."""
    session = p.get("session", (str,), "a string")
    if session is not None:
        _set(lambda v: setattr(req, "session", v), session, "session")


def _stream_options(p: Params) -> tuple[bool, bool]:
    stream = p.flag("stream")
    options = p.get("stream_options", (dict,), "an object")
    if options is not None and not stream:
        raise bad("stream_options", "only allowed when stream is true")
    include_usage = Params(options or {}).flag("include_usage")
    return stream, include_usage


def _prompt(p: Params) -> str:
    """One prompt string. A list holding one string is the same request; batches
    and token ids are not supported."""
    prompt = p.data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        raise bad("prompt", "required")
    # Worded from the first item only: a list may hold a million.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        raise bad("prompt", f"a batch of {len(prompt)} prompts is not supported; send one request per prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (int, list)) and not isinstance(prompt[0], bool):
        raise bad("prompt", f"token id prompts ({preview(prompt)}) are not supported; send the prompt as text")
    raise bad("prompt", f"expected a string, got {preview(prompt)}")


def completion_call(body: Any, bounds: Bounds = Bounds()) -> Call:
    """/v1/completions. A prompt alone is sent as written (control tokens in it
    count, as on vLLM), so editors that render their own FIM template work;
    with `suffix` the server renders the model's fill-in-the-middle format."""
    p = Params(body)
    p.unsupported("n", (None, 1), "; send one request per completion")
    p.unsupported("best_of", (None, 1))
    p.unsupported("echo", (None, False))
    p.unsupported("logprobs", (None,))
    for name in ("presence_penalty", "frequency_penalty"):
        p.unsupported(name, (None, 0, 0.0))
    p.unsupported("logit_bias", (None,))
    req = pb.CompleteRequest(latency_class=pb.LATENCY_CLASS_INLINE)
    prompt = _prompt(p)
    suffix = p.get("suffix", (str,), "a string")
    _set(lambda v: setattr(req, "prefix", v), prompt, "prompt")
    if suffix is None:
        req.raw_prompt = True
    else:
        _set(lambda v: setattr(req, "suffix", v), suffix, "suffix")
    _sampling(p, req, "max_tokens", bounds)
    _strict_prompt(p, req)
    _session(p, req)
    stream, include_usage = _stream_options(p)
    return Call(req, chat=False, stream=stream, include_usage=include_usage, names={"prefix": "prompt"})


def _message_text(content: Any, i: int, parts_left: int, limit: int) -> str:
    """A message's text: a string, or text parts (what newer clients send);
    at most ``parts_left`` of them (of ``limit`` in the whole request)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if len(content) > parts_left:
            raise bad(f"messages[{i}].content", f"{len(content)} parts; all messages together hold at most limits.max_prompt_tokens = {limit} parts")
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad(f"messages[{i}].content", "only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content", f"expected a string or a list of text parts, got {preview(content)}")


def chat_call(body: Any, bounds: Bounds = Bounds()) -> Call:
    """/v1/chat/completions: messages rendered as ChatML, sent as a raw prompt."""
    p = Params(body)
    p.unsupported("n", (None, 1), "; send one request per completion")
    p.unsupported("logprobs", (None, False))
    p.unsupported("top_logprobs", (None, 0))
    for name in ("presence_penalty", "frequency_penalty"):
        p.unsupported(name, (None, 0, 0.0))
    for name in ("logit_bias", "tools", "functions"):
        p.unsupported(name, (None,))
    p.unsupported("tool_choice", (None, "none", "auto"))
    fmt = p.get("response_format", (dict,), "an object")
    if fmt is not None and fmt.get("type", "text") != "text":
        raise bad("response_format", f"{preview(fmt.get('type'))} is not supported; only text")
    messages = p.get("messages", (list,), "a list of messages")
    if not messages:
        raise bad("messages", "at least one message is required")
    if len(messages) > bounds.max_prompt_tokens:
        raise bad("messages", f"{len(messages)} messages; each takes at least one token of limits.max_prompt_tokens = {bounds.max_prompt_tokens}")
    turns = []
    parts_left = bounds.max_prompt_tokens
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"expected an object with role and content, got {preview(m)}")
        role_name = m.get("role")
        role = CHAT_ROLES.get(role_name) if isinstance(role_name, str) else None  # a list is unhashable
        if role is None:
            raise bad(f"messages[{i}].role", f"{preview(role_name)} is not supported; use {', '.join(CHAT_ROLES)}")
        content = m.get("content")
        turns.append((role, _message_text(content, i, parts_left, bounds.max_prompt_tokens)))
        parts_left -= len(content) if isinstance(content, list) else 0
    req = pb.CompleteRequest(latency_class=pb.LATENCY_CLASS_CHAT, raw_prompt=True)
    _set(lambda v: setattr(req, "prefix", v), render_chat(turns), "messages")
    # The newer name wins, as on OpenAI.
    max_name = "max_completion_tokens" if p.data.get("max_completion_tokens") is not None else "max_tokens"
    _sampling(p, req, max_name, bounds)
    _strict_prompt(p, req)
    _session(p, req)
    stream, include_usage = _stream_options(p)
    return Call(req, chat=True, stream=stream, include_usage=include_usage, names={"prefix": "messages", "max_tokens": max_name})


# --- responses ---------------------------------------------------------------------


def usage(final: pb.CompleteFinal) -> dict:
    return {"prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens, "total_tokens": final.prompt_tokens + final.completion_tokens}


def figures(final: pb.CompleteFinal) -> dict:
    """The request's server timings, speculative figures and prompt cut
    (CompleteFinal's), under "quickdraft": OpenAI clients ignore fields they
    do not know."""
    s = final.speculative
    fit = final.prompt_fit
    return {
        "request_id": final.request_id,
        "ttft_ms": round(final.ttft_ms, 3),
        "tpot_ms": round(final.tpot_ms, 3),
        "e2e_ms": round(final.e2e_ms, 3),
        "speculative": {
            "enabled": s.enabled,
            "parallel_drafting": s.parallel_drafting,
            "num_speculative_tokens": s.num_speculative_tokens,
            "num_drafts": s.num_drafts,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens,
            "accepted_per_position": list(s.accepted_per_position),
            "mean_acceptance_length": round(s.mean_acceptance_length, 4),
        },
        "prompt_fit": {
            "truncated": fit.truncated,
            "prefix_chars_cut": fit.prefix_chars_cut,
            "suffix_chars_cut": fit.suffix_chars_cut,
            "context_files_dropped": fit.context_files_dropped,
            "prompt_tokens_cut": fit.prompt_tokens_cut,
        },
    }


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Reply:
    """Builds the bodies and chunks of one response."""

    call: Call
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.call.chat else 'cmpl'}-{self.request_id}"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, text: str, final: pb.CompleteFinal) -> dict:
        finish = FINISH_REASON_NAMES.get(final.finish_reason, "stop")
        if self.call.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(final), "quickdraft": figures(final)}

    def chunk(self, text: str | None = None, final: pb.CompleteFinal | None = None, first: bool = False) -> dict:
        finish = FINISH_REASON_NAMES.get(final.finish_reason, "stop") if final is not None else None
        if self.call.chat:
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            out = {**self._head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        else:
            out = {**self._head("text_completion"), "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}
        if self.call.include_usage:
            # OpenAI: with include_usage every chunk has "usage": null but the extra last one.
            out["usage"] = None
        if final is not None and not self.call.include_usage:
            out["quickdraft"] = figures(final)
        return out

    def usage_chunk(self, final: pb.CompleteFinal) -> dict:
        obj = "chat.completion.chunk" if self.call.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(final), "quickdraft": figures(final)}

    def events(self, msg: pb.CompleteResponse, first: bool) -> list[bytes]:
        """The SSE events for one service message."""
        if not msg.HasField("final"):
            return [sse(self.chunk(text=msg.text, first=first))]
        out = [sse(self.chunk(text=msg.text or None, final=msg.final, first=first))]
        if self.call.include_usage:
            out.append(sse(self.usage_chunk(msg.final)))
        return out
