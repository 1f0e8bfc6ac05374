-- quickdraft for Neovim (0.7+; best on 0.10+): inline completions from
-- `quickdraft lsp`, shown as virtual text and accepted with a key.
--
-- Neovim's built-in client (before 0.12) has no inline completion UI, so this
-- module asks for `textDocument/inlineCompletion` itself: after a pause in
-- typing it sends one request for the cursor (cancelling the previous one),
-- draws the first item as virtual text, and inserts it on the accept key.
-- What became of each suggestion goes back to the server (outcomes.lua).

local outcomes = require("quickdraft.outcomes")

local M = {}

local ns = vim.api.nvim_create_namespace("quickdraft")
local uv = vim.uv or vim.loop
-- A suggestion typed over is reported as such unless the same one comes back
-- (typed through) within this long.
local TYPED_THROUGH_MS = 2000

M.config = {
  cmd = { "quickdraft", "lsp" },
  -- Passed to the server as initializationOptions (see docs/lsp.md for keys).
  settings = { server = "127.0.0.1:50051" },
  filetypes = nil, -- nil: every filetype with a file name
  debounce_ms = 75, -- wait this long after typing before asking
  keys = {
    accept = "<Tab>", -- falls through to a normal <Tab> when nothing is shown
    accept_line = "<C-l>",
    dismiss = "<C-]>",
  },
  hl_group = "Comment",
}

local state = {
  timer = nil,
  request = nil, -- { client = client, id = id } of the request in flight
  shown = nil, -- { bufnr, row, col, tick, item, client }
  server_state = "starting",
}

-- Neovim 0.11 made client methods take `self`.
local function call(client, method, ...)
  if vim.fn.has("nvim-0.11") == 1 then
    return client[method](client, ...)
  end
  return client[method](...)
end

local tracker = outcomes.new(function(client, params)
  if client then
    pcall(call, client, "notify", outcomes.NOTIFICATION, params)
  end
end, function()
  return uv.hrtime() / 1e6
end)

-- Inline virtual text (drawn at the cursor) came in 0.10; before, the first
-- line is drawn after the line's end, where the cursor usually is.
local VIRT_TEXT_POS = vim.fn.has("nvim-0.10") == 1 and "inline" or "eol"

local function client_for(bufnr)
  if vim.lsp.get_clients then
    return vim.lsp.get_clients({ bufnr = bufnr, name = "quickdraft" })[1]
  end
  -- 0.7-0.9: get_active_clients takes no filter in 0.7.
  for _, client in pairs(vim.lsp.buf_get_clients(bufnr)) do
    if client.name == "quickdraft" then
      return client
    end
  end
end

function M.clear()
  if state.shown then
    pcall(vim.api.nvim_buf_clear_namespace, state.shown.bufnr, ns, 0, -1)
  end
  state.shown = nil
end

-- Clear, and tell the tracker why: "typed" (the buffer changed) or "dismissed".
local function hide(reason)
  M.clear()
  if reason == "typed" then
    local seq = tracker:changed()
    if seq then
      vim.defer_fn(function()
        tracker:settle(seq)
      end, TYPED_THROUGH_MS)
    end
  else
    tracker:dismissed()
  end
end

local function cancel_request()
  if state.request then
    pcall(call, state.request.client, "cancel_request", state.request.id)
    state.request = nil
  end
end

local function item_text(item)
  local text = item.insertText
  if type(text) == "table" then -- StringValue (snippet): show its raw value
    text = text.value
  end
  return text or ""
end

local function show(bufnr, row, col, item, client)
  M.clear()
  local text = item_text(item)
  if text == "" then
    return
  end
  local lines = vim.split(text, "\n", { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], M.config.hl_group } }
  end
  vim.api.nvim_buf_set_extmark(bufnr, ns, row, col, {
    virt_text = { { lines[1], M.config.hl_group } },
    virt_text_pos = VIRT_TEXT_POS,
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = "combine",
  })
  state.shown = {
    bufnr = bufnr,
    row = row,
    col = col,
    tick = vim.api.nvim_buf_get_changedtick(bufnr),
    item = item,
    client = client,
  }
  tracker:shown(outcomes.suggestion_id(item), client)
