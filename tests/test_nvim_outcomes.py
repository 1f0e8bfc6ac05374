"""The Neovim plugin's suggestion outcomes, headless.

- ``lua/quickdraft/outcomes.lua`` (the tracker, plain Lua) under any nvim;
- the whole plugin (``init.lua``: ghost text, accept keys, autocommands) with
  a stand-in LSP client, under nvim 0.7 or newer (what the plugin needs; 0.7
  is Debian's). tests/integration/test_nvim_real.py runs it against the real
  bridge and server.

nvim is ``$QUICKDRAFT_NVIM``, else the one on PATH; a test skips, saying
why, when there is none or it is too old.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parent.parent / "editors" / "nvim"


def nvim() -> tuple[str, tuple[int, int]] | None:
    path = os.environ.get("QUICKDRAFT_NVIM") or shutil.which("nvim")
    if not path:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"NVIM v(\d+)\.(\d+)", out)
    return (path, (int(m.group(1)), int(m.group(2)))) if m else None


def run_lua(tmp_path: Path, script: str, minimum: tuple[int, int] = (0, 5)) -> dict:
    found = nvim()
    if found is None:
        pytest.skip("nvim is not installed (set QUICKDRAFT_NVIM to one): cannot run the plugin's Lua")
    path, version = found
    if version < minimum:
        pytest.skip(f"nvim {version[0]}.{version[1]} is older than {minimum[0]}.{minimum[1]}, which this test needs "
                    "(set QUICKDRAFT_NVIM to a newer one)")
    out = tmp_path / "result.json"
    lua = tmp_path / "test.lua"
    lua.write_text("local ok, err = pcall(function()\n" + script + "\nend)\n"
                   "if not ok then io.stderr:write(tostring(err)) vim.cmd('cquit 1') end\n")
    done = subprocess.run([path, "--headless", "-u", "NONE", "-i", "NONE", "--cmd", f"set rtp^={PLUGIN}", "-c", f"luafile {lua}", "-c", "qa!"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "RESULT": str(out)})
    assert done.returncode == 0 and out.exists(), done.stderr
    return json.loads(out.read_text())


WRITE = "local f = io.open(os.getenv('RESULT'), 'w') f:write(vim.fn.json_encode(result)) f:close()"


def test_the_tracker_reports_shown_accepted_typed_over_and_dismissed(tmp_path):
    result = run_lua(tmp_path, """
local o = require("quickdraft.outcomes")
local now = 0
local sent = {}
local t = o.new(function(ctx, params) params.ctx = ctx table.insert(sent, params) end, function() return now end)
local item = { insertText = "x", command = { command = o.ACCEPT_COMMAND, arguments = { { suggestionId = "s1" } } } }
t:shown(o.suggestion_id(item), "client-1")
now = 300
t:changed()                    -- a typed character that matched...
t:shown("s1", "client-1")      -- ...the same suggestion again: typed through
now = 500
t:accepted("total😀", false)
t:accepted("again", false)     -- nothing on screen any more
t:shown("s2", "client-1")
now = 900
local seq = t:changed()        -- typed over
t:settle(seq + 1)              -- another's seq: not this one
t:settle(seq)
t:shown("s3", "client-1")
now = 950
t:shown("s4", "client-1")      -- replaced
t:accepted("first line", true) -- accept_line on a suggestion of several lines
t:shown("s5", "client-1")
t:dismissed()
t:shown("s5", "client-1")      -- an ended suggestion again: not reported twice
t:shown(o.suggestion_id({ insertText = "y" }), "client-1")  -- another server's item
result = { sent = sent, chars = o.chars("a😀é\\n") }
""" + WRITE)
    assert result["chars"] == 4
    assert result["sent"] == [
        {"suggestionId": "s1", "kind": "shown", "ctx": "client-1"},
        {"suggestionId": "s1", "kind": "accepted", "shownMs": 500, "acceptedChars": 6, "acceptance": "whole", "ctx": "client-1"},
        {"suggestionId": "s2", "kind": "shown", "ctx": "client-1"},
        {"suggestionId": "s2", "kind": "rejected", "shownMs": 400, "rejection": "typedOver", "ctx": "client-1"},
        {"suggestionId": "s3", "kind": "shown", "ctx": "client-1"},
        {"suggestionId": "s3", "kind": "rejected", "shownMs": 50, "rejection": "replaced", "ctx": "client-1"},
        {"suggestionId": "s4", "kind": "shown", "ctx": "client-1"},
        {"suggestionId": "s4", "kind": "accepted", "shownMs": 0, "acceptedChars": 10, "acceptance": "line", "ctx": "client-1"},
        {"suggestionId": "s5", "kind": "shown", "ctx": "client-1"},
        {"suggestionId": "s5", "kind": "rejected", "shownMs": 0, "rejection": "dismissed", "ctx": "client-1"},
    ]


PLUGIN_SCRIPT = """
local sent, started = {}, {}
local handler
local fake = { name = "quickdraft", offset_encoding = "utf-8" }
local function args(first, ...) if first == fake then return ... end return first, ... end
fake.request = function(...) local _, _, h = args(...) handler = h return true, 1 end
fake.notify = function(...) local method, params = args(...) table.insert(sent, { method = method, params = params }) return true end
fake.cancel_request = function() end
vim.lsp.start = function(config) table.insert(started, config) return 1 end
vim.lsp.get_clients = function() return { fake } end
vim.fn.mode = function() return "i" end  -- the plugin only draws in insert mode
vim.o.virtualedit = "onemore"             -- a cursor after the line's end, as in insert mode

