// What became of each suggestion (shown, accepted whole or in part, rejected),
// reported to the language server as `quickdraft/completionOutcome`
// notifications (docs/lsp.md). Counts and durations only, never text.
//
// VS Code's stable inline completion API (1.91) tells an extension only two
// things: what its provider returned, and (through the item's `command`) that
// an item was accepted whole. The rest is inferred here, without the `vscode`
// module so that plain node can test it:
// - shown: the provider's answer was not cancelled (VS Code then draws it);
// - accepted by word or line: an edit at the suggestion inserts a prefix of
//   it at least two characters long (Ctrl+Right and "accept line" do that;
//   one typed character is typing through, which only shortens the rest);
// - rejected, typed over: another edit in the document, unless the accept
//   command follows within EDIT_GRACE_MS (VS Code applies an accepted item,
//   which may replace text after the cursor, then runs its command);
// - rejected, replaced: the provider answered another suggestion;
// - rejected, dismissed: the cursor left the suggestion, or the provider
//   answered nothing (Esc itself is not visible to extensions).
// A suggestion partly accepted and then left ends as accepted, by word or line.

export const OUTCOME_NOTIFICATION = 'quickdraft/completionOutcome';
// The command the language server puts on its items; VS Code runs it on accept.
export const ACCEPT_COMMAND = 'quickdraft.didAcceptSuggestion';
// Set in ClientCapabilities.experimental: the server adds the command only then.
export const CAPABILITY = 'quickdraftCompletionOutcomes';

export const EDIT_GRACE_MS = 250;

export type Acceptance = 'whole' | 'word' | 'line';
export type Rejection = 'dismissed' | 'typedOver' | 'replaced';

export interface OutcomeParams {
  suggestionId: string;
  kind: 'shown' | 'accepted' | 'rejected';
  shownMs?: number;
  acceptedChars?: number;
  acceptance?: Acceptance;
  rejection?: Rejection;
}

// Positions as VS Code counts them (UTF-16 code units).
export interface Pos {
  line: number;
  character: number;
}

// The parts of a vscode.InlineCompletionItem (or an LSP one) read here.
export interface ItemLike {
  insertText: string | { value: string };
  range?: { start: Pos };
  command?: { command: string; arguments?: unknown[] };
}

// The parts of a vscode.TextDocumentContentChangeEvent read here.
export interface ChangeLike {
  range: { start: Pos; end: Pos };
  text: string;
}

export interface Shown {
  id: string;
  text: string;
  start: Pos;
}

/** The suggestion an item carries: its id (from the server's accept command), text and start; undefined for other items. */
export function suggestionOf(item: ItemLike | undefined, position: Pos): Shown | undefined {
  const argument = item?.command?.command === ACCEPT_COMMAND ? item.command.arguments?.[0] : undefined;
  const id = (argument as { suggestionId?: unknown } | undefined)?.suggestionId;
  if (!item || typeof id !== 'string') {
    return undefined;
  }
  const text = typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
  const start = item.range?.start ?? position;
  return { id, text, start: { line: start.line, character: start.character } };
}

/** Characters as the server counts them: Unicode code points. */
export function chars(text: string): number {
  return [...text].length;
}

const samePos = (a: Pos, b: Pos): boolean => a.line === b.line && a.character === b.character;

function after(start: Pos, inserted: string): Pos {
  const lines = inserted.split('\n');
  return lines.length === 1
    ? { line: start.line, character: start.character + inserted.length }
    : { line: start.line + lines.length - 1, character: lines[lines.length - 1].length };
}

interface OnScreen {
  id: string;
  uri: string;
  rest: string; // what is still shown
  start: Pos; // where it starts: the cursor
  since: number;
  acceptedChars: number; // taken by word or line so far
  acceptance?: Acceptance;
}

