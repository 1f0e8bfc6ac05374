"""A prompt over the server's budget cut to fit it, keeping the text nearest
the cursor (as llama.cpp's /infill and Tabby do), unless the request sets
``strict_prompt``, which refuses it instead.

Two steps, sizes before per-character work (docs/security.md):

1. ``cut_chars``, before any tokenizer runs: prompt text over
   ``limits.max_prompt_chars`` is cut by characters, so no tokenizer ever
   sees more than that.
2. ``fit_tokens``, once the prompt is tokenized and found over
   ``limits.max_prompt_tokens``: cut again, on the true token counts of the
   pieces it keeps (each piece is tokenized alone in the prompt, so the
   prompt's count is their sum: the result is within the limit exactly).

Both steps share the LSP bridge's rule (``lsp_bridge/context.py``): context
files are dropped whole, the first (least relevant) first, until the rest
fits in CONTEXT_SHARE of the budget, or in what the current file leaves when
it fits in the rest; the suffix gets SUFFIX_SHARE of what is left unless the
prefix needs less; the prefix gets the rest. The prefix is cut at a line
start and the suffix after a line break, so the model sees whole lines; a cut
that would lose more than half of its share to that is made between words.

A raw prompt is the client's own rendering: without control tokens (plain
text, a whole file) it is cut like a prefix; with them (a chat, an editor's
own FIM template) its structure is not the server's to cut, and it is refused.
All of this runs once per request, and only for a prompt over the budget.
"""

from __future__ import annotations

from typing import Callable

from quickdraft.prompt_format import SPECIAL_TOKENS, context_file_text
from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.errors import RequestError
from quickdraft.server.prompt_tokens import PromptTokenizer, tokenize
from quickdraft.server.request_validation import prompt_chars
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.wire import PROMPT_LIMIT_KEY, PROMPT_TOKENS_KEY

CONTEXT_SHARE = 0.3
SUFFIX_SHARE = 0.25
# A measured piece this close to its budget is kept; a shorter one gets one
# more try with more text (a line-boundary cut is under budget anyway).
FULL = 0.97
# Tokenizations per piece before falling back to halving (rare: each try
# rescales by the last piece's own characters per token).
MAX_TRIES = 4
# How far a cut inside a line moves to keep a word whole.
MAX_WORD = 64

Cost = Callable[[str], int]


# --- step 1: characters, before any tokenizer --------------------------------------------


def cut_chars(req: pb.CompleteRequest, cfg: QuickdraftConfig, tokens: PromptTokenizer) -> tuple[pb.CompleteRequest, pb.PromptFit]:
    """The request with its prompt text within limits.max_prompt_chars (the
    request itself when it is), and what was cut. Strict requests over the
    limit were refused by ``request_validation.check``."""
    limit = cfg.max_prompt_chars()
    fit = pb.PromptFit()
    chars = prompt_chars(req)
    if chars <= limit:
        return req, fit
    if req.raw_prompt:
        _refuse_control_tokens(req.prefix, tokens, f"the prompt is {chars} characters; the limit is limits.max_prompt_chars = {limit}")
        return _cut(req, fit, _keep_end(req.prefix, limit, len, len(req.prefix))), fit
    # Only the text the format renders reaches the tokenizer ("plain" renders the prefix alone).
    rendered = cfg.preset.prompt_format != "plain"
    suffix = req.suffix if rendered and req.HasField("suffix") else None
    files = [len(f.content) for f in req.context_files] if rendered else []
    drop, suffix_budget = _shares(limit, len(req.prefix), len(suffix or ""), files)
    if suffix is not None:
        suffix = _keep_start(suffix, suffix_budget, len, len(suffix))
    prefix = _keep_end(req.prefix, limit - sum(files[drop:]) - len(suffix or ""), len, len(req.prefix))
    return _cut(req, fit, prefix, suffix, drop), fit


# --- step 2: tokens ---------------------------------------------------------------------


