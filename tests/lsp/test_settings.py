"""Settings from editors, and the command line entry point."""

from __future__ import annotations

import argparse

import pytest

from quickdraft.lsp_bridge import cli
from quickdraft.lsp_bridge.settings import Settings


def test_camel_case_keys_flat_or_under_the_section():
    s = Settings().merged({"debounceMs": 10, "maxTokens": 5, "enableInComments": True})
    assert (s.debounce_ms, s.max_tokens, s.enable_in_comments) == (10, 5, True)
    s = Settings().merged({"quickdraft": {"server": "10.0.0.1:9000", "disabledLanguages": ["markdown"]}})
    assert s.server == "10.0.0.1:9000" and s.disabled_languages == ("markdown",)


@pytest.mark.parametrize(
    "options",
    [{"debounceMs": "fast"}, {"debounceMs": -1}, {"maxTokens": True}, {"server": 42}, {"disabledLanguages": "python"}, None, [1, 2], "x"],
)
def test_bad_values_are_ignored(options):
    assert Settings().merged(options) == Settings()


def test_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    assert Settings(auth_token_file=str(token)).read_token() == "secret"
    assert Settings(auth_token_file=str(tmp_path / "missing")).read_token() is None
    assert Settings().read_token() is None


def test_cli_subparser_wires_run():
    parser = argparse.ArgumentParser(prog="quickdraft")
    sub = parser.add_subparsers(dest="command")
    cli.add_subparser(sub)
    args = parser.parse_args(["lsp", "--server", "h:1", "--tcp", "127.0.0.1:2087"])
    assert args.func is cli.run
    assert args.server == "h:1" and args.tcp == ("127.0.0.1", 2087)
    with pytest.raises(SystemExit):
        parser.parse_args(["lsp", "--tcp", "nonsense"])
