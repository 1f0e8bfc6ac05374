"""The LSP bridge in front of the real server (embedded model): an editor asks
for inline completions and gets model text; a cancelled request frees the engine."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.lsp.conftest import start_bridge

pytestmark = pytest.mark.engine


async def _shutdown(editor):
    await editor.client.shutdown_session()


async def test_inline_completion_from_the_embedded_model(server, tmp_path):
    editor, result = await start_bridge(server.address, tmp_path)
    try:
        text = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        "
        uri = editor.open("point.py", text)
        completion = await editor.inline(uri)
        assert completion.items, "no completion from the real model"
        insert = completion.items[0].insert_text
        assert isinstance(insert, str) and insert.strip()
        # The bridge cut the suggestion to the enclosing block: nothing dedents out of __init__.
        for line in insert.splitlines()[1:]:
            assert not line.strip() or line.startswith("        ")
    finally:
        await _shutdown(editor)


async def test_cancelled_inline_request_leaves_no_engine_work(server, tmp_path):
    editor, _ = await start_bridge(server.address, tmp_path, options={"maxTokens": 400, "multiline": True})
    try:
        uri = editor.open("long.py", "VALUES = [\n    1,\n    2,\n    3,\n")
        params = editor.inline_params(uri, editor.position(uri, len(editor.texts[uri])))
        pending = asyncio.ensure_future(editor.client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id="long-1"))
        for _ in range(200):  # until the engine is generating for it
            if server.engine.num_unfinished() == 1:
                break
            await asyncio.sleep(0.02)
        assert server.engine.num_unfinished() == 1
        editor.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="long-1"))
        with pytest.raises(JsonRpcException):
            await pending
        for _ in range(200):
            if server.engine.num_unfinished() == 0:
                break
            await asyncio.sleep(0.05)
        assert server.engine.num_unfinished() == 0
    finally:
        await _shutdown(editor)
