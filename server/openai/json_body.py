"""Reading a request body as JSON, bounded: it comes from anyone who can reach
the port, and it is read on the event loop every stream shares.

Before ``json.loads`` walks a body, its values are counted from the bytes at C
speed: parsing is about a microsecond per value, so an 8 MB body of
``[1,1,1,...]`` held the loop for the best part of a second (and walking the
result for longer), stalling every other client's stream. Then the parse
refuses deep nesting and never converts a number Python cannot. Every refusal is
an ``ApiError(400)`` naming what was wrong.
"""

from __future__ import annotations

import json
from typing import Any

from quickdraft.server.openai.protocol import ApiError

# No parameter nests more than 5 levels (messages[i].content[j].text); far
# deeper bodies are refused before anything walks them.
MAX_DEPTH = 32
# An int64 has 19 digits; Python's int() refuses 4,300+ (ValueError).
MAX_DIGITS = 40


class HugeNumber:
    """A JSON integer of more than MAX_DIGITS digits, left unconverted: any
    parameter that wants a number then refuses it by name (and int() of one
    of 4,300+ digits would raise)."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits}-digit number"


class _NotJson(ValueError):
    pass


def _integer(text: str) -> int | HugeNumber:
    return int(text) if len(text) <= MAX_DIGITS else HugeNumber(len(text.lstrip("-")))


def _constant(name: str) -> Any:
    # Python's json reads NaN and Infinity; JSON has neither.
    raise _NotJson(f"{name} is not a JSON number")


def values_bound(data: bytes, limit: int) -> int:
    """An upper bound on the values in JSON text (keys, strings, numbers,
    literals, arrays, objects), from byte counts alone; exact enough up to
    ``limit``, and past it only known to be past it.

    Strings are counted by their quotes, once escaped quotes and backslashes are
    dropped; everything else starts after a comma, colon or opening bracket
    outside the strings. (Past a backslash outside a string, where this view
    and the parser's part, the parser stops with an error.)
    """
    structural = (b",", b":", b"[", b"{")
    quick = data.count(b'"') // 2 + sum(map(data.count, structural)) + 1
    if quick <= limit:
        return quick  # the common case: commas and colons inside strings counted too
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = data.count(b'"') // 2
    if strings > limit:
        return strings
    outside = b"".join(data.split(b'"')[::2])  # at most 2 * limit + 1 pieces
    return strings + sum(map(outside.count, structural)) + 1


_CONTAINERS = frozenset((list, dict))


def _too_deep(value: Any) -> bool:
    """Whether arrays and objects nest more than MAX_DEPTH levels. Level by level
    without recursion; containers holding only scalars are skipped at C speed, so
    a long flat list costs little."""
    level = [value] if type(value) in _CONTAINERS else []
    for _ in range(MAX_DEPTH):
        deeper: list = []
        for v in level:
            items = v.values() if type(v) is dict else v
            if any(map(_CONTAINERS.__contains__, map(type, items))):
                deeper.extend(c for c in items if type(c) in _CONTAINERS)
        if not deeper:
            return False
        level = deeper
    return True


def parse_body(data: bytes, max_values: int) -> Any:
    """A request body (its size already checked) as JSON; ApiError(400) naming
    what is wrong: not UTF-8, more than ``max_values`` values, not JSON,
    NaN/Infinity, or nested too deeply."""
    too_deep = ApiError(400, f"request body is nested too deeply: at most {MAX_DEPTH} levels of arrays and objects")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {e.start})") from None
    if values_bound(data, max_values) > max_values:
        raise ApiError(400, f"request body holds more than {max_values} JSON values (keys, strings, numbers, arrays and objects); "
                            "a completion request needs far fewer: send one prompt or conversation per request")
    try:
        body = json.loads(text, parse_int=_integer, parse_constant=_constant)
    except RecursionError:
        # The C decoder stops at the interpreter's recursion limit.
        raise too_deep from None
    except ValueError as e:  # JSONDecodeError, _NotJson
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    if _too_deep(body):
        raise too_deep
    return body
