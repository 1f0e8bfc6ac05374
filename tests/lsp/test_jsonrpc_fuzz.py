"""Random and malformed JSON-RPC messages never crash the bridge.

One bridge process (stdio) takes every example: well-framed messages whose
bodies are garbage (not JSON, JSON of the wrong shape, real LSP methods with
random params, random ids). After each example a valid request must still get
its answer, and the process must still be running.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Methods the bridge handles, plus some it does not. "exit", "shutdown" and
# "initialize" are left out: they end or restart the session by design.
METHODS = [
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didClose",
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "workspace/didChangeConfiguration",
    "workspace/didChangeWorkspaceFolders",
    "$/cancelRequest",
    "$/setTrace",
    "initialized",
    "textDocument/hover",
    "no/suchMethod",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
positions = st.fixed_dictionaries({"line": st.integers(-3, 10**10), "character": st.integers(-3, 10**10)})
ids = st.integers(-5, 10**6) | st.text(max_size=6) | st.none() | st.lists(st.integers(), max_size=2)


@st.composite
def plausible_params(draw):
    """Params shaped like the real ones, with hostile values."""
    uri = draw(st.sampled_from(["file:///w/a.py", "file:///w/b.ts", "untitled:x", "", "file:///w/%ZZ"]))
    return draw(
        st.sampled_from(
            [
                {"textDocument": {"uri": uri, "languageId": draw(st.text(max_size=8)), "version": draw(st.integers(-2, 5)), "text": draw(st.text(max_size=60))}},
                {
                    "textDocument": {"uri": uri, "version": draw(st.integers(-2, 5))},
                    "contentChanges": [{"range": {"start": draw(positions), "end": draw(positions)}, "text": draw(st.text(max_size=20))}],
                },
                {"textDocument": {"uri": uri}, "position": draw(positions), "context": {"triggerKind": draw(st.integers(-1, 3))}},
                {"settings": draw(json_values)},
                {
                    "settings": {
                        "quickdraft": {
                            "server": draw(st.sampled_from(["", ":", "nohost", "127.0.0.1:9", "[::1]:x", "a" * 300])),
                            "maxFileBytes": draw(st.integers(0, 100)),
                            "debounceMs": draw(st.integers(0, 5)),
                            "authTokenFile": draw(st.sampled_from(["", "/nonexistent", "/"])),
                        }
                    }
                },
                {"id": draw(ids)},
            ]
        )
    )


@st.composite
def messages(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "message"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    message = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0", None])), "method": draw(st.sampled_from(METHODS) | st.text(max_size=10))}
    message["params"] = draw(plausible_params() | json_values)
    if draw(st.booleans()):
        message["id"] = draw(ids)
    return json.dumps(message).encode()


class Bridge:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            # A server address nobody listens on: completions answer empty, fast.
            [sys.executable, "-m", "quickdraft.lsp_bridge", "--server", "127.0.0.1:9", "--log-level", "ERROR"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.responses: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if line in (b"\r\n", b"\n"):
                    break
            self.responses.put(json.loads(out.read(length)))

    def send(self, body: bytes) -> None:
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def request(self, method: str, params) -> dict:
        self.next_id += 1
        probe_id = f"probe-{self.next_id}"
        self.send(json.dumps({"jsonrpc": "2.0", "id": probe_id, "method": method, "params": params}).encode())
        while True:
            # A generous bound only to turn a hang into a failure, not a timing check.
            message = self.responses.get(timeout=30)
            if message.get("id") == probe_id:
                return message

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def bridge():
    b = Bridge()
    init = b.request("initialize", {"processId": None, "rootUri": "file:///w", "capabilities": {}})
    assert "result" in init
    b.send(json.dumps({"jsonrpc": "2.0", "method": "initialized", "params": {}}).encode())
    yield b
    b.close()


PROBE = {"textDocument": {"uri": "file:///w/probe.py"}, "position": {"line": 0, "character": 0}}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batch=st.lists(messages(), min_size=1, max_size=6))
def test_garbage_never_crashes_the_bridge(bridge, batch):
    for body in batch:
        bridge.send(body)
    answer = bridge.request("textDocument/inlineCompletion", PROBE)
    assert bridge.proc.poll() is None
    assert answer.get("result") == {"items": []} or answer.get("result") is None


def test_request_with_unreadable_params_gets_an_error(bridge):
    answer = bridge.request("textDocument/inlineCompletion", {"textDocument": 5, "position": "nowhere"})
    assert answer["error"]["code"] == -32602  # InvalidParams


def test_unknown_method_gets_method_not_found(bridge):
    assert bridge.request("quickdraft/noSuchThing", {})["error"]["code"] == -32601