export interface Timers {
  set(f: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const realTimers: Timers = {
  set: (f, ms) => setTimeout(f, ms),
  clear: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

export class SuggestionTracker {
  private current: OnScreen | undefined;
  // Edited over, reported as typed over once EDIT_GRACE_MS pass without its accept command.
  private edited: { screen: OnScreen; at: number; timer: unknown } | undefined;
  private readonly ended: string[] = [];

  constructor(
    private readonly send: (params: OutcomeParams) => void,
    private readonly now: () => number = Date.now,
    private readonly timers: Timers = realTimers,
  ) {}

  /** The provider answered at `position` in `uri` (not cancelled), the suggestion of its first item or none. */
  answered(uri: string, position: Pos, shown: Shown | undefined): void {
    const current = this.current;
    if (shown && current && shown.id === current.id) {
      current.rest = shown.text; // typed through: the same suggestion, shorter
      current.start = shown.start;
      return;
    }
    if (current && (shown || current.uri === uri)) {
      this.end(shown ? 'replaced' : 'dismissed');
    }
    if (!shown || this.ended.includes(shown.id) || this.edited?.screen.id === shown.id) {
      return; // shown again after it ended (an undo): already reported
    }
    this.settleEdited();
    this.current = { id: shown.id, uri, rest: shown.text, start: shown.start, since: this.now(), acceptedChars: 0 };
    this.send({ suggestionId: shown.id, kind: 'shown' });
  }

  /** The accept command ran: the rest of the suggestion was inserted. */
  accepted(id: unknown): void {
    if (this.edited && this.edited.screen.id === id) {
      // Its insertion replaced text after the cursor, so it looked like an edit.
      this.timers.clear(this.edited.timer);
      this.current = this.edited.screen;
      this.edited = undefined;
    }
    const current = this.current;
    if (!current || current.id !== id) {
      return; // already ended (its insertion was seen whole), or not ours
    }
    current.acceptedChars += chars(current.rest);
    current.rest = '';
    this.finish({ acceptance: current.acceptance ?? 'whole' });
  }

  /** The document `uri` changed. */
  changed(uri: string, changes: readonly ChangeLike[]): void {
    const current = this.current;
    if (!current || current.uri !== uri || changes.length === 0) {
      return;
    }
    const [change] = changes;
    const inserted = change.text;
    const atCursor = changes.length === 1 && samePos(change.range.start, current.start) && samePos(change.range.end, current.start);
    if (!atCursor || inserted === '' || !current.rest.startsWith(inserted)) {
      this.settleEdited();
      this.current = undefined;
      this.edited = { screen: current, at: this.now(), timer: this.timers.set(() => this.settleEdited(), EDIT_GRACE_MS) };
      return;
    }
    if (inserted === current.rest) {
      // All of it at once: Tab (the command follows and finds it ended) or the last piece of a step-by-step accept.
      current.acceptedChars += chars(inserted);
      current.rest = '';
      this.finish({ acceptance: current.acceptance ?? 'whole' });
      return;
    }
    if (chars(inserted) >= 2) {
      // A word or a line taken: more than a keystroke, and exactly what was shown.
      current.acceptedChars += chars(inserted);
      const next = current.rest.charAt(inserted.length);
      current.acceptance = inserted.endsWith('\n') || next === '\n' || next === '' ? 'line' : 'word';
    }
    current.rest = current.rest.slice(inserted.length);
    current.start = after(current.start, inserted);
  }

  /** The cursor moved in `uri` (selection changes follow every edit too). */
  cursorMoved(uri: string, position: Pos): void {
    const current = this.current;
    if (current && current.uri === uri && !samePos(position, current.start)) {
      this.end('dismissed');
    }
  }

  /** Report the suggestion edited over (if any) as typed over. */
  private settleEdited(): void {
    const edited = this.edited;
    if (!edited) {
      return;
    }
    this.edited = undefined;
    const current = this.current;
    this.current = edited.screen;
    this.end('typedOver', edited.at);
    this.current = current;
  }

  /** The suggestion on screen left it: accepted by word or line if some was taken, else rejected. */
  private end(rejection: Rejection, at?: number): void {
    const current = this.current;
    if (!current) {
      return;
    }
    if (current.acceptedChars > 0) {
      this.finish({ acceptance: current.acceptance ?? 'word' }, at);
    } else {
      this.finish({ rejection }, at);
    }
  }

  private finish(how: { acceptance?: Acceptance; rejection?: Rejection }, at: number = this.now()): void {
    const current = this.current!;
    this.current = undefined;
    this.ended.push(current.id);
    if (this.ended.length > 256) {
      this.ended.shift();
    }
    const shownMs = Math.max(0, at - current.since);
    if (how.rejection) {
      this.send({ suggestionId: current.id, kind: 'rejected', shownMs, rejection: how.rejection });
    } else {
      this.send({ suggestionId: current.id, kind: 'accepted', shownMs, acceptedChars: current.acceptedChars, acceptance: how.acceptance });
    }
  }
}