def fit_tokens(tokens: PromptTokenizer, req: pb.CompleteRequest, cfg: QuickdraftConfig, ids: list[int],
               memo: dict[str, list[int]], fit: pb.PromptFit) -> tuple[pb.CompleteRequest, list[int]]:
    """The request cut to limits.max_prompt_tokens and its prompt's ids, for
    a prompt of ``ids`` over it (``memo``: its user text's ids, from
    ``tokenize``); ``fit`` gains what was cut. Raises RequestError for a
    prompt that is not to be cut (strict, raw with control tokens) or cannot be."""
    limit = cfg.max_prompt_tokens()
    if req.strict_prompt:
        raise too_long(len(ids), cfg, "strict_prompt is set, so the server does not cut it")
    if req.raw_prompt:
        _refuse_control_tokens(req.prefix, tokens, _over_tokens(len(ids), cfg), len(ids), limit)
        count = _Counter(tokens.raw, {req.prefix: ids})
        out = _cut(req, fit, _keep_end(req.prefix, limit, count, len(ids)))
        fitted = count.ids(out.prefix)
    else:
        out = _fit_rendered(tokens, req, cfg, ids, memo, fit)
        fitted = tokenize(tokens, out, cfg.preset.prompt_format, memo)  # every piece measured: no new tokenizing
    if len(fitted) > limit:  # never: the pieces were measured
        raise RequestError("INTERNAL", f"the prompt was cut to {len(fitted)} tokens, over limits.max_prompt_tokens = {limit}")
    fit.prompt_tokens_cut += len(ids) - len(fitted)
    return out, fitted


def _fit_rendered(tokens: PromptTokenizer, req: pb.CompleteRequest, cfg: QuickdraftConfig, ids: list[int],
                  memo: dict[str, list[int]], fit: pb.PromptFit) -> pb.CompleteRequest:
    count = _Counter(tokens.text, memo)
    rendered = cfg.preset.prompt_format != "plain"
    suffix = req.suffix if rendered and req.HasField("suffix") else None
    # Each piece is tokenized alone (prompt_tokens.tokenize): the prompt's
    # tokens are the pieces' plus the rest (control tokens, headers).
    prefix_n, suffix_n = count(req.prefix), count(suffix or "")
    files = [1 + count(context_file_text(f.path, f.content)) for f in req.context_files] if rendered else []
    overhead = len(ids) - prefix_n - suffix_n - sum(files)
    budget = cfg.max_prompt_tokens() - overhead
    if budget < 0:
        raise too_long(len(ids), cfg, f"file_path, repo_name and the prompt format alone take {overhead} tokens, leaving no room for code",
                       field=None)
    drop, suffix_budget = _shares(budget, prefix_n, suffix_n, files)
    if suffix is not None:
        suffix = _keep_start(suffix, suffix_budget, count, suffix_n)
    prefix = _keep_end(req.prefix, budget - sum(files[drop:]) - count(suffix or ""), count, prefix_n)
    return _cut(req, fit, prefix, suffix, drop)


def too_long(n: int, cfg: QuickdraftConfig, why: str, field: str | None = "prefix") -> RequestError:
    """The refusal of a prompt of ``n`` tokens, with the count and limit in trailing metadata."""
    metadata = {PROMPT_TOKENS_KEY: str(n), PROMPT_LIMIT_KEY: str(cfg.max_prompt_tokens())}
    return RequestError("INVALID_ARGUMENT", f"{_over_tokens(n, cfg)}; {why}", metadata, field=field)


def _over_tokens(n: int, cfg: QuickdraftConfig) -> str:
    return (f"the prompt is {n} tokens; the limit is limits.max_prompt_tokens = {cfg.max_prompt_tokens()} "
            f"(aim for GetServerInfo.limits.prompt_budget_tokens = {cfg.prompt_budget_tokens()})")


# --- the shared rule ----------------------------------------------------------------------


def _shares(budget: int, prefix: int, suffix: int, files: list[int]) -> tuple[int, int]:
    """(how many context files to drop, from the first; the suffix's budget),
    all sizes in one unit (characters or tokens); ``budget`` >= 0."""
    size = prefix + suffix
    cap = budget - size if size <= budget * (1 - CONTEXT_SHARE) else int(budget * CONTEXT_SHARE)
    drop, used = 0, sum(files)
    while used > cap:
        used -= files[drop]
        drop += 1
    rest = budget - used
    return drop, min(suffix, max(int(rest * SUFFIX_SHARE), rest - prefix))


def _keep_end(text: str, budget: int, cost: Cost, total: int) -> str:
    """The longest end of ``text`` (a prefix: the cursor is at its end) that
    costs at most ``budget``; ``total`` is the cost of all of it."""
    if total <= budget:
        return text
    return _longest(budget, cost, total, len(text), lambda keep: _end_from_line(text, keep))


def _keep_start(text: str, budget: int, cost: Cost, total: int) -> str:
    """The longest start of ``text`` (a suffix: the cursor is at its start) that costs at most ``budget``."""
    if total <= budget:
        return text
    return _longest(budget, cost, total, len(text), lambda keep: _start_to_line(text, keep))


