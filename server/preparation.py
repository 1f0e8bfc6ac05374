"""A CompleteRequest turned into engine input: checked, its prompt rendered,
tokenized and cut to the budget where it is over (server/prompt_fitting.py),
its sampling settings defaulted and fitted to the context window.

Everything here is per request, never per token.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
from array import array
from dataclasses import dataclass, field

from quickdraft.prompt_format import from_line_start
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.errors import invalid
from quickdraft.server.prompt_fitting import cut_chars, fit_tokens
from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
from quickdraft.server.request_validation import LATENCY_CLASS_NAMES, check, prompt_chars
from quickdraft.server.tokenizer_pool import INLINE_CHARS, TokenizerPool
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.requests")


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
    # What was cut to fit the budget (CompleteFinal.prompt_fit).
    prompt_fit: pb.PromptFit = field(default_factory=pb.PromptFit)
    # The blank line's indentation the client had typed before the cursor,
    # moved out of the prompt (``blank_line_from_line_start``): the stream
    # drops up to this much of the answer's leading whitespace (service.IndentStrip).
    typed_indent: str = ""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def prepare(req: pb.CompleteRequest, cfg: QuickdraftConfig, tokens: PromptTokenizer) -> PreparedRequest:
    """Check, cut to max_prompt_chars, tokenize on this thread, cut to max_prompt_tokens."""
    check(req, cfg)
    req = prefix_only(req, cfg)
    req, typed_indent = blank_line_from_line_start(req, cfg)
    req, fit = cut_chars(req, cfg, tokens)
    memo: dict[str, list[int]] = {}
    ids = tokenize(tokens, req, cfg.preset.prompt_format, memo)
    if len(ids) > cfg.max_prompt_tokens():
        req, ids = fit_tokens(tokens, req, cfg, ids, memo, fit)
    return _prepared(req, cfg, ids, fit, typed_indent)


async def prepare_off_loop(req: pb.CompleteRequest, cfg: QuickdraftConfig, tokens: PromptTokenizer, pool: TokenizerPool, client: str) -> PreparedRequest:
    """``prepare`` for the serving path: checks and the cut by characters
    first, then a long prompt is tokenized on the pool, in ``client``'s turn."""
    check(req, cfg)
    req = prefix_only(req, cfg)
    req, typed_indent = blank_line_from_line_start(req, cfg)
    req, fit = cut_chars(req, cfg, tokens)
    memo: dict[str, list[int]] = {}
    ids = await pool.run(client, prompt_chars(req), functools.partial(tokenize, tokens, req, cfg.preset.prompt_format, memo))
    if len(ids) > cfg.max_prompt_tokens():
        # Cutting tokenizes pieces of the prompt again: on the pool (and the
        # client's share) whatever the prompt's size.
        chars = max(prompt_chars(req), INLINE_CHARS)
        req, ids = await pool.run(client, chars, functools.partial(fit_tokens, tokens, req, cfg, ids, memo, fit))
    return _prepared(req, cfg, ids, fit, typed_indent)


def prefix_only(req: pb.CompleteRequest, cfg: QuickdraftConfig) -> pb.CompleteRequest:
    """``req`` with an empty suffix where it has none and ``limits.prefix_only``
    is "fim" (in a fill-in-the-middle format, not a raw prompt); else ``req``."""
    if cfg.limits.prefix_only != "fim" or req.HasField("suffix") or req.raw_prompt or cfg.preset.prompt_format == "plain":
        return req
    out = pb.CompleteRequest()
    out.CopyFrom(req)
    out.suffix = ""
    return out


def blank_line_from_line_start(req: pb.CompleteRequest, cfg: QuickdraftConfig) -> tuple[pb.CompleteRequest, str]:
    """``req`` asked from the start of its cursor's line when the cursor sits
    in a blank line's indentation, with the indentation moved out; else
    ``req`` itself and "".

    The model's fill-in-the-middle training has whole-line middles start at a
    line start (the LSP bridge asks so, lsp_bridge/completer.py): asked after
    the indentation, it answers the line with its indentation again, and a
    raw client inserting that after the typed spaces doubles them. Only FIM
    prompts the server renders: a raw prompt is the client's own, and without
    a suffix (or in the "plain" format, which sends the prefix alone) the
    model continues the prefix, typed spaces included. A prompt already cut
    at a line start (the bridge's) has no indentation to move: unchanged."""
    prefix = req.prefix
    if not prefix or prefix[-1] == "\n" or not prefix[-1].isspace():  # code, or a line start: the usual case
        return req, ""
    if not cfg.limits.blank_line_from_line_start or req.raw_prompt or not req.HasField("suffix"):
        return req, ""
    if cfg.preset.prompt_format == "plain":
        return req, ""
    moved = from_line_start(prefix, req.suffix)
    if moved is None:
        return req, ""
    out = pb.CompleteRequest()
    out.CopyFrom(req)
    out.prefix, out.suffix = moved
    return out, prefix[len(moved[0]) :]


def _prepared(req: pb.CompleteRequest, cfg: QuickdraftConfig, ids: list[int], fit: pb.PromptFit,
              typed_indent: str = "") -> PreparedRequest:
    if not ids:
        raise invalid("prefix", "the prompt tokenizes to nothing")
    request_id = req.request_id or uuid.uuid4().hex
    if fit.truncated:
        log.info("request %s prompt cut to fit: prefix -%d chars, suffix -%d chars, %d context files dropped, -%d tokens",
                 request_id, fit.prefix_chars_cut, fit.suffix_chars_cut, fit.context_files_dropped, fit.prompt_tokens_cut)
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
    return PreparedRequest(
        request_id=request_id,
        prompt_token_ids=ids,
        sampling=sampling,
        latency_class=LATENCY_CLASS_NAMES[req.latency_class],
        fim=req.HasField("suffix"),
        prompt_chars=prompt_chars(req),
        prompt_sha=hashlib.sha256(array("i", ids).tobytes()).hexdigest()[:12],
        prompt_fit=fit,
        typed_indent=typed_indent,
    )
