"""A real VS Code shows the embedded model's ghost text, and Tab accepts it.

code-server (VS Code 1.100 served to a browser; editors/vscode/e2e/, set up by
editors/vscode/e2e/setup.sh) runs with the packaged extension (the .vsix of
tests/test_vscode_package.py) installed and user settings that point it at
this repository's ``quickdraft lsp`` and the session's server on the embedded
model (tests/integration/conftest.py). Headless Chromium, driven by
playwright-core (editors/vscode/e2e/ghost_text.mjs), opens a Python file
through Quick Open, types, waits for the ghost text, screenshots it, presses
Tab and saves. The saved file must hold what was typed followed by the
suggestion that was on screen, and the server must have counted that
suggestion, reported by the extension through the bridge, as shown and then
accepted whole, under the request's labels: in ``GetOutcomeStats`` (python,
inline, the engine's speculative config; as many accepted characters as the
document gained) and in the Prometheus series of docs/metrics.md.

Without the rig (setup.sh not run, or no Chromium) the test skips, unless
QUICKDRAFT_EDITOR_TEST=require (``make editor-test``): then a missing piece
fails. QUICKDRAFT_EDITOR_SCREENSHOT=<path> keeps the screenshot
(docs/vscode-ghost-text.png was made so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.test_vscode_package import VSCE, package_vsix

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "editors" / "vscode" / "e2e"
CODE_SERVER = E2E / "node_modules" / ".bin" / "code-server"
CHROMIUM = [os.environ.get("QUICKDRAFT_CHROMIUM"), "/usr/lib/chromium/chromium", "/usr/bin/chromium",
            "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]

ORIGINAL = """import math


class Point:
    def __init__(self, x, y):
        self.x = x
        self.y = y

