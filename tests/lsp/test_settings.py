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


def test_runtime_changes_leave_the_connection_settings_alone():
    start = Settings(server="127.0.0.1:50051", auth_token_file="/home/me/.quickdraft-token")
    options = {
        "quickdraft": {
            "server": "attacker.example:443",
            "authTokenFile": "/home/me/.ssh/id_ed25519",
            "tls": True,
            "tlsRootCertFile": "/repo/evil-ca.pem",
            "maxTokens": 5,
        }
    }
    new, ignored = start.merged_at_runtime(options)
    assert (new.server, new.auth_token_file, new.tls, new.tls_root_cert_file) == (
        "127.0.0.1:50051", "/home/me/.quickdraft-token", False, "",
    )
    assert new.max_tokens == 5
    assert ignored == ["authTokenFile", "server", "tls", "tlsRootCertFile"]
    # Repeating the current values changes nothing, so there is nothing to warn about.
    same, ignored = start.merged_at_runtime({"server": "127.0.0.1:50051", "debounceMs": 3})
    assert ignored == [] and same.debounce_ms == 3
    # At start, from the editor that launched the bridge, they are taken.
    assert start.merged(options).server == "attacker.example:443"


@pytest.mark.parametrize("address", ["0.0.0.0:2087", "192.0.2.1:2087", "[::]:2087", "example.com:2087", "localhost.example.com:2087"])
def test_tcp_refuses_a_non_loopback_host(address, capsys):
    parser = cli.configure_parser(argparse.ArgumentParser(prog="quickdraft lsp"))
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--tcp", address])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --tcp" in err and "not a loopback address" in err and "127.0.0.1, ::1 or localhost" in err


@pytest.mark.parametrize("address, expected", [("127.0.0.1:2087", ("127.0.0.1", 2087)), ("[::1]:2087", ("::1", 2087)),
                                               ("localhost:2087", ("localhost", 2087)), (":2087", ("127.0.0.1", 2087))])
def test_tcp_accepts_loopback_hosts(address, expected):
    parser = cli.configure_parser(argparse.ArgumentParser(prog="quickdraft lsp"))
    assert parser.parse_args(["--tcp", address]).tcp == expected


def test_bridge_server_refuses_to_listen_beyond_loopback(monkeypatch):
    from pygls.lsp.server import LanguageServer

    from quickdraft.lsp_bridge.server import create_server

    listened: list[tuple[str, int]] = []  # what pygls was asked to listen on (never really)
    monkeypatch.setattr(LanguageServer, "start_tcp", lambda self, host, port: listened.append((host, port)))
    with pytest.raises(ValueError, match="0.0.0.0:2087.*only listens on loopback"):
        create_server().start_tcp("0.0.0.0", 2087)
    assert listened == []
    create_server().start_tcp("127.0.0.1", 2087)
    assert listened == [("127.0.0.1", 2087)]
