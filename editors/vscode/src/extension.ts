// quickdraft for VS Code: starts `quickdraft lsp` and lets vscode-languageclient
// turn its textDocument/inlineCompletion answers into ghost text.

import * as vscode from 'vscode';
import {
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  TransportKind,
} from 'vscode-languageclient/node';

const SECTION = 'quickdraft';
let client: LanguageClient | undefined;
let status: vscode.StatusBarItem | undefined;

// Settings the language server reads (camelCase keys, as in package.json).
const SERVER_SETTINGS = [
  'enabled', 'server', 'authTokenFile', 'tls', 'tlsRootCertFile', 'debounceMs', 'maxTokens',
  'singleLineMaxTokens', 'enableInComments', 'enableInStrings', 'maxFileBytes', 'repositoryContext',
  'blankLineFromLineStart', 'disabledLanguages',
];

function serverSettings(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration(SECTION);
  const settings: Record<string, unknown> = {};
  for (const key of SERVER_SETTINGS) {
    settings[key] = config.get(key);
  }
  return settings;
}

function showState(state: string, server: string): void {
  if (!status) {
    return;
  }
  const up = state === 'up';
  status.text = up ? '$(sparkle) quickdraft' : '$(warning) quickdraft';
  status.tooltip = up ? `quickdraft: connected to ${server}` : `quickdraft: server ${server} is ${state}`;
  status.show();
}

async function start(output: vscode.LogOutputChannel): Promise<void> {
  const config = vscode.workspace.getConfiguration(SECTION);
  const command = config.get<string>('command', 'quickdraft');
  const server = config.get<string>('server', '127.0.0.1:50051');
  const serverOptions: ServerOptions = {
    command,
    args: ['lsp', '--server', server],
    transport: TransportKind.stdio,
  };
  const clientOptions: LanguageClientOptions = {
    // Every language: files of unknown languages get a plain prefix/suffix prompt.
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: serverSettings(),
    // Sends workspace/didChangeConfiguration with the `quickdraft` section on changes.
    synchronize: { configurationSection: SECTION },
    outputChannel: output,
  };
  client = new LanguageClient('quickdraft', 'quickdraft', serverOptions, clientOptions);
  client.onNotification('quickdraft/status', (params: { state: string; server: string }) =>
    showState(params.state, params.server),
  );
  await client.start();
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel('quickdraft', { log: true });
  status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.command = 'quickdraft.showLog';
  context.subscriptions.push(output, status);

  context.subscriptions.push(
    vscode.commands.registerCommand('quickdraft.showLog', () => output.show()),
    vscode.commands.registerCommand('quickdraft.restart', async () => {
      await client?.stop();
      await start(output);
    }),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      // The executable is only read at start; everything else flows to the server.
      if (event.affectsConfiguration(`${SECTION}.command`)) {
        await client?.stop();
        await start(output);
      }
    }),
  );

  try {
    await start(output);
  } catch (err) {
    output.appendLine(`quickdraft: could not start the language server: ${err}`);
    void vscode.window.showWarningMessage(
      'quickdraft: could not start `quickdraft lsp`. Check the quickdraft.command setting.',
    );
  }
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}
