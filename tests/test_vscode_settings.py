"""The VS Code extension cannot be redirected by a repository's settings.

The settings that choose what runs and where code and the token go
(``quickdraft.command``, ``server``, ``authTokenFile``, ``tls``,
``tlsRootCertFile``) are machine-scoped in package.json and read from user or
default scope only; in an untrusted workspace the language server is not
started until trust is granted.

The package.json checks always run. The others run the TypeScript under plain
node: ``settings.js`` as it is (it must not need the ``vscode`` module), and
``extension.js`` with stand-ins for ``vscode`` and ``vscode-languageclient``
whose configuration holds a workspace value for every setting, and whose
``get()`` returns it, as a VS Code that ignored the scopes would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

EXTENSION = Path(__file__).resolve().parent.parent / "editors" / "vscode"
MACHINE = ["command", "server", "authTokenFile", "tls", "tlsRootCertFile"]


def package() -> dict:
    return json.loads((EXTENSION / "package.json").read_text())


def test_settings_that_run_or_redirect_are_machine_scoped():
    properties = package()["contributes"]["configuration"]["properties"]
    scoped = sorted(key.removeprefix("quickdraft.") for key, spec in properties.items() if spec.get("scope") == "machine")
    assert scoped == sorted(MACHINE)


def test_untrusted_workspaces_get_limited_support_with_the_machine_settings_restricted():
    untrusted = package()["capabilities"]["untrustedWorkspaces"]
    assert untrusted["supported"] == "limited"
    assert sorted(untrusted["restrictedConfigurations"]) == sorted(f"quickdraft.{key}" for key in MACHINE)
    assert "Restricted Mode" in untrusted["description"]


# -- the compiled TypeScript under node ----------------------------------------

# user settings: some set, some left at their defaults; the workspace sets everything.
SETTINGS = {
    "command": {"defaultValue": "quickdraft", "globalValue": "/usr/local/bin/quickdraft", "workspaceValue": "./evil"},
    "server": {"defaultValue": "127.0.0.1:50051", "workspaceValue": "attacker.example:443",
               "workspaceFolderValue": "attacker.example:444"},
    "authTokenFile": {"defaultValue": "", "globalValue": "/home/me/.quickdraft-token",
                      "workspaceValue": "/home/me/.ssh/id_ed25519"},
    "tls": {"defaultValue": False, "workspaceValue": True},
    "tlsRootCertFile": {"defaultValue": "", "workspaceFolderValue": "/repo/evil-ca.pem"},
    "maxTokens": {"defaultValue": 128, "workspaceValue": 7},
    "debounceMs": {"defaultValue": 75, "globalValue": 50},
}
USER_CONNECTION = {
    "command": "/usr/local/bin/quickdraft",
    "server": "127.0.0.1:50051",
    "authTokenFile": "/home/me/.quickdraft-token",
    "tls": False,
    "tlsRootCertFile": "",
}

FAKE_CONFIGURATION = """
const SETTINGS = %s;
const configuration = {
  inspect: (key) => (key in SETTINGS ? { ...SETTINGS[key] } : undefined),
  // What get() would merge were the scopes ignored: the workspace wins.
  get: (key) => {
    const v = SETTINGS[key];
    return v && (v.workspaceFolderValue ?? v.workspaceValue ?? v.globalValue ?? v.defaultValue);
  },
};
""" % json.dumps(SETTINGS)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """editors/vscode/src compiled afresh (or, without its node_modules, the build in out/)."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: cannot run the extension's TypeScript")
    tsc = EXTENSION / "node_modules" / ".bin" / "tsc"
    if tsc.exists():
        out = tmp_path_factory.mktemp("vscode-out")
        subprocess.run([str(tsc), "-p", str(EXTENSION), "--outDir", str(out)], check=True, capture_output=True, text=True)
        return out
    if (EXTENSION / "out" / "settings.js").exists():
        return EXTENSION / "out"
    pytest.skip("editors/vscode is not built: run `make vscode` (npm ci && npm run build) first")


