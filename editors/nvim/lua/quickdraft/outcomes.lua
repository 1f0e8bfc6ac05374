-- What became of each suggestion (shown, accepted whole or by line, rejected),
-- as `quickdraft/completionOutcome` notifications to the language server
-- (docs/lsp.md). Counts and durations only, never text. Plain Lua, no `vim`:
-- the plugin (init.lua) tells it what happened; tests run it on its own.

local M = {}

M.NOTIFICATION = "quickdraft/completionOutcome"
-- The command the language server puts on its items: its argument names the suggestion.
M.ACCEPT_COMMAND = "quickdraft.didAcceptSuggestion"
-- Set in ClientCapabilities.experimental: the server adds the command only then.
M.CAPABILITY = "quickdraftCompletionOutcomes"

-- The suggestion id an item carries, or nil (an item of another server).
function M.suggestion_id(item)
  local command = type(item) == "table" and item.command or nil
  if type(command) ~= "table" or command.command ~= M.ACCEPT_COMMAND or type(command.arguments) ~= "table" then
    return nil
  end
  local argument = command.arguments[1]
  local id = type(argument) == "table" and argument.suggestionId or nil
  return type(id) == "string" and id or nil
end

-- Characters as the server counts them: Unicode code points (UTF-8 lead bytes).
function M.chars(text)
  local _, n = string.gsub(text or "", "[^\128-\191]", "")
  return n
end

local Tracker = {}
Tracker.__index = Tracker

-- send(ctx, params): ctx is what shown() was given (the LSP client).
-- clock(): milliseconds.
function M.new(send, clock)
  return setmetatable({ send = send, clock = clock, current = nil, typed = nil, seq = 0, ended = {}, ended_order = {} }, Tracker)
end

function Tracker:_finish(screen, params, at)
  params.suggestionId = screen.id
  if params.kind ~= "shown" then
    params.shownMs = math.max(0, (at or self.clock()) - screen.since)
  end
  self.ended[screen.id] = true
  table.insert(self.ended_order, screen.id)
  if #self.ended_order > 256 then
    self.ended[table.remove(self.ended_order, 1)] = nil
  end
  self.send(screen.ctx, params)
end

-- Report the suggestion typed over (if any, and if `seq` is its) as rejected.
function Tracker:settle(seq)
  local typed = self.typed
  if typed and (seq == nil or seq == typed.seq) then
    self.typed = nil
    self:_finish(typed.screen, { kind = "rejected", rejection = "typedOver" }, typed.at)
  end
end

-- The suggestion `id` (nil: an item without one) is drawn; ctx is passed to send.
function Tracker:shown(id, ctx)
  local typed = self.typed
  if id and typed and typed.screen.id == id then
    -- Typed through: the same suggestion again, shorter; still the same time on screen.
    self.typed = nil
    self.current = typed.screen
    return
  end
  self:settle()
  local current = self.current
  if current and current.id == id then
    return
  end
  if current then
    self.current = nil
    self:_finish(current, { kind = "rejected", rejection = "replaced" })
  end
  if id == nil or self.ended[id] then
    return -- shown again after it ended (an undo): already reported
  end
  self.current = { id = id, ctx = ctx, since = self.clock() }
  self.send(ctx, { suggestionId = id, kind = "shown" })
end

-- The buffer changed under the suggestion: typed over, unless the same
-- suggestion is shown again (typed through). Returns the seq to settle it by.
function Tracker:changed()
  local current = self.current
  if not current then
    return nil
  end
  self:settle()
  self.current = nil
  self.seq = self.seq + 1
  self.typed = { screen = current, at = self.clock(), seq = self.seq }
  return self.seq
end

-- The user took `inserted` (the whole suggestion, or its first line when
-- `partial` is true: accept_line on a suggestion of several lines).
function Tracker:accepted(inserted, partial)
  local current = self.current
  if not current then
    return
  end
  self.current = nil
  self:_finish(current, { kind = "accepted", acceptedChars = M.chars(inserted), acceptance = partial and "line" or "whole" })
end

-- Esc / the dismiss key, the cursor moved away, insert mode or the buffer left.
function Tracker:dismissed()
  self:settle()
  local current = self.current
  if current then
    self.current = nil
    self:_finish(current, { kind = "rejected", rejection = "dismissed" })
  end
end

return M
