"""``POST /v1/completions/outcomes``: suggestion outcomes over HTTP, the
ReportOutcomes RPC's body in JSON (docs/http-api.md). Not an OpenAI endpoint:
quickdraft's own, beside the completions whose ids it names.

    {"request_id_prefix": "vim-3f9c2a1b-",
     "outcomes": [{"request_id": "...", "kind": "accepted", "shown_ms": 840,
                   "accepted_chars": 12, "suggestion_chars": 30, "acceptance": "word"}]}

Reading the body is bounded like a completion's: values counted before the
parse, the list's length checked before it is walked. Every refusal is an
``ApiError`` naming the parameter (``outcomes[2].kind``); the value checks
shared with gRPC are ``server/outcomes.py``'s.
"""

from __future__ import annotations

from typing import Any

from quickdraft.server.openai.json_body import parse_body
from quickdraft.server.openai.protocol import Params, bad, preview
from quickdraft.server.outcomes import MAX_BATCH
from quickdraft.v1 import completion_pb2 as pb

KINDS = {"shown": pb.OUTCOME_KIND_SHOWN, "accepted": pb.OUTCOME_KIND_ACCEPTED, "rejected": pb.OUTCOME_KIND_REJECTED}
ACCEPTANCES = {"whole": pb.ACCEPTANCE_WHOLE, "word": pb.ACCEPTANCE_WORD, "line": pb.ACCEPTANCE_LINE}
REJECTIONS = {"dismissed": pb.REJECTION_DISMISSED, "typed_over": pb.REJECTION_TYPED_OVER, "replaced": pb.REJECTION_REPLACED}
# Keys of one outcome, a handful of values each.
MAX_JSON_VALUES = 16 * MAX_BATCH + 64


def _choice(p: Params, name: str, where: str, names: dict[str, int]) -> int | None:
    value = p.data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or value not in names:
        raise bad(f"{where}.{name}", f"{preview(value)} is not one of {', '.join(names)}")
    return names[value]


def _outcome(item: Any, i: int) -> pb.Outcome:
    where = f"outcomes[{i}]"
    if not isinstance(item, dict):
        raise bad(where, f"expected an object, got {preview(item)}")
    p = Params(item)
    out = pb.Outcome()
    request_id = p.data.get("request_id")
    if not isinstance(request_id, str):
        raise bad(f"{where}.request_id", f"expected the completion's request id (a string), got {preview(request_id)}")
    kind = _choice(p, "kind", where, KINDS)
    if kind is None:
        raise bad(f"{where}.kind", f"required: one of {', '.join(KINDS)}")
    try:
        out.request_id = request_id
        out.kind = kind
        shown_ms = p.data.get("shown_ms")
        if shown_ms is not None:
            if not isinstance(shown_ms, (int, float)) or isinstance(shown_ms, bool):
                raise bad(f"{where}.shown_ms", f"expected a number of milliseconds, got {preview(shown_ms)}")
            out.shown_ms = float(shown_ms)  # the range check names the limit
        for name in ("accepted_chars", "suggestion_chars"):
            value = p.data.get(name)
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise bad(f"{where}.{name}", f"expected a count of characters (a whole number, 0 or more), got {preview(value)}")
                setattr(out, name, min(value, 2**32 - 1))  # the range check names the limit
        acceptance = _choice(p, "acceptance", where, ACCEPTANCES)
        if acceptance is not None:
            out.acceptance = acceptance
        rejection = _choice(p, "rejection", where, REJECTIONS)
        if rejection is not None:
            out.rejection = rejection
        language = p.data.get("language_id")
        if language is not None:
            if not isinstance(language, str):
                raise bad(f"{where}.language_id", f"expected a string, got {preview(language)}")
            out.language_id = language
    except (ValueError, OverflowError) as e:  # lone surrogates in a string
        raise bad(where, f"cannot be used ({e})") from None
    return out


def outcomes_request(data: bytes) -> pb.ReportOutcomesRequest:
    """A body -> the ReportOutcomesRequest it asks for. Raises ApiError."""
    p = Params(parse_body(data, MAX_JSON_VALUES))
    items = p.get("outcomes", (list,), "a list of outcomes", [])
    if len(items) > MAX_BATCH:
        raise bad("outcomes", f"{len(items)} outcomes; at most {MAX_BATCH} per call (send the rest in another)")
    req = pb.ReportOutcomesRequest()
    prefix = p.get("request_id_prefix", (str,), "a string")
    if prefix is not None:
        try:
            req.request_id_prefix = prefix
        except ValueError as e:
            raise bad("request_id_prefix", f"cannot be used ({e})") from None
    req.outcomes.extend(_outcome(item, i) for i, item in enumerate(items))
    return req


def outcomes_body(reply: pb.ReportOutcomesResponse) -> dict:
    return {"recorded": reply.recorded, "unknown_request_ids": reply.unknown_request_ids, "duplicates": reply.duplicates}