end

local function on_result(bufnr, row, col, tick, client)
  return function(err, result)
    state.request = nil
    if err or not result then
      return
    end
    -- Stale if the buffer changed or the cursor moved since the request.
    local cursor = vim.api.nvim_win_get_cursor(0)
    if vim.api.nvim_get_current_buf() ~= bufnr
      or vim.api.nvim_buf_get_changedtick(bufnr) ~= tick
      or cursor[1] - 1 ~= row
      or cursor[2] ~= col
      or vim.fn.mode() ~= "i"
    then
      return
    end
    local items = result.items or result
    if items[1] then
      show(bufnr, row, col, items[1], client)
    end
  end
end

function M.request()
  local bufnr = vim.api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    return
  end
  cancel_request()
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = 2 } -- Automatic
  local cursor = vim.api.nvim_win_get_cursor(0)
  local row, col = cursor[1] - 1, cursor[2]
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local ok, id = call(client, "request", "textDocument/inlineCompletion", params, on_result(bufnr, row, col, tick, client), bufnr)
  if ok then
    state.request = { client = client, id = id }
  end
end

local function schedule_request()
  hide("typed")
  cancel_request()
  if not state.timer then
    state.timer = uv.new_timer()
  end
  state.timer:stop()
  state.timer:start(M.config.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.fn.mode() == "i" then
      M.request()
    end
  end))
end

-- Byte column of an LSP character offset on a line.
local function byte_col(bufnr, row, character, encoding)
  if encoding == "utf-8" then
    return character
  end
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ""
  local ok, col = pcall(vim.str_byteindex, line, encoding, character, false) -- 0.11
  if ok then
    return col
  end
  return vim.str_byteindex(line, character, encoding == "utf-16") -- 0.10
end