"""
TYPED = ["    def __eq__(self, other):\n"]  # VS Code indents the next line itself

SETTINGS = {
    "security.workspace.trust.enabled": False,
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": False,
    "workbench.colorTheme": "Default Dark Modern",
    "telemetry.telemetryLevel": "off",
    "update.mode": "none",
    "extensions.autoCheckUpdates": False,
    "extensions.autoUpdate": False,
    "extensions.ignoreRecommendations": True,
    # Only quickdraft's inline suggestion on screen: Tab must accept it, not a suggest-widget item.
    "editor.inlineSuggest.enabled": True,
    "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
    "editor.suggestOnTriggerCharacters": False,
    # What is typed is what lands in the document.
    "editor.autoClosingBrackets": "never",
    "editor.autoClosingQuotes": "never",
    "editor.minimap.enabled": False,
}


def missing(reason: str) -> None:
    if os.environ.get("QUICKDRAFT_EDITOR_TEST") == "require":
        pytest.fail(f"the editor test must run (QUICKDRAFT_EDITOR_TEST=require): {reason}")
    pytest.skip(reason)


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"code-server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"code-server did not answer on {url} in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def series_value(body: str, name: str, **labels: str) -> float:
    """The sum of the Prometheus samples of ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in body.splitlines():
        m = re.match(rf"{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m is None:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def group_figures(stats, language: str, latency_class: str, config: str):
    """The OutcomeFigures of one (language, class, config) group, or None."""
    return next((g for g in stats.groups if (g.language, g.latency_class, g.speculative_config) == (language, latency_class, config)),
                None)


def wait_for(check: Callable[[], object], timeout: float, what: str) -> object:
    """Poll ``check`` until it returns something true (the bridge sends outcomes in batches, a second apart)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.25)


def stop(proc: subprocess.Popen) -> None:
    """code-server, its extension host and the language server it started: one process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


def test_ghost_text_in_a_real_vscode_is_accepted_with_tab(request, tmp_path):
    if shutil.which("node") is None:
        missing("node is not installed")
    if not CODE_SERVER.exists() or not (E2E / "node_modules" / "playwright-core").exists():
        missing("code-server and playwright-core are not installed: run editors/vscode/e2e/setup.sh")
    if not any(p and Path(p).exists() for p in CHROMIUM):
        missing("no Chromium (apt-get install chromium, or set QUICKDRAFT_CHROMIUM)")
    if not VSCE.exists():
        missing("editors/vscode has no node_modules/.bin/vsce: run `make vscode` first")
    quickdraft = Path(sys.executable).with_name("quickdraft")
    assert quickdraft.exists(), f"{quickdraft} missing: install the package (scripts/install.sh)"

    server = request.getfixturevalue("server")  # the session's server on the embedded model
    vsix = package_vsix(tmp_path)
    workspace, user_data, extensions = tmp_path / "ws", tmp_path / "user-data", tmp_path / "extensions"
    workspace.mkdir()
    (workspace / "point.py").write_text(ORIGINAL)
    (user_data / "User").mkdir(parents=True)
    settings = {**SETTINGS, "quickdraft.command": str(quickdraft), "quickdraft.server": server.address}
    (user_data / "User" / "settings.json").write_text(json.dumps(settings, indent=2))
    env = {**os.environ, **{k: str(tmp_path / k.lower()) for k in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME")}}
    common = ["--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]

    installed = subprocess.run([str(CODE_SERVER), *common, "--install-extension", str(vsix)], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    assert installed.returncode == 0 and (extensions / "quickdraft.quickdraft-vscode-0.1.0").is_dir(), installed.stdout + installed.stderr

    from quickdraft.client import CompletionClient

    labels = {"quickdraft_language": "python", "quickdraft_latency_class": "inline"}
    accepted_series = "quickdraft_suggestions_accepted_total"
    with CompletionClient(server.address, timeout=30) as stats_client:
        before = stats_client.outcome_stats()
    metrics_before = scrape(server.cfg.telemetry.metrics_port)

    port = free_port()
    log = tmp_path / "code-server.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen([str(CODE_SERVER), *common, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
                                 "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
                                 "--disable-getting-started-override", str(workspace)],
                                env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        shot = tmp_path / "ghost-text.png"
        args = {"url": f"http://127.0.0.1:{port}/?folder={workspace}", "file": "point.py",
                "path": str(workspace / "point.py"), "type": TYPED, "width": 900, "height": 400,
                "screenshot": str(shot), "failureScreenshot": str(tmp_path / "failure.png")}
        done = subprocess.run(["node", str(E2E / "ghost_text.mjs"), json.dumps(args)], cwd=E2E, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        lines = done.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        assert done.returncode == 0 and result.get("ok"), (
            f"driver failed: {result.get('error') or done.stderr[-3000:]}\n(screenshots in {tmp_path})\n"
            f"code-server log:\n{log.read_text()[-3000:]}")
        # The editor still runs: the bridge's outcome batch is sent a second after its first report.
        config = server.engine.spec.label()

        def accepted_group():
            with CompletionClient(server.address, timeout=30) as c:
                group = group_figures(c.outcome_stats(), "python", "inline", config)
            old = group_figures(before, "python", "inline", config)
            return group if group is not None and group.accepted > (old.accepted if old else 0) else None

        group = wait_for(accepted_group, 30, f"no accepted suggestion in the server's GetOutcomeStats for (python, inline, {config})")
    finally:
        stop(proc)
    print("editor timings (s):", result["timings"], "ghost:", repr(result["ghost"]))
    if os.environ.get("QUICKDRAFT_EDITOR_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["QUICKDRAFT_EDITOR_SCREENSHOT"])

    assert "connected to " + server.address in result["status"]
    ghost = result["ghost"]
    assert ghost.strip(), "the ghost text was empty"
    saved = (workspace / "point.py").read_text()
    # The document is what was there, what was typed (VS Code added the
    # indentation after the colon) and the suggestion that was on screen.
    assert saved.startswith(ORIGINAL + TYPED[0]), saved
    assert squash(saved) == squash(ORIGINAL + "".join(TYPED) + ghost), (saved, ghost)
    for line in ghost.splitlines():
        assert line.strip() in saved, (line, saved)

    # The suggestion reached the server as outcomes of its own request, labelled by it.
    old = group_figures(before, "python", "inline", config)
    delta = {f: getattr(group, f) - (getattr(old, f) if old else 0) for f in ("shown", "accepted", "partially_accepted", "accepted_chars")}
    inserted = saved[len(ORIGINAL + TYPED[0]):].lstrip(" ")  # VS Code's indentation after Enter is not the suggestion's
    assert delta["accepted"] == 1 and delta["partially_accepted"] == 0, delta
    assert delta["shown"] >= 1, delta  # this one, and any drawn and typed over while typing
    assert delta["accepted_chars"] == len(inserted), (delta, inserted)
    assert group.mean_shown_ms > 0
    metrics_after = scrape(server.cfg.telemetry.metrics_port)
    series = {**labels, "quickdraft_speculative_config": config, "quickdraft_acceptance": "whole"}
    assert series_value(metrics_after, accepted_series, **series) - series_value(metrics_before, accepted_series, **series) == 1, (
        [line for line in metrics_after.splitlines() if line.startswith(accepted_series)])
    chars_series = "quickdraft_suggestions_accepted_chars_total"
    chars_labels = {**labels, "quickdraft_speculative_config": config}
    assert (series_value(metrics_after, chars_series, **chars_labels) - series_value(metrics_before, chars_series, **chars_labels)
            == len(inserted))
    assert (series_value(metrics_after, "quickdraft_suggestions_shown_total", **chars_labels)
            - series_value(metrics_before, "quickdraft_suggestions_shown_total", **chars_labels)) == delta["shown"]