def _longest(budget: int, cost: Cost, total: int, length: int, piece: Callable[[int], str]) -> str:
    """The longest ``piece(keep)`` within ``budget``, found in a few measured
    tries: each rescales ``keep`` (characters) by the last piece's own
    characters per unit of cost. With cost = len the first try fits."""
    if budget <= 0:
        return ""
    keep = budget * length // total
    best: str | None = None
    tried: set[int] = set()
    for _ in range(MAX_TRIES):
        kept = piece(keep)
        if len(kept) in tried:
            break
        tried.add(len(kept))
        n = cost(kept)
        if n <= budget and (best is None or len(kept) > len(best)):
            best = kept
            if n >= budget * FULL:
                break
        keep = len(kept) * budget // max(n, 1)
        if n > budget:
            keep = min(keep, len(kept) - 1)
    while best is None:  # no try fitted: halve until one does ("" always does)
        keep //= 2
        kept = piece(keep)
        if cost(kept) <= budget:
            best = kept
    return best


def _end_from_line(text: str, keep: int) -> str:
    """About the last ``keep`` characters of ``text``, from the first line
    start in them, or between words when that would lose over half."""
    if keep <= 0:
        return ""
    if keep >= len(text):
        return text
    at = len(text) - keep
    line = text.find("\n", at - 1) + 1  # the first line start at or after `at`
    if line == 0 or line - at > keep // 2:
        return text[_word_boundary(text, at, 1) :]
    return text[line:]


def _start_to_line(text: str, keep: int) -> str:
    """About the first ``keep`` characters of ``text``, to the end of the last
    whole line in them, or between words when that would lose over half."""
    if keep <= 0:
        return ""
    if keep >= len(text):
        return text
    line = text.rfind("\n", 0, keep) + 1  # the end of the last whole line within `keep`
    if line == 0 or keep - line > keep // 2:
        return text[: _word_boundary(text, keep, -1)]
    return text[:line]


def _word_boundary(text: str, at: int, step: int) -> int:
    """``at`` moved (forward for step 1, back for -1) out of the word it
    splits; ``at`` itself when it splits none, or the word is too long."""
    if not (_is_word(text[at - 1]) and _is_word(text[at])):
        return at
    i = at
    for _ in range(MAX_WORD):
        i += step
        if not 0 < i < len(text):
            return at
        if not (_is_word(text[i - 1]) and _is_word(text[i])):
            return i
    return at


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


# --- helpers ------------------------------------------------------------------------------


class _Counter:
    """Token counts of text, each text tokenized once; its ids are kept for
    the prompt's assembly (``tokenize``'s memo)."""

    def __init__(self, encode: Callable[[str], list[int]], memo: dict[str, list[int]]):
        self.encode = encode
        self.memo = memo

    def ids(self, text: str) -> list[int]:
        if text not in self.memo:
            self.memo[text] = self.encode(text)
        return self.memo[text]

    def __call__(self, text: str) -> int:
        return len(self.ids(text))


def _cut(req: pb.CompleteRequest, fit: pb.PromptFit, prefix: str, suffix: str | None = None, drop: int = 0) -> pb.CompleteRequest:
    """``req`` with the kept text (``suffix`` None: unchanged), or ``req``
    itself when nothing was cut; ``fit`` counts what went. Kept text is a
    part of the original, so equal lengths mean nothing was cut."""
    suffix_cut = 0 if suffix is None else len(req.suffix) - len(suffix)
    prefix_cut = len(req.prefix) - len(prefix)
    if not (prefix_cut or suffix_cut or drop):
        return req
    out = pb.CompleteRequest()
    out.CopyFrom(req)
    out.prefix = prefix
    if suffix is not None:
        out.suffix = suffix
    if drop:
        del out.context_files[:drop]
    fit.truncated = True
    fit.prefix_chars_cut += prefix_cut
    fit.suffix_chars_cut += suffix_cut
    fit.context_files_dropped += drop
    return out


def _refuse_control_tokens(text: str, tokens: PromptTokenizer, size: str, n: int | None = None, limit: int | None = None) -> None:
    """Refuse a raw prompt over the budget that holds control tokens: its
    structure (turns, FIM markers) is the client's, which a cut would break."""
    controls = getattr(tokens, "control_tokens", SPECIAL_TOKENS)  # test doubles may lack it
    if any(t in text for t in controls):
        metadata = {PROMPT_TOKENS_KEY: str(n), PROMPT_LIMIT_KEY: str(limit)} if n is not None else None
        raise RequestError(
            "INVALID_ARGUMENT",
            f"{size}; a raw prompt that holds control tokens (a chat, a template the client rendered) is not cut by the server: "
            "shorten it, or send the code unrendered (prefix and suffix) for the server to render and fit",
            metadata,
            field="prefix",
        )
