"""The prompt formats quickdraft renders: Qwen-Coder style fill-in-the-middle,
repository-level prompts and ChatML.

One module for the server (which renders requests), for training (which
renders the embedded model's training samples) and for clients that render
their own prompts (raw_prompt), so the embedded model is trained on exactly
what the server sends. Part of the wire layer (see ``quickdraft.wire``): it
imports nothing of the server or the clients. The server's prompt step
(render, then tokenize) is ``quickdraft.server.prompt_tokens``.

The token strings are Qwen3-Coder's, so a prompt rendered here works
unchanged on Qwen3-Coder-30B.

    <|repo_name|>{repo}\\n
    <|file_sep|>{path}\\n{content}\\n        (one per context file)
    <|file_sep|>{path}\\n                     (the current file)
    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

Without a suffix the current file's prefix is sent as plain text after its
header (or alone, when there is no repository context): the model continues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

ENDOFTEXT = "<|endoftext|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIM_PAD = "<|fim_pad|>"
REPO_NAME = "<|repo_name|>"
FILE_SEP = "<|file_sep|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# The drafter's parallel-drafting slot token (P-EAGLE): fed at the positions
# whose tokens are drafted in the same pass.
DRAFT_SLOT = "<|draft_slot|>"

SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    FIM_PREFIX,
    FIM_MIDDLE,
    FIM_SUFFIX,
    FIM_PAD,
    REPO_NAME,
    FILE_SEP,
    IM_START,
    IM_END,
    DRAFT_SLOT,
)

# Tokens after which a completion is over, on top of the tokenizer's EOS: the
# model moving on to another file or another FIM segment.
STOP_TOKENS: tuple[str, ...] = (ENDOFTEXT, FIM_PAD, FILE_SEP, REPO_NAME, IM_END, FIM_PREFIX, FIM_SUFFIX)


def stop_token_ids(vocab: Mapping[str, int]) -> list[int]:
    """The ids of the STOP_TOKENS a tokenizer's vocabulary has, in STOP_TOKENS' order."""
    return [vocab[t] for t in STOP_TOKENS if t in vocab]

FORMAT_NAME = "qwen-fim"


@dataclass(frozen=True)
class CodeContext:
    """What a completion prompt is made of. Paths are repository-relative."""

    prefix: str
    suffix: str | None = None
    file_path: str = ""
    repo_name: str = ""
    context_files: Sequence[tuple[str, str]] = ()


Segment = tuple[bool, str]
"""(is_special_token, text): special segments are one control token each."""


def context_file_text(path: str, content: str) -> str:
    """The text of one context file after its <|file_sep|>: path, then content ending in a newline."""
    return f"{path}\n{content}" + ("" if content.endswith("\n") else "\n")


def segments(ctx: CodeContext, prompt_format: str = FORMAT_NAME) -> list[Segment]:
    """The prompt as alternating text and control tokens.

    Kept as segments so the server can tokenize user text with special-token
    parsing off: code that contains "<|endoftext|>" stays text.
    ``prompt_format="plain"`` (models without FIM tokens) sends the prefix alone.
    """
    if prompt_format == "plain":
        return [(False, ctx.prefix)]
    out: list[Segment] = []
    if ctx.context_files or ctx.repo_name:
        out += [(True, REPO_NAME), (False, f"{ctx.repo_name}\n")]
        for path, content in ctx.context_files:
            out += [(True, FILE_SEP), (False, context_file_text(path, content))]
        out += [(True, FILE_SEP), (False, f"{ctx.file_path}\n")]
    if ctx.suffix is None:
        out.append((False, ctx.prefix))
    else:
        out += [(True, FIM_PREFIX), (False, ctx.prefix), (True, FIM_SUFFIX), (False, ctx.suffix), (True, FIM_MIDDLE)]
    return [seg for seg in out if seg[0] or seg[1]]


def from_line_start(prefix: str, suffix: str) -> tuple[str, str] | None:
    """The prompt for a cursor on a line of only whitespace, rewritten to start
    that line afresh: the prefix ends where the line begins and the suffix starts
    after it. In the embedded model's fill-in-the-middle training
    (training/samples.py) whole-line middles start at a line start, and a middle
    that starts after a blank line's indentation, with a line break right after
    it, is always empty: asked there, the model answers nothing, at the very
    place a user waits for a line. None when the cursor's line holds code.

    One rule for the LSP bridge (which asks so on its own) and the server
    (which asks so for raw clients, server/preparation.py)."""
    indent = prefix[prefix.rfind("\n") + 1 :]
    if indent.strip():
        return None
    rest_of_line, newline, after = suffix.partition("\n")
    if rest_of_line.strip():
        return None
    return prefix[: len(prefix) - len(indent)], after if newline else ""


def render(ctx: CodeContext, prompt_format: str = FORMAT_NAME) -> str:
    """The prompt text, special tokens written as their strings."""
    return "".join(text for _, text in segments(ctx, prompt_format))


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """ChatML prompt (Qwen's chat format) ending with an open assistant turn."""
    body = "".join(f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in messages)
    return f"{body}{IM_START}assistant\n"
