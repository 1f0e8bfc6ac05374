"""The config tree as a whole: every setting is documented, settable by TOML,
environment and --set with the same value, and every controller setting
reaches the ControllerSettings the server builds."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Any

import pytest

from quickdraft.server.config import ConfigError, ControllerSettings, QuickdraftConfig, load_config, tree
from quickdraft.server.config.tree import Setting

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = [s for s in tree.settings(QuickdraftConfig) if not s.derived_from]
CONTROLLER = [s for s in SETTINGS if s.path.startswith("controller.")]


def get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _plain(hint: Any) -> Any:
    """X for ``X | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) else hint


def sample(setting: Setting) -> Any:
    """A value of the setting's type that differs from its default and keeps
    the controller's sections valid (it moves numbers by about 1%)."""
    default = get(QuickdraftConfig(), setting.path)
    hint = _plain(setting.hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return not default
    if hint is int:
        return default - 1 if default and default > 1 else (default or 0) + 1
    if hint is float:
        return default * 1.01 if default else 0.01
    if hint is str:
        return f"{default}-x" if default else "value"
    if origin is dict:
        return {k: v * 1.01 for k, v in default.items()} if default else {"enable_prefix_caching": True}
    if origin is list:
        if typing.get_origin(args[0]) is tuple:
            return [(1, 2, 3), (3, 16, 1)]
        return ["10.0.0.1", "10.0.0.0/8"] if args[0] is str else [0.5, 0.25]
    raise AssertionError(f"{setting.path}: no sample for {hint}; teach sample() the new type")


def as_text(value: Any) -> str:
    """The value as the environment or --set gives it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def as_toml(values: dict[Setting, Any]) -> str:
    tables: dict[str, list[str]] = {}
    for s, v in values.items():
        tables.setdefault(s.path.rsplit(".", 1)[0], []).append(f"{s.name} = {tree.toml_value(v)}")
    return "\n".join(f"[{table}]\n" + "\n".join(lines) + "\n" for table, lines in tables.items())


def test_every_section_and_setting_is_documented():
    sections = [path for path, cls in tree.sections(QuickdraftConfig) if not tree.section_doc(cls)]
    settings = [s.path for s in tree.settings(QuickdraftConfig) if not s.doc]
    assert not sections, f"sections without a class docstring: {sections}"
    assert not settings, f"settings without a docstring right below the field: {settings}"


def test_the_tree_has_the_controller_sections_nested():
    paths = [path for path, _ in tree.sections(QuickdraftConfig)]
    for name in ("slo", "hysteresis", "exploration", "acceptance", "step_model", "fallback", "load", "schedule"):
        assert f"controller.{name}" in paths
    assert {"controller.hysteresis.warm_margin", "controller.exploration.max_load_for_build"} <= {s.path for s in SETTINGS}


@pytest.mark.parametrize("source", ["set", "env", "toml"])
def test_every_setting_is_settable_by_each_source(source, tmp_path):
    values = {s: sample(s) for s in SETTINGS}
    if source == "set":
        cfg = load_config(env={}, overrides={s.path: as_text(v) for s, v in values.items()})
    elif source == "env":
        cfg = load_config(env={s.env_name: as_text(v) for s, v in values.items()})
    else:
        path = tmp_path / "all.toml"
        path.write_text(as_toml(values))
        cfg = load_config(path, env={})
    wrong = {s.path: (get(cfg, s.path), v) for s, v in values.items() if get(cfg, s.path) != v}
    assert not wrong, f"not read back as set ({source}): {wrong}"


def test_env_names_follow_the_rule():
    assert tree.env_name("controller.hysteresis.warm_margin") == "QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN"
    assert tree.path_of_env("QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN") == "controller.hysteresis.warm_margin"
    assert tree.path_of_env("QUICKDRAFT_AUTH_TOKEN") is None  # a secret, not a setting
    cfg = load_config(env={"QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN": "0.05", "QUICKDRAFT_AUTH_TOKEN": "secret"})
    assert cfg.controller.hysteresis.warm_margin == 0.05


def test_controller_settings_receive_every_controller_setting(monkeypatch):
    from quickdraft.server import controller_loop

    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: True)
    values = {s: sample(s) for s in CONTROLLER}
    cfg = load_config(env={}, overrides={s.path: v for s, v in values.items()} | {"engine.max_num_seqs": 9})
    settings = controller_loop.controller_settings(cfg)
    assert isinstance(settings, ControllerSettings)
    server_only = {"enabled", "decide_every_s", "profile_dir", "allow_rebuild", "standby_engines", "observations_file"}
    for s, v in values.items():
        name = s.path.removeprefix("controller.")
        if name not in server_only:
            assert get(settings, name) == v, f"{s.path} = {v!r} did not reach ControllerSettings.{name}"
    assert settings.schedule.max_batch == 9  # derived from engine.max_num_seqs
    assert cfg.controller.schedule.max_batch == 64  # the user's config is left alone


def test_parallel_schedules_are_off_where_vllm_crashes_on_them(monkeypatch):
    from quickdraft.server import controller_loop

    monkeypatch.setattr(controller_loop, "parallel_schedules_supported", lambda: False)
    without_live = load_config(env={}, overrides={"speculation.live_switching": False})
    assert controller_loop.controller_settings(without_live).schedule.parallel is False
    assert controller_loop.controller_settings(load_config(env={})).schedule.parallel is True  # live switching sets the slots per step


@pytest.mark.parametrize("setting", [s for s in SETTINGS if _plain(s.hint) in (bool, int, float)], ids=lambda s: s.path)
def test_a_value_of_the_wrong_type_names_the_setting(setting):
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides={setting.path: "not-a-value"})
    assert setting.path in str(err.value)


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"controller.hysteresis.warm_margin": "1.5"}, "controller.hysteresis.warm_margin = 1.5: use a fraction in [0, 1)"),
        ({"controller.exploration.max_load_for_build": "-1"}, "controller.exploration.max_load_for_build"),
        ({"controller.fallback.kv_low": "0.95"}, "controller.fallback needs 0 < kv_low < kv_high"),
        ({"controller.slo.ttft_s": '{"urgent": 1.0}'}, "unknown latency class 'urgent'"),
        ({"controller.slo.ttft_s": '{"chat": -1}'}, "controller.slo.ttft_s.chat"),
        ({"controller.decide_every_s": "0"}, "controller.decide_every_s"),
        ({"controller.standby_engines": "9"}, "controller.standby_engines = 9: use 0 to 4"),
        ({"controller.acceptance.max_positions": "17"}, "controller.acceptance.max_positions"),
        ({"controller.schedule.k_change_tolerance": "0.7"}, "controller.schedule.k_change_tolerance"),
    ],
)
def test_controller_validation_names_the_setting(values, fragment):
    cfg = load_config(env={}, overrides=values)
    with pytest.raises(ConfigError) as err:
        cfg.validate(check_files=False, check_vllm=False)
    assert fragment in str(err.value)


def test_derived_settings_are_refused_with_their_source():
    with pytest.raises(ConfigError, match="controller.schedule.max_batch is set by the server from engine.max_num_seqs"):
        load_config(env={}, overrides={"controller.schedule.max_batch": "8"})


def test_the_former_name_of_the_ttft_slo_still_reads(tmp_path):
    f = tmp_path / "old.toml"
    f.write_text("[controller]\nttft_slo_s = { inline = 0.2, batch = 10.0 }\n")
    cfg = load_config(f, env={})
    assert cfg.controller.slo.ttft_s == {"inline": 0.2, "batch": 10.0} == cfg.controller.ttft_slo_s
    cfg = load_config(env={}, overrides={"controller.ttft_slo_s": '{"inline": 0.25}'})
    assert cfg.controller.slo.ttft_s == {"inline": 0.25}


def test_the_chat_slo_default_is_the_controllers():
    """docs/controller.md and the controller's tests use chat 1.5 s; batch is unconstrained."""
    from quickdraft.server.config import SLOSettings

    assert load_config(env={}).controller.slo.ttft_s == SLOSettings().ttft_s == {"inline": 0.3, "chat": 1.5}


def test_sections_and_settings_are_not_confused(tmp_path):
    with pytest.raises(ConfigError, match=r"controller.hysteresis is a section"):
        load_config(env={}, overrides={"controller.hysteresis": "1"})
    with pytest.raises(ConfigError, match=r"controller.enabled is a setting, not a section"):
        load_config(env={}, overrides={"controller.enabled.x": "1"})
    with pytest.raises(ConfigError, match=r"unknown setting controller.hysteresis.warm_margn; \[controller.hysteresis\] has .*warm_margin"):
        load_config(env={"QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGN": "1"})
    f = tmp_path / "flat.toml"
    f.write_text("[controller]\nhysteresis = 3\n")
    with pytest.raises(ConfigError, match=r"write it as a \[controller.hysteresis\] table"):
        load_config(f, env={})


def test_quickdraft_serve_set_reaches_nested_controller_settings(monkeypatch):
    from quickdraft.cli import build_parser, serve_config

    for name in [n for n in os.environ if tree.path_of_env(n)]:  # only --set and flags
        monkeypatch.delenv(name)
    args = build_parser().parse_args(["serve", "--controller", "--port", "6000",
                                      "--set", "controller.hysteresis.warm_margin=0.05",
                                      "--set", "controller.exploration.max_load_for_build=4"])
    cfg = serve_config(args)
    assert cfg.controller.enabled and cfg.server.port == 6000
    assert cfg.controller.hysteresis.warm_margin == 0.05 and cfg.controller.exploration.max_load_for_build == 4.0
    with pytest.raises(ConfigError, match="--set expects path=value"):
        serve_config(build_parser().parse_args(["serve", "--set", "warm_margin"]))


def test_the_markdown_command_prints_the_committed_reference(capsys):
    from quickdraft.server.config.__main__ import main

    assert main(["markdown"]) == 0
    out = capsys.readouterr().out
    assert out == (ROOT / "docs" / "configuration.md").read_text(), (
        "docs/configuration.md is stale: python -m quickdraft.server.config markdown > docs/configuration.md")
    for s in SETTINGS:
        assert f"`{s.env_name}`" in out, f"{s.path} is missing from the reference"
