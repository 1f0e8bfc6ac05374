"""The shape of the config tree: which fields are sections and which are
settings, each setting's dotted path, environment name and docstring.

Loading (TOML, environment, ``--set``), the generated reference
(docs/configuration.md) and the tests all walk the tree through this module,
so a field added to a section is settable and documented everywhere at once.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Iterator

ENV_PREFIX = "QUICKDRAFT_"
ENV_SEPARATOR = "__"

DERIVED = "derived_from"
"""Field metadata key: the field is computed by the server at start (the
value names its source) and cannot be set by a user."""


@dataclass(frozen=True)
class Setting:
    """One leaf of the tree."""

    path: str
    """Dotted path: ``controller.hysteresis.warm_margin``."""
    section: type
    """The dataclass that holds the field."""
    name: str
    hint: Any
    """The field's type, resolved."""
    derived_from: str | None
    """Where the server takes the value from, for fields users cannot set."""

    @property
    def env_name(self) -> str:
        return env_name(self.path)

    @property
    def doc(self) -> str:
        return field_docs(self.section).get(self.name, "")


def env_name(path: str) -> str:
    """``controller.hysteresis.warm_margin`` -> ``QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN``."""
    return ENV_PREFIX + path.upper().replace(".", ENV_SEPARATOR)


def path_of_env(name: str) -> str | None:
    """The dotted path an environment variable sets, or None when it is not a
    config variable (``QUICKDRAFT_AUTH_TOKEN`` has no ``__``: it is a secret,
    read by name from ``security.auth_token_env``)."""
    if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
        return None
    return name[len(ENV_PREFIX):].lower().replace(ENV_SEPARATOR, ".")


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """The dataclass's fields with their resolved types, in declaration order."""
    hints = type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(dotted path, dataclass) of every section below ``cls``, depth first."""
    for f, hint in fields(cls):
        if is_section(hint):
            path = f"{prefix}{f.name}"
            yield path, hint
            yield from sections(hint, path + ".")


def settings_of(cls: type, prefix: str = "") -> list[Setting]:
    """The leaves directly in one section (not in its sub-sections)."""
    return [Setting(f"{prefix}{f.name}", cls, f.name, hint, f.metadata.get(DERIVED))
            for f, hint in fields(cls) if not is_section(hint)]


def settings(cls: type) -> Iterator[Setting]:
    """Every leaf below the root ``cls``."""
    for path, section in sections(cls):
        yield from settings_of(section, path + ".")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written right below the field, whitespace
    collapsed. Python keeps no such docstrings at run time: read the source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # inherited fields too; a subclass's docstring wins
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def section_doc(cls: type) -> str:
    return " ".join((inspect.getdoc(cls) or "").split())


def toml_value(value: Any) -> str:
    """A value as TOML writes it (None has no TOML form: ``none``, which the
    loader reads as None for optional fields)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {value!r}")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)
