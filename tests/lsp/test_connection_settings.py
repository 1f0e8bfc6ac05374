"""Where the bridge sends code and its token is fixed when it starts.

The command line and the initializationOptions of the editor that started it
set the connection (server, authTokenFile, tls, tlsRootCertFile); settings
that arrive later (didChangeConfiguration, workspace/configuration) may come
from a repository's own config and leave it alone, with a warning. A bearer
token is never sent in plaintext to another machine: the bridge refuses the
configuration and tells the editor, and keeps running.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from lsprotocol import types

from quickdraft.lsp_bridge import cli
from quickdraft.lsp_bridge.server import BridgeServer

DEAD = "127.0.0.1:9"  # nobody listens there


def texts(result: types.InlineCompletionList) -> list[str]:
    return [item.insert_text for item in result.items]


def warnings(editor) -> str:
    return " ".join(m.message for m in editor.client.log_messages if m.type == types.MessageType.Warning)


async def test_did_change_configuration_cannot_redirect_the_server_or_pick_the_token_file(editor, fake_server, tmp_path):
    stolen = tmp_path / "id_ed25519"
    stolen.write_text("PRIVATE KEY\n")
    editor.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"quickdraft": {"server": DEAD, "authTokenFile": str(stolen), "tls": True, "maxTokens": 7}}
        )
    )
    uri = editor.open("m.py", "def m():\n    ")
    assert texts(await editor.inline(uri)) == ["return a + b"]  # still the server it started with
    assert fake_server.fake.requests[-1].max_tokens == 7  # the other settings still apply
    assert "authorization" not in fake_server.fake.metadata[-1]
    logged = warnings(editor)
    assert "didChangeConfiguration" in logged
    assert "server" in logged and "authTokenFile" in logged and "tls" in logged


async def test_pulled_configuration_cannot_redirect_the_server(editor, fake_server):
    editor.client.set_configuration({"server": DEAD, "maxTokens": 5}, section="quickdraft")
    # No settings in the notification: the bridge pulls them with workspace/configuration.
    editor.client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    # A warning comes either way once the pull is applied: this one, or (were
    # the server taken) "127.0.0.1:9 is down"; waiting for it cannot hang.
    while not warnings(editor):
        await asyncio.sleep(0.01)
    assert "ignoring server from workspace/configuration" in warnings(editor)
    uri = editor.open("p.py", "def p():\n    ")
    assert texts(await editor.inline(uri)) == ["return a + b"]
    assert fake_server.fake.requests[-1].max_tokens == 5


async def test_initialization_options_of_the_launching_editor_set_the_server(fake_server, bridge_factory):
    ed = await bridge_factory(DEAD, options={"server": fake_server.address})
    await ed.status.wait_for("up")
    uri = ed.open("i.py", "def i():\n    ")
    assert texts(await ed.inline(uri)) == ["return a + b"]


async def test_plaintext_token_to_a_remote_server_is_refused_with_a_message(bridge_factory, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    ed = await bridge_factory(DEAD, options={"server": "192.0.2.1:50051", "authTokenFile": str(token)})
    # Refused at once, before any connection (were it tried: "down" once 192.0.2.1 times out).
    assert await ed.status.first() == "refused"
    uri = ed.open("r.py", "def r():\n    ")
    # Still serving (empty answers), and the request's answer comes after the message.
    assert texts(await ed.inline(uri)) == []
    shown = [m for m in ed.client.messages if m.type == types.MessageType.Error]
    assert len(shown) == 1
    assert "192.0.2.1" in shown[0].message and "TLS" in shown[0].message and "loopback" in shown[0].message
    assert "s3cret" not in shown[0].message


@pytest.fixture
def started(monkeypatch) -> list:
    """Run ``cli.main`` without serving: the servers it would have started, with how."""
    servers: list = []
    monkeypatch.setattr(BridgeServer, "start_io", lambda self, *a, **k: servers.append((self, "stdio")))
    monkeypatch.setattr(BridgeServer, "start_tcp", lambda self, host, port: servers.append((self, f"{host}:{port}")))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield servers
    root.handlers[:], root.level = handlers, level  # cli.run adds a handler and sets levels


def initialize(server: BridgeServer, options: dict) -> None:
    server.window_log_message = lambda params: None  # no client attached
    handler = server.protocol.fm.features[types.INITIALIZE]
    handler(types.InitializeParams(capabilities=types.ClientCapabilities(), initialization_options=options))


@pytest.mark.parametrize("mode", ["tcp", "stdio"])
def test_initialization_options_set_the_connection_over_stdio_only(mode, started, tmp_path):
    # Over TCP whoever connects sends initialize; over stdio it is the editor that started the bridge.
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    argv = ["--server", "127.0.0.1:50051", "--auth-token-file", str(token), "--log-file", str(tmp_path / "log")]
    assert cli.main(argv + (["--tcp", "127.0.0.1:2087"] if mode == "tcp" else [])) == 0
    [(server, how)] = started
    assert how == ("127.0.0.1:2087" if mode == "tcp" else "stdio")
    initialize(server, {"server": "attacker.example:443", "authTokenFile": "/etc/passwd", "tls": True, "maxTokens": 9})
    connection = (server.settings.server, server.settings.auth_token_file, server.settings.tls)
    if mode == "tcp":
        assert connection == ("127.0.0.1:50051", str(token), False)
    else:
        assert connection == ("attacker.example:443", "/etc/passwd", True)
    assert server.settings.max_tokens == 9  # the other settings apply either way
