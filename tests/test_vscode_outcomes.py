"""The VS Code extension's suggestion outcomes, run under plain node as
tests/test_vscode_settings.py runs the rest of the extension: the tracker in
outcomes.js (what VS Code's stable API lets an extension infer: shown,
accepted whole or by word or line, rejected by edit, replacement or cursor
move) with a fake clock and timers, and extension.js wiring it to the
language client (middleware, the accept command, the capability)."""

from __future__ import annotations

import json

from tests.test_vscode_settings import EXTENSION_HARNESS, compiled, run_node  # noqa: F401 - compiled is a fixture

TEXT = "compute(a, b)"

TRACKER = """
const o = require('./outcomes.js');
let now = 1000;
const timers = [];
const fake = { set: (f, ms) => (timers.push({ f, at: now + ms }), timers.length - 1), clear: (h) => { timers[h] = null; } };
const advance = (ms) => { now += ms; timers.forEach((t, i) => { if (t && t.at <= now) { timers[i] = null; t.f(); } }); };
const sent = [];
const t = new o.SuggestionTracker((p) => sent.push(p), () => now, fake);
const pos = (line, character) => ({ line, character });
const item = (id, text, start) => ({ insertText: text, range: { start, end: start }, command: { command: o.ACCEPT_COMMAND, arguments: [{ suggestionId: id }] } });
const insert = (at, text) => [{ range: { start: at, end: at }, text }];
const uri = 'file:///repo/calc.py';
const TEXT = %s;
const result = {};
""" % json.dumps(TEXT)


def run_tracker(compiled, body: str) -> dict:
    return run_node(TRACKER + body + "\nconsole.log(JSON.stringify(result));", compiled)


def test_shown_then_accepted_whole_by_the_command(compiled):
    result = run_tracker(compiled, """
t.answered(uri, pos(1, 11), o.suggestionOf(item('s1', TEXT, pos(1, 11)), pos(1, 11)));
t.answered(uri, pos(1, 11), o.suggestionOf(item('s1', TEXT, pos(1, 11)), pos(1, 11)));  // asked again: still the same
advance(700);
t.accepted('s1');
t.accepted('s1');  // once only
result.sent = sent;
""")
    assert result["sent"] == [
        {"suggestionId": "s1", "kind": "shown"},
        {"suggestionId": "s1", "kind": "accepted", "shownMs": 700, "acceptedChars": len(TEXT), "acceptance": "whole"},
    ]


def test_a_word_taken_then_the_cursor_leaves_is_a_partial_acceptance(compiled):
    result = run_tracker(compiled, """
t.answered(uri, pos(1, 11), o.suggestionOf(item('s1', TEXT, pos(1, 11)), pos(1, 11)));
advance(300);
t.changed(uri, insert(pos(1, 11), 'compute'));   // Ctrl+Right: a word
t.cursorMoved(uri, pos(1, 18));                  // the cursor follows the insertion: still on screen
t.answered(uri, pos(1, 18), o.suggestionOf(item('s1', '(a, b)', pos(1, 18)), pos(1, 18)));
advance(200);
t.cursorMoved(uri, pos(4, 0));                   // then it leaves
result.sent = sent;
""")
    assert result["sent"][1] == {"suggestionId": "s1", "kind": "accepted", "shownMs": 500, "acceptedChars": 7, "acceptance": "word"}
    assert len(result["sent"]) == 2


def test_typing_through_is_not_accepting_and_the_last_piece_accepts_the_rest(compiled):
    result = run_tracker(compiled, """
t.answered(uri, pos(0, 4), o.suggestionOf(item('s1', 'total😀\\nreturn x', pos(0, 4)), pos(0, 4)));
t.changed(uri, insert(pos(0, 4), 't'));          // one typed character that matches
t.changed(uri, insert(pos(0, 5), 'o'));
t.changed(uri, insert(pos(0, 6), 'tal😀\\n'));    // a line taken
t.changed(uri, insert(pos(1, 0), 'return x'));   // and the rest at once (Tab)
t.accepted('s1');                                 // the command then finds it ended
result.sent = sent;
""")
    assert result["sent"][1:] == [{"suggestionId": "s1", "kind": "accepted", "shownMs": 0,
                                   "acceptedChars": len("tal😀\n") + len("return x"), "acceptance": "line"}]


def test_typed_over_is_reported_after_the_grace_with_the_time_of_the_edit(compiled):
    result = run_tracker(compiled, """
t.answered(uri, pos(0, 4), o.suggestionOf(item('s1', TEXT, pos(0, 4)), pos(0, 4)));
advance(400);
t.changed(uri, insert(pos(0, 4), 'x'));          // not what was shown
result.before = sent.length;
advance(o.EDIT_GRACE_MS);
result.sent = sent;
""")
    assert result["before"] == 1
    assert result["sent"][1] == {"suggestionId": "s1", "kind": "rejected", "shownMs": 400, "rejection": "typedOver"}


