"""``quickdraft lsp --tcp HOST:PORT``: the same server over a TCP socket."""

from __future__ import annotations

import asyncio
import json
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _message(reader: asyncio.StreamReader) -> dict:
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return json.loads(await reader.readexactly(length))


async def test_tcp_transport(fake_server):
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "quickdraft.lsp_bridge", "--tcp", f"127.0.0.1:{port}", "--server", fake_server.address,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        while True:  # until the server listens (it exits on error, which fails the test)
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                assert proc.returncode is None
                await asyncio.sleep(0.05)

        def send(message: dict) -> None:
            body = json.dumps(message).encode()
            writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}})
        init = await _message(reader)
        assert init["id"] == 1
        assert "completionProvider" in init["result"]["capabilities"]  # no inline support declared
        assert init["result"]["capabilities"]["positionEncoding"] == "utf-16"
        send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": "file:///t/a.py", "languageId": "python", "version": 1, "text": "def f():\n    "}}})
        send({"jsonrpc": "2.0", "id": 2, "method": "textDocument/completion", "params": {"textDocument": {"uri": "file:///t/a.py"}, "position": {"line": 1, "character": 4}}})
        while (message := await _message(reader)).get("id") != 2:
            pass
        assert message["result"]["items"][0]["textEdit"]["newText"] == "return a + b"
        writer.close()
    finally:
        proc.kill()
        await proc.wait()
