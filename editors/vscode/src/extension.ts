// quickdraft for VS Code: starts `quickdraft lsp` and lets vscode-languageclient
// turn its textDocument/inlineCompletion answers into ghost text. What to start
// and with which settings is decided in settings.ts; what became of each
// suggestion (shown, accepted, rejected) is inferred in outcomes.ts and sent
// to the language server.

import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
} from 'vscode-languageclient/node';
import { ACCEPT_COMMAND, CAPABILITY, OUTCOME_NOTIFICATION, SuggestionTracker, suggestionOf } from './outcomes';
import { MACHINE_SETTINGS, launch, workspaceSettings } from './settings';

const SECTION = 'quickdraft';
let client: LanguageClient | undefined;
let status: vscode.StatusBarItem | undefined;
// Outcomes go to whichever language server is running; none is queued while none is.
const tracker = new SuggestionTracker((params) => {
  if (client?.isRunning()) {
    void client.sendNotification(OUTCOME_NOTIFICATION, params);
  }
});

// Tells the language server that this client reports outcomes (it then puts the accept command on its items).
const reportsOutcomes = {
  fillClientCapabilities(capabilities: { experimental?: unknown }): void {
    const experimental = (capabilities.experimental ?? {}) as Record<string, unknown>;
    capabilities.experimental = { ...experimental, [CAPABILITY]: true };
  },
  initialize(): void {},
  getState(): { kind: 'static' } {
    return { kind: 'static' };
  },
  clear(): void {},
};

function showState(params: { state: string; server: string; error?: string }): void {
  if (!status) {
    return;
  }
  const up = params.state === 'up';
  status.text = up ? '$(sparkle) quickdraft' : params.error ? '$(error) quickdraft' : '$(warning) quickdraft';
  status.tooltip = up
    ? `quickdraft: connected to ${params.server}`
    : params.error ?? `quickdraft: server ${params.server} is ${params.state}`;
  status.command = 'quickdraft.showLog';
  status.show();
}

async function start(context: vscode.ExtensionContext, output: vscode.LogOutputChannel): Promise<void> {
  const plan = launch(vscode.workspace.getConfiguration(SECTION), vscode.workspace.isTrusted, context.extensionUri.fsPath);
  if (plan.kind === 'restricted') {
    output.info(plan.reason);
    if (status) {
      status.text = '$(shield) quickdraft';
      status.tooltip = plan.reason;
      status.command = 'workbench.trust.manage';
      status.show();
    }
    return;
  }
  // No `transport`: TransportKind.stdio would append `--stdio`, which `quickdraft lsp` refuses; stdio is its default.
  const serverOptions: ServerOptions = { command: plan.command, args: plan.args, options: { cwd: plan.cwd } };
  const clientOptions: LanguageClientOptions = {
    // Every language: files of unknown languages get a plain prefix/suffix prompt.
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: plan.initializationOptions,
    outputChannel: output,
    middleware: {
      // What the provider returns and is not cancelled, VS Code shows.
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        const result = await next(document, position, context, token);
        if (!token.isCancellationRequested) {
          const items = Array.isArray(result) ? result : (result?.items ?? []);
          tracker.answered(document.uri.toString(), position, suggestionOf(items[0], position));
        }
        return result;
      },
    },
  };
  client = new LanguageClient('quickdraft', 'quickdraft', serverOptions, clientOptions);
  client.registerFeature(reportsOutcomes);
  client.onNotification('quickdraft/status', showState);
  await client.start();
}

async function restart(context: vscode.ExtensionContext, output: vscode.LogOutputChannel): Promise<void> {
  const old = client;
  client = undefined;
  if (old?.isRunning()) {
    await old.stop(); // stop() throws on a client that failed to start
  }
  try {
    await start(context, output);
  } catch (err) {
    output.error(`could not start the language server: ${err}`);
    void vscode.window.showWarningMessage(
      'quickdraft: could not start `quickdraft lsp`. Check the quickdraft.command setting (user settings).',
    );
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel('quickdraft', { log: true });
  status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.command = 'quickdraft.showLog';
  context.subscriptions.push(output, status);

  context.subscriptions.push(
    vscode.commands.registerCommand('quickdraft.showLog', () => output.show()),
    vscode.commands.registerCommand('quickdraft.restart', () => restart(context, output)),
    // Run by VS Code when a suggestion is accepted whole (the item's command).
    vscode.commands.registerCommand(ACCEPT_COMMAND, (argument?: { suggestionId?: unknown }) => tracker.accepted(argument?.suggestionId)),
    vscode.workspace.onDidChangeTextDocument((event) => tracker.changed(event.document.uri.toString(), event.contentChanges)),
    vscode.window.onDidChangeTextEditorSelection((event) =>
      tracker.cursorMoved(event.textEditor.document.uri.toString(), event.selections[0].active),
    ),
    vscode.workspace.onDidGrantWorkspaceTrust(() => restart(context, output)),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (MACHINE_SETTINGS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
        // The language server takes these only at start (it ignores them later).
        await restart(context, output);
      } else if (event.affectsConfiguration(SECTION) && client?.isRunning()) {
        const settings = workspaceSettings(vscode.workspace.getConfiguration(SECTION));
        await client.sendNotification(DidChangeConfigurationNotification.type, { settings: { [SECTION]: settings } });
      }
    }),
  );

  await restart(context, output);
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}
