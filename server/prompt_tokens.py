"""The prompt step: a CompleteRequest rendered in the model's prompt format
(``quickdraft.prompt_format``) and tokenized, the last step before the engine.

Rendering keeps user text and the format's control tokens apart, so user text
is tokenized with special-token parsing off: code that contains
"<|endoftext|>" stays text. Raw prompts (an editor's own template, a chat
rendered by the HTTP front end) are tokenized whole, control tokens included.

The Hugging Face tokenizer's Python wrapper costs about 0.1-0.2 ms per call
on top of the Rust tokenizer it wraps (transformers 5.19, tokenizers 0.23,
the embedded model's Qwen tokenizer, 2-core EPYC), and a FIM prompt makes two
or three calls; on the serving path that is TTFT. ``PromptTokenizer`` is built once per engine
and calls the Rust tokenizer directly, with the same ids (tested against the
wrapper on random text). It calls ``encode_batch_fast`` on a batch of one
where tokenizers has it (0.21+): the same ids without the character offsets
that ``encode`` computes and nothing here reads; 318 -> 251 us at p50 on the
gRPC benchmark's prompts (about 1,600 characters, 474 tokens; tokenizers
0.23.3, 2-core Xeon, 2026-12-04).
"""

from __future__ import annotations

import functools
from typing import Any

from quickdraft.prompt_format import SPECIAL_TOKENS, CodeContext, segments
from quickdraft.server.errors import RequestError
from quickdraft.v1 import completion_pb2 as pb


class PromptTokenizer:
    """Token ids for prompt text and the prompt format's special tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer
        self._special: dict[str, int | None] = {}
        self._text = self._raw = None
        self._fast = False
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:  # a slow (Python) tokenizer: keep its own encode
            return
        from tokenizers import Tokenizer

        # Own copies: the wrapper flips encode_special_tokens on its backend per call.
        spec = backend.to_str()
        text = Tokenizer.from_str(spec)
        if not hasattr(text, "encode_special_tokens"):  # tokenizers < 0.15
            return
        # User text never becomes a control token: "<|endoftext|>" typed in
        # code stays those characters (what split_special_tokens=True does).
        text.encode_special_tokens = True
        self._text = text
        self._raw = Tokenizer.from_str(spec)
        self._fast = hasattr(text, "encode_batch_fast")

    def text(self, s: str) -> list[int]:
        """Ids of user text, special-token strings in it kept as text."""
        if self._text is None:
            return self.hf.encode(s, add_special_tokens=False, split_special_tokens=True)
        return self._encode(self._text, s)

    def raw(self, s: str) -> list[int]:
        """Ids of a raw prompt, whose special-token strings are control tokens."""
        if self._raw is None:
            return self.hf.encode(s, add_special_tokens=False)
        return self._encode(self._raw, s)

    def _encode(self, tokenizer: Any, s: str) -> list[int]:
        if self._fast:
            return tokenizer.encode_batch_fast([s], add_special_tokens=False)[0].ids
        return tokenizer.encode(s, add_special_tokens=False).ids

    @functools.cached_property
    def control_tokens(self) -> tuple[str, ...]:
        """The strings a raw prompt's tokenization turns into control tokens:
        the vocabulary's special added tokens (the format's, where it has none)."""
        added = getattr(self.hf, "added_tokens_decoder", None) or {}
        return tuple(t.content for t in added.values() if getattr(t, "special", False)) or SPECIAL_TOKENS

    def special(self, token: str) -> int | None:
        """Id of one special token, or None when the vocabulary lacks it."""
        if token not in self._special:
            tid = self.hf.convert_tokens_to_ids(token)
            # Hugging Face answers the unknown token's id for a missing token.
            missing = tid is None or (tid == self.hf.unk_token_id and token != self.hf.unk_token)
            self._special[token] = None if missing else tid
        return self._special[token]


def code_context(req: pb.CompleteRequest) -> CodeContext:
    """What the prompt format renders of a (not raw) request."""
    return CodeContext(
        prefix=req.prefix,
        suffix=req.suffix if req.HasField("suffix") else None,
        file_path=req.file_path,
        repo_name=req.repo_name,
        context_files=[(f.path, f.content) for f in req.context_files],
    )


def tokenize(tokens: PromptTokenizer, req: pb.CompleteRequest, prompt_format: str, memo: dict[str, list[int]] | None = None) -> list[int]:
    """Token ids of the request's rendered prompt. User text never becomes a
    control token (special-token parsing is off for it), except in raw mode.
    ``memo`` (user text -> its ids) is read and filled: prompt fitting
    measures the pieces it cuts once (server/prompt_fitting.py)."""
    if req.raw_prompt:
        return tokens.raw(req.prefix)
    ids: list[int] = []
    for special, text in segments(code_context(req), prompt_format):
        if special:
            tid = tokens.special(text)
            if tid is None:
                raise RequestError("INTERNAL", f"the model's tokenizer has no {text!r} token, which prompt format {prompt_format!r} (the preset's) needs; "
                                               "use the preset of the model's family, or send raw_prompt")
            ids.append(tid)
        elif memo is None:
            ids.extend(tokens.text(text))
        else:
            if text not in memo:
                memo[text] = tokens.text(text)
            ids.extend(memo[text])
    return ids
