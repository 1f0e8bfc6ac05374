"""Process lifecycle: exit codes as the spec says, clean end on stdin EOF."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _bridge() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "quickdraft.lsp_bridge", "--server", "127.0.0.1:9"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def _send(proc: subprocess.Popen, message: dict) -> None:
    body = json.dumps(message).encode()
    proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    proc.stdin.flush()


def _read_until_id(proc: subprocess.Popen, msg_id: int) -> dict:
    while True:
        length = 0
        while (line := proc.stdout.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        assert length, "the bridge closed its output"
        message = json.loads(proc.stdout.read(length))
        if message.get("id") == msg_id:
            return message


@pytest.mark.parametrize(("shutdown_first", "code"), [(True, 0), (False, 1)])
def test_exit_code(shutdown_first, code):
    proc = _bridge()
    _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "rootUri": None, "capabilities": {}}})
    _read_until_id(proc, 1)
    _send(proc, {"jsonrpc": "2.0", "method": "initialized", "params": {}})
    if shutdown_first:
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
        assert _read_until_id(proc, 2)["result"] is None
    _send(proc, {"jsonrpc": "2.0", "method": "exit"})
    assert proc.wait(timeout=30) == code


def test_end_of_input_ends_the_process():
    proc = _bridge()
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
