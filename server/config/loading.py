"""Reading the tree: defaults < TOML file (``--config``) < environment < ``--set``.

One naming rule for every setting, nested sections included; the dotted path
is the name (``controller.hysteresis.warm_margin``):

- TOML: the sections of the path are tables::

      [controller.hysteresis]
      warm_margin = 0.05

- environment: ``QUICKDRAFT_`` and the path in upper case with each dot
  written as a double underscore:
  ``QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN=0.05``. Variables without
  a double underscore (``QUICKDRAFT_AUTH_TOKEN``) are not settings.
- command line: ``--set controller.hysteresis.warm_margin=0.05``.

Environment and ``--set`` values are text: true/false (also 1/0, yes/no,
on/off), ``none`` for an unset optional field, lists and tables as JSON
(``[[1, 4, 5], [5, 16, 3]]``, ``{"inline": 0.3}``). A list or table value
replaces the default whole.
"""

from __future__ import annotations

import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Mapping

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from quickdraft.server.config import tree
from quickdraft.server.config.errors import ConfigError
from quickdraft.server.config.root import QuickdraftConfig

ALIASES = {"controller.ttft_slo_s": "controller.slo.ttft_s"}
"""Former names still read, mapped to their current path."""

_NONE_WORDS = ("none", "null", "")
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> QuickdraftConfig:
    """Defaults < TOML file < ``QUICKDRAFT_*__*`` environment < overrides
    (``{"section.key": value}``, as ``--set`` gives them). ``env=None`` reads
    ``os.environ``; tests pass ``{}``."""
    cfg = QuickdraftConfig()
    table = read_toml(Path(path)) if path is not None else {}
    if path is not None:
        _apply_table(cfg, table, "", str(path))
    env_paths = []
    for name, value in (os.environ if env is None else env).items():
        dotted = tree.path_of_env(name)
        if dotted is not None:
            set_value(cfg, dotted, value, f"environment variable {name}")
            env_paths.append(dotted)
    for dotted, value in (overrides or {}).items():
        set_value(cfg, dotted, value, "--set")
    said = "enabled" in table.get("speculation", {}) or "speculation.enabled" in [*env_paths, *(overrides or {})]
    if not said and _preset_has_no_drafter(cfg):
        # A preset without a drafter (smollm2-135m-base) serves the target alone
        # unless speculation was asked for; asking without a drafter still fails validation.
        cfg.speculation.enabled = False
    return cfg


def _preset_has_no_drafter(cfg: QuickdraftConfig) -> bool:
    try:
        return cfg.drafter_path(parallel=True) is None and cfg.drafter_path(parallel=False) is None
    except ConfigError:  # an unknown preset: validation reports it
        return False


def read_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"--config {path}: no such file")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML: {e}") from None


def set_value(cfg: QuickdraftConfig, dotted: str, value: Any, source: str) -> None:
    """Set one setting by its dotted path; ``source`` says where the value came from, for errors."""
    owner, setting = _resolve(cfg, dotted, source)
    if setting is None:
        raise ConfigError(f"{source}: {dotted} is a section; name a setting in it ({dotted}.<setting>)")
    setattr(owner, setting.name, coerce(value, setting.hint, f"{source}: {setting.path}"))


def _apply_table(cfg: QuickdraftConfig, table: Mapping[str, Any], prefix: str, source: str) -> None:
    for key, value in table.items():
        dotted = prefix + key
        owner, setting = _resolve(cfg, dotted, source)
        if setting is not None:
            setattr(owner, setting.name, coerce(value, setting.hint, f"{source}: {setting.path}"))
        elif isinstance(value, dict):
            _apply_table(cfg, value, dotted + ".", source)
        else:
            raise ConfigError(f"{source}: {dotted} is a section; write it as a [{dotted}] table")


def _resolve(cfg: QuickdraftConfig, dotted: str, source: str) -> tuple[Any, tree.Setting | None]:
    """(the section object holding the setting, the setting), or (the section, None)
    when the path names a section."""
    dotted = ALIASES.get(dotted, dotted)
    parts = dotted.split(".")
    obj: Any = cfg
    for i, part in enumerate(parts):
        fields = {f.name: (f, hint) for f, hint in tree.fields(type(obj))}
        here = ".".join(parts[: i + 1])
        if part not in fields:
            if i == 0:
                raise ConfigError(f"{source}: unknown section [{part}]; sections are {', '.join(fields)}")
            raise ConfigError(f"{source}: unknown setting {here}; [{'.'.join(parts[:i])}] has {', '.join(fields)}")
        f, hint = fields[part]
        if tree.is_section(hint):
            obj = getattr(obj, part)
            continue
        if i != len(parts) - 1:
            raise ConfigError(f"{source}: {here} is a setting, not a section")
        derived = f.metadata.get(tree.DERIVED)
        if derived:
            raise ConfigError(f"{source}: {dotted} is set by the server from {derived}; set {derived} instead")
        return obj, tree.Setting(dotted, type(obj), part, hint, derived)
    return obj, None


def coerce(value: Any, hint: Any, name: str) -> Any:
    """Turn a TOML, environment or flag value into the field's type; ``name``
    (source and path) starts the error message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS)):
            return None
        return coerce(value, next(a for a in args if a is not type(None)), name)
    if hint is Any:
        return value
    if hint is bool:
        return _boolean(value, name)
    if hint in (int, float):
        return _number(value, hint, name)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected text, got {value!r}")
        return value
    if origin in (list, tuple, dict):
        return _container(value, origin, args, name)
    raise ConfigError(f"{name}: cannot read {value!r} as {hint}")


def _boolean(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS:
        return True
    if isinstance(value, str) and value.strip().lower() in _FALSE_WORDS:
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _number(value: Any, kind: type, name: str) -> int | float:
    what = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{name}: expected {what}, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected {what}, got {value!r}") from None


def _container(value: Any, origin: type, args: tuple, name: str) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{name}: expected a JSON {'table' if origin is dict else 'list'}, got {value!r}") from None
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a table, got {value!r}")
        return {str(k): coerce(v, args[1], f"{name}.{k}") for k, v in value.items()}
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name}: expected a list, got {value!r}")
    if origin is list:
        return [coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)]
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise ConfigError(f"{name}: expected {len(args)} items, got {value!r}")
    return tuple(coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