def run_node(script: str, cwd: Path) -> dict:
    done = subprocess.run(["node", "-e", script], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_settings_module_reads_the_machine_settings_from_user_scope_only(compiled):
    # Plain node: no `vscode` module exists here, so requiring it would fail.
    script = FAKE_CONFIGURATION + """
const s = require('./settings.js');
console.log(JSON.stringify({
  connection: s.connection(configuration),
  trusted: s.launch(configuration, true, '/opt/safe'),
  untrusted: s.launch(configuration, false, '/opt/safe'),
}));
"""
    result = run_node(script, compiled)
    assert result["connection"] == USER_CONNECTION
    trusted = result["trusted"]
    assert trusted["kind"] == "start"
    assert trusted["command"] == "/usr/local/bin/quickdraft" and trusted["cwd"] == "/opt/safe"
    assert trusted["args"] == ["lsp", "--server=127.0.0.1:50051"]
    options = trusted["initializationOptions"]
    assert {key: options[key] for key in MACHINE if key != "command"} == {k: v for k, v in USER_CONNECTION.items() if k != "command"}
    assert options["maxTokens"] == 7  # the workspace's own settings still apply
    untrusted = result["untrusted"]
    assert untrusted["kind"] == "restricted" and "command" not in untrusted
    assert "Restricted Mode" in untrusted["reason"]
    assert "attacker" not in json.dumps(result) and "evil" not in json.dumps(result) and "id_ed25519" not in json.dumps(result)


EXTENSION_HARNESS = FAKE_CONFIGURATION + """
const Module = require('module');
const listeners = { trust: [], config: [], changes: [], selections: [] };
const commands = {};
const status = { show() {}, dispose() {} };
const vscode = {
  StatusBarAlignment: { Left: 1, Right: 2 },
  window: {
    createOutputChannel: () => ({ info() {}, error() {}, warn() {}, show() {}, appendLine() {}, dispose() {} }),
    createStatusBarItem: () => status,
    showWarningMessage: async () => undefined,
    onDidChangeTextEditorSelection: (f) => (listeners.selections.push(f), { dispose() {} }),
  },
  commands: { registerCommand: (name, f) => ((commands[name] = f), { dispose() {} }) },
  workspace: {
    isTrusted: false,
    workspaceFolders: [{ uri: { fsPath: '/repo' } }],
    getConfiguration: () => configuration,
    onDidGrantWorkspaceTrust: (f) => (listeners.trust.push(f), { dispose() {} }),
    onDidChangeConfiguration: (f) => (listeners.config.push(f), { dispose() {} }),
    onDidChangeTextDocument: (f) => (listeners.changes.push(f), { dispose() {} }),
  },
};
const clients = [];
class LanguageClient {
  constructor(id, name, serverOptions, clientOptions) {
    Object.assign(this, { serverOptions, clientOptions, sent: [], features: [], running: false, stopped: false });
    clients.push(this);
  }
  registerFeature(feature) { this.features.push(feature); }
  onNotification() {}
  async start() { this.running = true; }
  async stop() { this.running = false; this.stopped = true; }
  isRunning() { return this.running; }
  async sendNotification(type, params) { this.sent.push({ method: typeof type === 'string' ? type : type.method, params }); }
}
const languageclient = { LanguageClient, DidChangeConfigurationNotification: { type: { method: 'workspace/didChangeConfiguration' } } };
const load = Module._load;
Module._load = function (request, ...rest) {
  if (request === 'vscode') return vscode;
  if (request === 'vscode-languageclient/node') return languageclient;
  return load.call(this, request, ...rest);
};
const fire = (which, event) => Promise.all(listeners[which].map((f) => f(event)));
const changed = (...keys) => ({ affectsConfiguration: (key) => key === 'quickdraft' || keys.includes(key) });
const seen = (c) => ({ serverOptions: c.serverOptions, clientOptions: c.clientOptions, sent: c.sent, stopped: c.stopped });

(async () => {
  const ext = require('./extension.js');
  const result = {};
  await ext.activate({ subscriptions: [], extensionUri: { fsPath: '/opt/extension' } });
  result.untrusted = { clients: clients.length, text: status.text, tooltip: status.tooltip, command: status.command };
  vscode.workspace.isTrusted = true;
  await fire('trust');
  result.trusted = clients.map(seen);
  await fire('config', changed('quickdraft.maxTokens'));
  result.afterWorkspaceSetting = clients.map(seen);
  await fire('config', changed('quickdraft.server'));
  result.afterMachineSetting = clients.map(seen);
  console.log(JSON.stringify(result));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_extension_starts_nothing_until_the_workspace_is_trusted_then_uses_user_settings(compiled):
    result = run_node(EXTENSION_HARNESS, compiled)
    untrusted = result["untrusted"]
    assert untrusted["clients"] == 0  # nothing spawned in Restricted Mode
    assert "Restricted Mode" in untrusted["tooltip"] and untrusted["command"] == "workbench.trust.manage"
    # Trust granted: started, from user settings only, outside the repository.
    [started] = result["trusted"]
    assert started["serverOptions"] == {
        "command": "/usr/local/bin/quickdraft",
        "args": ["lsp", "--server=127.0.0.1:50051"],
        "options": {"cwd": "/opt/extension"},
    }
    options = started["clientOptions"]["initializationOptions"]
    assert {key: options[key] for key in MACHINE if key != "command"} == {k: v for k, v in USER_CONNECTION.items() if k != "command"}
    assert "synchronize" not in started["clientOptions"]  # it would forward every key, connection ones included
    # A workspace setting changes: forwarded, without the connection settings.
    [same] = result["afterWorkspaceSetting"]
    [sent] = same["sent"]
    assert sent["method"] == "workspace/didChangeConfiguration"
    assert sent["params"]["settings"]["quickdraft"]["maxTokens"] == 7
    assert not set(MACHINE) & set(sent["params"]["settings"]["quickdraft"])
    # A machine setting changes (in user settings): the language server restarts to take it.
    first, second = result["afterMachineSetting"]
    assert first["stopped"] and not second["stopped"]
    assert "attacker" not in json.dumps(result) and "evil" not in json.dumps(result)
