"""The bridge driven as an editor drives it: a subprocess speaking LSP over stdio,
in front of a real gRPC server with a fake Completion servicer."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from quickdraft.v1 import completion_pb2 as pb


async def test_open_and_complete(editor, fake_server):
    text = "def add(a, b):\n    "
    uri = editor.open("calc.py", text)
    result = await editor.inline(uri)
    assert [item.insert_text for item in result.items] == ["return a + b"]
    request = fake_server.fake.requests[-1]
    assert request.prefix == text
    assert request.suffix == ""
    assert request.language_id == "python"
    assert request.file_path == "calc.py"
    assert request.repo_name == editor.root.name
    assert request.latency_class == pb.LATENCY_CLASS_INLINE
