// What to start and with which settings, decided without the `vscode` module
// (only types from it), so plain node can test it with a stub configuration.
//
// The machine settings choose what runs and where code and the token go. A
// repository's .vscode/settings.json must not choose them: package.json
// scopes them "machine" (VS Code then ignores workspace values), and they are
// read here from user/default scope only, whatever `get()` would merge in.

// Keys under `quickdraft.` (package.json's contributes.configuration).
export const MACHINE_SETTINGS = ['command', 'server', 'authTokenFile', 'tls', 'tlsRootCertFile'] as const;
export type MachineSetting = (typeof MACHINE_SETTINGS)[number];

// Everything else the language server reads; these may differ per workspace.
export const WORKSPACE_SETTINGS = [
  'enabled', 'debounceMs', 'maxTokens', 'singleLineMaxTokens', 'enableInComments', 'enableInStrings',
  'maxFileBytes', 'repositoryContext', 'blankLineFromLineStart', 'prefetchAfterAccept', 'disabledLanguages',
] as const;

// The part of vscode.WorkspaceConfiguration used here.
export interface Configuration {
  get<T>(key: string): T | undefined;
  inspect<T>(key: string): { defaultValue?: T; globalValue?: T } | undefined;
}

export interface Connection {
  command: string;
  server: string;
  authTokenFile: string;
  tls: boolean;
  tlsRootCertFile: string;
}

const DEFAULTS: Connection = {
  command: 'quickdraft',
  server: '127.0.0.1:50051',
  authTokenFile: '',
  tls: false,
  tlsRootCertFile: '',
};

/** The machine settings from user (or remote machine) settings, else their defaults; never a workspace's. */
export function connection(config: Configuration): Connection {
  const read = <K extends MachineSetting>(key: K): Connection[K] => {
    const inspected = config.inspect<Connection[K]>(key);
    const value = inspected?.globalValue ?? inspected?.defaultValue;
    return typeof value === typeof DEFAULTS[key] ? (value as Connection[K]) : DEFAULTS[key];
  };
  return {
    command: read('command'),
    server: read('server'),
    authTokenFile: read('authTokenFile'),
    tls: read('tls'),
    tlsRootCertFile: read('tlsRootCertFile'),
  };
}

/** The settings sent with workspace/didChangeConfiguration: the workspace ones only. */
export function workspaceSettings(config: Configuration): Record<string, unknown> {
  return Object.fromEntries(WORKSPACE_SETTINGS.map((key) => [key, config.get(key)]));
}

export type Launch =
  | { kind: 'restricted'; reason: string }
  | { kind: 'start'; command: string; args: string[]; cwd: string; initializationOptions: Record<string, unknown> };

/**
 * What to do on start. In an untrusted workspace nothing is started: the
 * language server's only job is to read the workspace's files and send them
 * to the completion server, which the user has not agreed to in Restricted
 * Mode. `safeCwd` is a folder outside the workspace: a relative or bare
 * command must never resolve to a file in the repository (Windows looks in
 * the working directory first, and vscode-languageclient defaults it to the
 * workspace root).
 */
export function launch(config: Configuration, trusted: boolean, safeCwd: string): Launch {
  const c = connection(config);
  if (!trusted) {
    return {
      kind: 'restricted',
      reason:
        'quickdraft is off in Restricted Mode: it would send this workspace\'s code to ' +
        `${c.server}. Trust the workspace to turn completions on.`,
    };
  }
  return {
    kind: 'start',
    command: c.command,
    // `=` keeps a value starting with "-" from being read as an option.
    args: ['lsp', `--server=${c.server}`],
    cwd: safeCwd,
    initializationOptions: {
      ...workspaceSettings(config),
      server: c.server,
      authTokenFile: c.authTokenFile,
      tls: c.tls,
      tlsRootCertFile: c.tlsRootCertFile,
    },
  };
}