-- Insert what is shown (or its first line); true if something was inserted.
local function insert(first_line_only)
  local shown = state.shown
  if not shown or vim.api.nvim_buf_get_changedtick(shown.bufnr) ~= shown.tick then
    M.clear()
    return false
  end
  local item, bufnr = shown.item, shown.bufnr
  local text = item_text(item)
  local whole = text
  if first_line_only then
    text = vim.split(text, "\n", { plain = true })[1]
  end
  tracker:accepted(text, text ~= whole)
  local encoding = shown.client.offset_encoding or "utf-16"
  local range = item.range
    or { start = { line = shown.row, character = 0 }, ["end"] = { line = shown.row, character = 0 } }
  local start_col = item.range and byte_col(bufnr, range.start.line, range.start.character, encoding) or shown.col
  local end_col = item.range and byte_col(bufnr, range["end"].line, range["end"].character, encoding) or shown.col
  if first_line_only and item.range then
    end_col = start_col -- keep the text after the cursor when only a line is taken
  end
  M.clear()
  local lines = vim.split(text, "\n", { plain = true })
  vim.api.nvim_buf_set_text(bufnr, range.start.line, start_col, range["end"].line, end_col, lines)
  local last_row = range.start.line + #lines - 1
  local last_col = (#lines == 1 and start_col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { last_row + 1, last_col })
  return true
end

function M.accept()
  return insert(false)
end

function M.accept_line()
  return insert(true)
end

-- For a statusline: "up", "down", "unknown" or "starting".
function M.status()
  return state.server_state
end

local function map_keys()
  local keys = M.config.keys
  local function mapping(action, fallback)
    return function()
      if state.shown then
        -- Text cannot change inside an <expr> mapping: insert right after it.
        vim.schedule(action)
        return ""
      end
      return fallback
    end
  end
  if keys.accept then
    vim.keymap.set("i", keys.accept, mapping(M.accept, vim.api.nvim_replace_termcodes(keys.accept, true, false, true)),
      { expr = true, silent = true, desc = "quickdraft: accept completion" })
  end
  if keys.accept_line then
    vim.keymap.set("i", keys.accept_line, mapping(M.accept_line, ""), { expr = true, silent = true, desc = "quickdraft: accept line" })
  end
  if keys.dismiss then
    vim.keymap.set("i", keys.dismiss, function()
      hide("dismissed")
      cancel_request()
    end, { silent = true, desc = "quickdraft: dismiss completion" })
  end
end

local function capabilities()
  local caps = vim.lsp.protocol.make_client_capabilities()
  caps.textDocument.inlineCompletion = { dynamicRegistration = false }
  -- Offer UTF-8 (Neovim's native columns); the server then uses it. Clients
  -- before 0.10 ignore the server's choice and count UTF-16, so they offer nothing
  -- and get UTF-16, the mandatory default.
  if vim.fn.has("nvim-0.10") == 1 then
    caps.general = caps.general or {}
    caps.general.positionEncodings = { "utf-8", "utf-16" }
  end
  -- This client reports suggestion outcomes: the server then puts its accept command on items.
  caps.experimental = vim.tbl_extend("force", caps.experimental or {}, { [outcomes.CAPABILITY] = true })
  return caps
end

-- 0.7 has no vim.lsp.start: one client per root folder, attached to each buffer.
local started = {}

local function start_client(config, bufnr)
  if vim.lsp.start then
    return vim.lsp.start(config, { bufnr = bufnr })
  end
  local id = started[config.root_dir]
  local client = id and vim.lsp.get_client_by_id(id)
  if not client or client.is_stopped() then
    id = vim.lsp.start_client(config)
    started[config.root_dir] = id
  end
  if id then
    vim.lsp.buf_attach_client(bufnr, id)
  end
  return id
end

local function start(bufnr)
  if vim.api.nvim_buf_get_name(bufnr) == "" or vim.bo[bufnr].buftype ~= "" then
    return
  end
  local ft = vim.bo[bufnr].filetype
  if M.config.filetypes and not vim.tbl_contains(M.config.filetypes, ft) then
    return
  end
  local root = vim.fs and vim.fs.root and vim.fs.root(bufnr, { ".git", "pyproject.toml", "package.json", "go.mod", "Cargo.toml" })
  start_client({
    name = "quickdraft",
    cmd = M.config.cmd,
    root_dir = root or vim.fn.getcwd(),
    init_options = M.config.settings,
    capabilities = capabilities(),
    handlers = {
      ["quickdraft/status"] = function(_, result)
        state.server_state = result and result.state or "unknown"
      end,
    },
  }, bufnr)
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend("force", M.config, opts or {})
  local group = vim.api.nvim_create_augroup("quickdraft", { clear = true })
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    callback = function(args)
      start(args.buf)
    end,
  })
  vim.api.nvim_create_autocmd({ "TextChangedI", "TextChangedP" }, { group = group, callback = schedule_request })
  vim.api.nvim_create_autocmd("CursorMovedI", {
    group = group,
    callback = function()
      local shown = state.shown
      local cursor = vim.api.nvim_win_get_cursor(0)
      if shown and (cursor[1] - 1 ~= shown.row or cursor[2] ~= shown.col) then
        -- Moved by an edit (the buffer changed; TextChangedI comes next) or by the user.
        hide(vim.api.nvim_buf_get_changedtick(shown.bufnr) ~= shown.tick and "typed" or "dismissed")
      end
    end,
  })
  vim.api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, {
    group = group,
    callback = function()
      hide("dismissed")
      cancel_request()
    end,
  })
  map_keys()
  -- Buffers already open when setup() runs.
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and vim.bo[bufnr].filetype ~= "" then
      start(bufnr)
    end
  end
end

return M
