"""A cursor in a blank line's indentation (limits.blank_line_from_line_start):
the server asks from the line's start, as the LSP bridge does, and drops the
indentation the client typed from the answer, so raw clients (gRPC, HTTP,
``quickdraft complete``) get no doubled indent.

The rule (quickdraft/prompt_format.from_line_start and
server/preparation.blank_line_from_line_start), the stream filter
(service.IndentStrip), the service with a fake engine, and gRPC over loopback
with the CLI and the HTTP API in front. No vLLM."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import pytest

from quickdraft.prompt_format import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, from_line_start
from quickdraft.server.config import load_config
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.frontend import Auth
from quickdraft.server.grpc_server import GrpcServer
from quickdraft.server.openai.api_router import build_app
from quickdraft.server.openai.serving import OpenAIServing
from quickdraft.server.preparation import blank_line_from_line_start, prepare
from quickdraft.server.service import CompletionService, IndentStrip
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import Telemetry
from quickdraft.v1 import completion_pb2 as pb
from tests.test_service import PROMPT_TOKENS, TOKENIZER, FakeEngine

FIB = "def fibonacci(n):\n    "  # the README's sample: cursor at 2:5
SPEC = SpecConfig(True, 5)


def cfg_with(**limits):
    cfg = load_config(env={}, overrides={"server.port": 0, "telemetry.metrics_port": 0})
    for name, value in limits.items():
        setattr(cfg.limits, name, value)
    return cfg


# --- the rule -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "suffix", "moved", "typed"),
    [
        (FIB, "", ("def fibonacci(n):\n", ""), "    "),  # after the indentation, at the file's end
        ("def f():\n    ", "\n    return 1\n", ("def f():\n", "    return 1\n"), "    "),
        ("def f():\n  ", "  \n    return 1\n", ("def f():\n", "    return 1\n"), "  "),  # inside the indentation
        ("def f():\n\t\t", "\n\treturn 1\n", ("def f():\n", "\treturn 1\n"), "\t\t"),  # tabs
        ("\t", "\nx", ("", "x"), "\t"),  # the file's first line
        ("def f():\r\n    ", "\r\n    pass\r\n", ("def f():\r\n", "    pass\r\n"), "    "),  # CRLF
    ],
)
def test_a_cursor_in_a_blank_lines_indentation_is_asked_from_the_line_start(prefix, suffix, moved, typed):
    assert from_line_start(prefix, suffix) == moved
    req = pb.CompleteRequest(prefix=prefix, suffix=suffix, file_path="f.py", max_tokens=7)
    out, indent = blank_line_from_line_start(req, cfg_with())
    assert (out.prefix, out.suffix, indent) == (*moved, typed)
    assert (out.file_path, out.max_tokens) == ("f.py", 7)  # the rest of the request kept
    assert (req.prefix, req.suffix) == (prefix, suffix)  # the caller's message untouched


@pytest.mark.parametrize(
    ("prefix", "suffix"),
    [
        ("def f():\n", "    return 1\n"),  # at a line start, as the bridge sends: byte-identical
        ("def f():\n", "\n    return 1\n"),  # an empty line, cursor at its start
        ("", "x = 1\n"),  # the file's start
        ("def f():\n    ret", "\n"),  # code before the cursor
        ("def f():\n    ", "pass\n"),  # code after it
        ("def f():\n    ", "  # todo\n"),  # a comment after it is code too
        ("x = 1  ", "\n"),  # trailing spaces after code
    ],
)
def test_a_line_start_or_a_line_with_code_is_untouched(prefix, suffix):
    req = pb.CompleteRequest(prefix=prefix, suffix=suffix)
    out, indent = blank_line_from_line_start(req, cfg_with())
    assert out is req and indent == ""


@pytest.mark.parametrize(
    ("req", "cfg"),
    [
        (pb.CompleteRequest(prefix=FIB), cfg_with()),  # no suffix: the model continues the prefix
        (pb.CompleteRequest(prefix=FIB, raw_prompt=True), cfg_with()),  # the client's own prompt
        (pb.CompleteRequest(prefix=FIB, suffix="\n"), cfg_with(blank_line_from_line_start=False)),
        (pb.CompleteRequest(prefix=FIB, suffix="\n"), load_config(env={}, overrides={"model.preset": "smollm2-135m-base"})),  # "plain"
    ],
    ids=["no-suffix", "raw", "off", "plain-format"],
)
def test_requests_the_rule_does_not_apply_to(req, cfg):
    out, indent = blank_line_from_line_start(req, cfg)
    assert out is req and indent == ""


def test_prepare_renders_the_moved_prompt_and_records_the_typed_indent():
    p = prepare(pb.CompleteRequest(prefix=FIB, suffix=""), cfg_with(), PROMPT_TOKENS)
    assert p.typed_indent == "    "
    assert TOKENIZER.decode(p.prompt_token_ids) == f"{FIM_PREFIX}def fibonacci(n):\n{FIM_SUFFIX}{FIM_MIDDLE}"
    # The bridge's prompt (already at the line start) renders exactly as before.
    bridge = prepare(pb.CompleteRequest(prefix="def fibonacci(n):\n", suffix=""), cfg_with(), PROMPT_TOKENS)
    assert bridge.typed_indent == "" and bridge.prompt_token_ids == p.prompt_token_ids


# --- the stream filter ----------------------------------------------------------------


def strip(width: int, chunks: list[str]) -> list[str]:
    s = IndentStrip(width)
    return [s.feed(c) for c in chunks]


@pytest.mark.parametrize(
    ("width", "chunks", "expected"),
    [
        (4, ["    return 1"], "return 1"),
        (4, ["  ", "  ", "return 1"], "return 1"),  # whitespace split over tokens
        (4, [" ", " ", " ", " ", "return"], "return"),
        (4, ["   ", " ret", "urn"], "return"),  # the split lands inside a token
        (4, ["        if n:"], "    if n:"),  # the model indents deeper: the excess kept
        (4, ["  ", "    if n:"], "  if n:"),
        (8, ["    return 1"], "return 1"),  # shallower: all of its indentation dropped
        (4, ["\n    return 1"], "\n    return 1"),  # a line break first: nothing dropped
        (4, ["  \n", "    x"], "\n    x"),  # a first line of only spaces: they go, the break stays
        (4, ["    ", "\n"], "\n"),
        (4, ["    return 1\n", "    return 2"], "return 1\n    return 2"),  # later lines untouched
        (4, ["    x", "    y"], "x    y"),  # done after the first line's indentation
        (1, ["\t\treturn"], "\treturn"),  # tabs
        (4, [], ""),  # an empty completion
        (4, ["  "], ""),  # only whitespace within the width
    ],
)
def test_the_typed_indentation_is_dropped_from_the_answers_start(width, chunks, expected):
    assert "".join(strip(width, chunks)) == expected


def test_the_strip_holds_nothing_back_past_the_indentation():
    # A delta is answered at once as soon as it is not all (droppable) whitespace.
    assert strip(4, ["  ", "  x", "y"]) == ["", "x", "y"]
    assert strip(4, ["r", "  "]) == ["r", "  "]


# --- the service, with a fake engine ---------------------------------------------------


@dataclass
class RecordingEngine(FakeEngine):
    """A FakeEngine that keeps the prompts it was asked."""

    prompts: list[list[int]] = field(default_factory=list)

    async def generate(self, request_id, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        async for out in super().generate(request_id, prompt_ids, sampling):
            yield out


MODEL_ANSWER = [("  ", 1), ("  return", 1), (" fib(n)", 3)]  # whole line, with its indentation


def service_with(engine: FakeEngine, **limits) -> tuple[EngineManager, CompletionService]:
    cfg = cfg_with(**limits)

    async def factory(cfg, spec, live=False):
        return engine

    manager = EngineManager(cfg, engine_factory=factory)
    return manager, CompletionService(cfg, manager, Telemetry("embedded"))


@pytest.mark.parametrize("on", [True, False])
def test_the_service_streams_the_line_without_the_typed_indentation(on):
    async def run():
        engine = RecordingEngine(SPEC, steps=MODEL_ANSWER)
        manager, service = service_with(engine, blank_line_from_line_start=on)
        await manager.start(SPEC)
        msgs = [m async for m in service.complete(pb.CompleteRequest(prefix=FIB, suffix=""), "c")]
        await manager.stop()
        return engine, msgs

    engine, msgs = asyncio.run(run())
    texts = [m.text for m in msgs[:-1]]
    prompt = TOKENIZER.decode(engine.prompts[0])
    if on:
        assert texts == ["return", " fib(n)"]  # the all-whitespace first delta is not sent
        assert prompt.endswith(f"def fibonacci(n):\n{FIM_SUFFIX}{FIM_MIDDLE}")
    else:
        assert texts == ["  ", "  return", " fib(n)"]
        assert prompt.endswith(f"def fibonacci(n):\n    {FIM_SUFFIX}{FIM_MIDDLE}")
    final = msgs[-1].final
    assert final.completion_tokens == 5  # every token counts, the dropped ones too
    assert final.finish_reason == pb.FINISH_REASON_LENGTH and final.ttft_ms > 0


# --- over gRPC (the CLI) and HTTP ------------------------------------------------------


@pytest.fixture
async def stack():
    engine = RecordingEngine(SPEC, steps=MODEL_ANSWER)
    manager, service = service_with(engine)
    server = GrpcServer(service.cfg, service, Auth(None))
    await server.start()
    await manager.start(SPEC)
    yield engine, service, server
    await server.stop(0)
    await manager.stop()


async def test_quickdraft_complete_on_a_blank_line_prints_the_line_without_a_doubled_indent(stack, tmp_path, capsys):
    from quickdraft.cli import main

    engine, _, server = stack
    path = tmp_path / "fib.py"
    path.write_text(FIB)
    rc = await asyncio.to_thread(main, ["complete", f"{path}:2:5", "--server", f"127.0.0.1:{server.port}"])
    assert rc == 0
    assert capsys.readouterr().out == "return fib(n)\n"
    assert TOKENIZER.decode(engine.prompts[-1]).endswith(f"def fibonacci(n):\n{FIM_SUFFIX}{FIM_MIDDLE}")


async def test_quickdraft_complete_from_stdin_asks_at_the_end_of_a_file(stack, capsys, monkeypatch):
    import io

    from quickdraft.cli import main

    engine, _, server = stack
    monkeypatch.setattr("sys.stdin", io.StringIO("def fibonacci(n):\n    "))
    rc = await asyncio.to_thread(main, ["complete", "-", "--server", f"127.0.0.1:{server.port}"])
    assert rc == 0
    assert capsys.readouterr().out == "return fib(n)\n"
    assert TOKENIZER.decode(engine.prompts[-1]).endswith(f"def fibonacci(n):\n{FIM_SUFFIX}{FIM_MIDDLE}")


async def test_the_bridges_line_start_prompt_comes_through_unchanged(stack):
    from quickdraft.client import AsyncCompletionClient

    engine, _, server = stack
    async with AsyncCompletionClient(f"127.0.0.1:{server.port}") as client:
        stream = client.complete(prefix="def fibonacci(n):\n", suffix="")
        text = await stream.text()
    assert text == "    return fib(n)"  # the bridge shapes it itself (lsp_bridge/postprocess.py)
    assert TOKENIZER.decode(engine.prompts[-1]).endswith(f"def fibonacci(n):\n{FIM_SUFFIX}{FIM_MIDDLE}")


async def test_the_http_api_gets_it_too(stack):
    _, service, _ = stack
    app = build_app(OpenAIServing(service.cfg, service, Auth(None)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://quickdraft.test") as c:
        r = await c.post("/v1/completions", json={"prompt": FIB, "suffix": "\n", "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "return fib(n)"
        # Without a suffix the prompt is raw (sent as written): untouched.
        r = await c.post("/v1/completions", json={"prompt": FIB, "max_tokens": 8})
        assert r.json()["choices"][0]["text"] == "    return fib(n)"
