"""A CompleteRequest turned into engine input: checked, its prompt rendered
and tokenized, its sampling settings defaulted and fitted to the context window.

Everything here is per request, never per token.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from array import array
from dataclasses import dataclass

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.errors import RequestError, invalid
from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
from quickdraft.server.request_validation import LATENCY_CLASS_NAMES, check, prompt_chars
from quickdraft.server.tokenizer_pool import TokenizerPool
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import PROMPT_LIMIT_KEY, PROMPT_TOKENS_KEY


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


def prepare(req: pb.CompleteRequest, cfg: QuickdraftConfig, tokens: PromptTokenizer) -> PreparedRequest:
    """Check, tokenize on this thread, fit."""
    check(req, cfg)
    return _fit(req, cfg, tokenize(tokens, req, cfg.preset.prompt_format))


async def prepare_off_loop(req: pb.CompleteRequest, cfg: QuickdraftConfig, tokens: PromptTokenizer, pool: TokenizerPool, client: str) -> PreparedRequest:
    """``prepare`` for the serving path: checks first, then a long prompt is
    tokenized on the pool, in ``client``'s turn."""
    check(req, cfg)
    ids = await pool.run(client, prompt_chars(req), lambda: tokenize(tokens, req, cfg.preset.prompt_format))
    return _fit(req, cfg, ids)


def _fit(req: pb.CompleteRequest, cfg: QuickdraftConfig, ids: list[int]) -> PreparedRequest:
    if not ids:
        raise invalid("prefix", "the prompt tokenizes to nothing")
    limit = cfg.max_prompt_tokens()
    if len(ids) > limit:
        raise RequestError(
            "INVALID_ARGUMENT",
            f"the prompt is {len(ids)} tokens; the limit is limits.max_prompt_tokens = {limit} "
            f"(aim for GetServerInfo.limits.prompt_budget_tokens = {cfg.prompt_budget_tokens()})",
            {PROMPT_TOKENS_KEY: str(len(ids)), PROMPT_LIMIT_KEY: str(limit)},
            field="prefix",
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
    return PreparedRequest(
        request_id=req.request_id or uuid.uuid4().hex,
        prompt_token_ids=ids,
        sampling=sampling,
        latency_class=LATENCY_CLASS_NAMES[req.latency_class],
        fim=req.HasField("suffix"),
        prompt_chars=prompt_chars(req),
        prompt_sha=hashlib.sha256(array("i", ids).tobytes()).hexdigest()[:12],
    )