local qd = require("quickdraft")
qd.setup({})
local buf = vim.api.nvim_get_current_buf()
vim.api.nvim_buf_set_name(buf, vim.fn.tempname() .. ".py")
vim.bo[buf].filetype = "python"         -- starts the (stand-in) client
vim.api.nvim_buf_set_lines(buf, 0, -1, false, { "def total(a, b):", "    return " })

local function suggest(id, text)
  local cursor = vim.api.nvim_win_get_cursor(0)
  local at = { line = cursor[1] - 1, character = cursor[2] }
  qd.request()
  handler(nil, { items = { { insertText = text, range = { start = at, ["end"] = at },
    command = { title = "", command = "quickdraft.didAcceptSuggestion", arguments = { { suggestionId = id } } } } } })
end

vim.api.nvim_win_set_cursor(0, { 2, 11 })
suggest("s1", "compute(a, b)")
qd.accept()
suggest("s2", "x\\ny")
qd.accept_line()
suggest("s3", "zz")
vim.api.nvim_exec_autocmds("InsertLeave", { group = "quickdraft" })
suggest("s4", "zz")
local row, col = unpack(vim.api.nvim_win_get_cursor(0))
vim.api.nvim_buf_set_text(buf, row - 1, col, row - 1, col, { "q" })
vim.api.nvim_win_set_cursor(0, { row, col + 1 })
vim.api.nvim_exec_autocmds("TextChangedI", { group = "quickdraft", buffer = buf })
suggest("s5", "rest")                      -- a new suggestion: s4 was typed over
result = {
  sent = sent,
  experimental = started[1] and started[1].capabilities.experimental,
  lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false),
}
"""


def test_the_plugin_reports_what_the_user_did_with_each_suggestion(tmp_path):
    result = run_lua(tmp_path, PLUGIN_SCRIPT + WRITE, minimum=(0, 7))
    assert result["experimental"] == {"quickdraftCompletionOutcomes": True}
    assert result["lines"][1] == "    return compute(a, b)xq"
    assert {s["method"] for s in result["sent"]} == {"quickdraft/completionOutcome"}
    outcomes = [s["params"] for s in result["sent"]]
    for p in outcomes:
        assert p.pop("shownMs", 0) >= 0
    assert outcomes == [
        {"suggestionId": "s1", "kind": "shown"},
        {"suggestionId": "s1", "kind": "accepted", "acceptedChars": 13, "acceptance": "whole"},
        {"suggestionId": "s2", "kind": "shown"},
        {"suggestionId": "s2", "kind": "accepted", "acceptedChars": 1, "acceptance": "line"},
        {"suggestionId": "s3", "kind": "shown"},
        {"suggestionId": "s3", "kind": "rejected", "rejection": "dismissed"},
        {"suggestionId": "s4", "kind": "shown"},
        {"suggestionId": "s4", "kind": "rejected", "rejection": "typedOver"},
        {"suggestionId": "s5", "kind": "shown"},
    ]
    assert "compute" not in json.dumps(outcomes)  # never any text