def test_an_accept_that_replaces_text_after_the_cursor_is_still_an_acceptance(compiled):
    result = run_tracker(compiled, """
t.answered(uri, pos(0, 4), o.suggestionOf(item('s1', 'x, y);', pos(0, 4)), pos(0, 4)));
advance(100);
t.changed(uri, [{ range: { start: pos(0, 4), end: pos(0, 5) }, text: 'x, y);' }]);  // replaces the ")" after the cursor
advance(10);
t.accepted('s1');                                  // the command, within the grace
advance(o.EDIT_GRACE_MS * 2);
result.sent = sent;
""")
    assert result["sent"][1:] == [{"suggestionId": "s1", "kind": "accepted", "shownMs": 110, "acceptedChars": 6, "acceptance": "whole"}]


def test_replaced_and_dismissed_and_items_of_others(compiled):
    result = run_tracker(compiled, """
t.answered(uri, pos(0, 4), o.suggestionOf(item('s1', TEXT, pos(0, 4)), pos(0, 4)));
advance(50);
t.answered(uri, pos(0, 4), o.suggestionOf(item('s2', 'other', pos(0, 4)), pos(0, 4)));   // a newer suggestion
advance(50);
t.answered(uri, pos(3, 0), undefined);             // asked elsewhere, nothing: s2 is gone
t.answered(uri, pos(0, 4), o.suggestionOf({ insertText: 'plain' }, pos(0, 4)));   // not the server's: no id
t.answered(uri, pos(0, 4), o.suggestionOf(item('s1', TEXT, pos(0, 4)), pos(0, 4)));  // shown again after it ended
result.sent = sent;
""")
    assert result["sent"] == [
        {"suggestionId": "s1", "kind": "shown"},
        {"suggestionId": "s1", "kind": "rejected", "shownMs": 50, "rejection": "replaced"},
        {"suggestionId": "s2", "kind": "shown"},
        {"suggestionId": "s2", "kind": "rejected", "shownMs": 50, "rejection": "dismissed"},
    ]
    assert TEXT not in json.dumps(result) and "other" not in json.dumps(result)  # never any text


EXTENSION = EXTENSION_HARNESS.split("(async () => {")[0] + """
(async () => {
  const o = require('./outcomes.js');
  const ext = require('./extension.js');
  vscode.workspace.isTrusted = true;
  await ext.activate({ subscriptions: [], extensionUri: { fsPath: '/opt/extension' } });
  const [client] = clients;
  const capabilities = {};
  client.features.forEach((f) => f.fillClientCapabilities(capabilities));
  const document = { uri: { toString: () => 'file:///repo/calc.py' } };
  const position = { line: 1, character: 11 };
  const item = { insertText: 'compute(a, b)', range: { start: position, end: position },
                 command: { command: o.ACCEPT_COMMAND, title: '', arguments: [{ suggestionId: 'abc123' }] } };
  const middleware = client.clientOptions.middleware;
  const answer = await middleware.provideInlineCompletionItems(document, position, {}, { isCancellationRequested: false },
                                                               async () => ({ items: [item] }));
  const cancelled = await middleware.provideInlineCompletionItems(document, position, {}, { isCancellationRequested: true },
                                                                  async () => ({ items: [{ ...item, command: { ...item.command, arguments: [{ suggestionId: 'late' }] } }] }));
  commands[o.ACCEPT_COMMAND]({ suggestionId: 'abc123' });
  console.log(JSON.stringify({ capabilities, answered: answer.items.length, cancelled: cancelled.items.length,
                               outcomes: client.sent.filter((s) => s.method === o.OUTCOME_NOTIFICATION).map((s) => s.params) }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_the_extension_declares_the_capability_and_reports_through_the_language_client(compiled):
    result = run_node(EXTENSION, compiled)
    assert result["capabilities"] == {"experimental": {"quickdraftCompletionOutcomes": True}}
    assert result["answered"] == 1 and result["cancelled"] == 1  # items pass through unchanged
    # The cancelled answer is never shown; the shown one is accepted by its command.
    assert [(p["suggestionId"], p["kind"]) for p in result["outcomes"]] == [("abc123", "shown"), ("abc123", "accepted")]
    assert result["outcomes"][1]["acceptedChars"] == len("compute(a, b)") and result["outcomes"][1]["acceptance"] == "whole"
