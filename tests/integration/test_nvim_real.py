"""Neovim, headless, with the plugin, the real bridge and the session's server: outcomes reach the server.

nvim (``$QUICKDRAFT_NVIM`` or the one on PATH, 0.7 or newer) loads
editors/nvim with ``quickdraft lsp`` of this repository pointed at the
session's server on the embedded model (tests/integration/conftest.py), opens
a Python file on a blank line of a method body, asks for the inline
completion as the plugin does after a pause in typing, waits for the ghost
text (the plugin's extmark), accepts it with the plugin's accept and waits
for the bridge to send its outcome batch. The server must then count one
suggestion shown and accepted whole for (python, inline, the engine's
config), with as many accepted characters as the buffer gained, in
``GetOutcomeStats`` and in the Prometheus series.

Headless nvim is never in insert mode, so the script stands ``vim.fn.mode``
in for it (the plugin only draws in insert mode) and calls the plugin's
``request``/``accept`` where its autocommand and key would. Without nvim the
test skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_vscode_real import group_figures, scrape, series_value, wait_for
from tests.test_nvim_outcomes import PLUGIN, nvim

pytestmark = [pytest.mark.engine, pytest.mark.slow]

BEFORE = """import math


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __eq__(self, other):
        """
LINE = 9  # 0-based: the blank line of __eq__'s body, the cursor at its end

SCRIPT = r"""
local cfg = vim.fn.json_decode(os.getenv("QD_ARGS"))
local result = { events = {} }
local function finish()
  local f = io.open(cfg.result, "w") f:write(vim.fn.json_encode(result)) f:close()
end
local ok, err = pcall(function()
  vim.fn.mode = function() return "i" end  -- headless nvim is never in insert mode
  vim.o.virtualedit = "onemore"            -- a cursor after the line's end, as in insert mode
  local qd = require("quickdraft")
  qd.setup({ cmd = { cfg.quickdraft, "lsp" }, settings = { server = cfg.server, debounceMs = 0 } })
  vim.cmd("filetype on")                   -- -u NONE leaves it off: the plugin starts on FileType
  vim.cmd("edit " .. vim.fn.fnameescape(cfg.file))
  if not vim.wait(60000, function() return qd.status() == "up" end, 50) then
    error("the bridge never said the server is up: " .. qd.status())
  end
  local buf = vim.api.nvim_get_current_buf()
  local ns = vim.api.nvim_create_namespace("quickdraft")
  local line = vim.api.nvim_buf_get_lines(buf, cfg.line, cfg.line + 1, false)[1]
  vim.api.nvim_win_set_cursor(0, { cfg.line + 1, #line })
  local marks
  local shown = vim.wait(60000, function()
    marks = vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })
    if #marks == 0 then qd.request() vim.wait(300, function() return #vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, {}) > 0 end, 20) end
    return #vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, {}) > 0
  end, 100)
  if not shown then error("no ghost text was drawn") end
  marks = vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })
  result.ghost = marks[1][4].virt_text[1][1]
  result.before = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  if not qd.accept() then error("accept inserted nothing") end
  result.after = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  vim.wait(2500, function() return false end)  -- the bridge sends outcomes a second after the first
end)
result.ok = ok
result.error = ok and nil or tostring(err)
finish()
vim.cmd("qa!")
"""


def test_neovim_outcomes_reach_the_servers_figures(request, tmp_path):
    found = nvim()
    if found is None:
        pytest.skip("nvim is not installed (apt-get install neovim, or set QUICKDRAFT_NVIM)")
    path, version = found
    if version < (0, 7):
        pytest.skip(f"nvim {version[0]}.{version[1]} is older than 0.7, which the plugin needs (set QUICKDRAFT_NVIM to a newer one)")
    quickdraft = Path(sys.executable).with_name("quickdraft")
    assert quickdraft.exists(), f"{quickdraft} missing: install the package (scripts/install.sh)"
    server = request.getfixturevalue("server")
    from quickdraft.client import CompletionClient

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "point.py").write_text(BEFORE)
    config = server.engine.spec.label()
    with CompletionClient(server.address, timeout=30) as c:
        before = c.outcome_stats()
    metrics_before = scrape(server.cfg.telemetry.metrics_port)

    script = tmp_path / "drive.lua"
    script.write_text(SCRIPT)
    out = tmp_path / "result.json"
    args = {"quickdraft": str(quickdraft), "server": server.address, "file": str(workspace / "point.py"), "line": LINE,
            "result": str(out)}
    t0 = time.monotonic()
    done = subprocess.run([path, "--headless", "-u", "NONE", "-i", "NONE", "--cmd", f"set rtp^={PLUGIN}", "-c", f"luafile {script}"],
                          cwd=workspace, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
                          env={**os.environ, "QD_ARGS": json.dumps(args)})
    assert out.exists(), f"nvim wrote no result (rc {done.returncode}): {done.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert result["ok"], result.get("error")
    print(f"nvim {version[0]}.{version[1]}: ghost {result['ghost']!r} in {time.monotonic() - t0:.1f} s")

    ghost = result["ghost"]
    assert ghost.strip()
    assert result["after"][LINE] == result["before"][LINE] + ghost.split("\n")[0]
    gained = len("\n".join(result["after"])) - len("\n".join(result["before"]))

    old = group_figures(before, "python", "inline", config)

    def accepted():
        with CompletionClient(server.address, timeout=30) as c:
            group = group_figures(c.outcome_stats(), "python", "inline", config)
        return group if group is not None and group.accepted > (old.accepted if old else 0) else None

    group = wait_for(accepted, 20, f"no accepted suggestion from Neovim in GetOutcomeStats for (python, inline, {config})")
    delta = {f: getattr(group, f) - (getattr(old, f) if old else 0) for f in ("shown", "accepted", "partially_accepted", "accepted_chars")}
    assert delta == {"shown": 1, "accepted": 1, "partially_accepted": 0, "accepted_chars": gained}, (delta, gained)
    metrics_after = scrape(server.cfg.telemetry.metrics_port)
    labels = {"quickdraft_language": "python", "quickdraft_latency_class": "inline", "quickdraft_speculative_config": config}
    name = "quickdraft_suggestions_accepted_total"
    assert (series_value(metrics_after, name, **labels, quickdraft_acceptance="whole")
            - series_value(metrics_before, name, **labels, quickdraft_acceptance="whole")) == 1
    chars = "quickdraft_suggestions_accepted_chars_total"
    assert series_value(metrics_after, chars, **labels) - series_value(metrics_before, chars, **labels) == gained
