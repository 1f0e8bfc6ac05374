"""Repository context is read only from inside the workspace folders, symlinks resolved.

A repository can hold ``cfg.py -> ~/.env``, a symlinked folder, or imports
that climb above its root (``from ..... import x``, ``../../x``); none of
what they reach outside may become prompt context. Documents the editor
has open are its own choice and are used as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quickdraft.lsp_bridge import symbols as symbols_module
from quickdraft.lsp_bridge.context import Budget, ContextEngine
from quickdraft.lsp_bridge.document import line_starts_of
from quickdraft.lsp_bridge.languages import load
from quickdraft.lsp_bridge.symbols import extract, resolve_imports
from quickdraft.lsp_bridge.syntax import parser_for
from quickdraft.lsp_bridge.workspace import Workspace, confined_path, real_folders

SECRET = 'API_KEY = "sk-outside-the-workspace"\n'


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace root, a folder outside it holding secrets)."""
    home = tmp_path / "home"
    (home / "secrets").mkdir(parents=True)
    (home / ".env").write_text(SECRET)
    (home / "secret.py").write_text(SECRET)
    (home / "secrets" / "creds.py").write_text(SECRET)
    (home / "keys.ts").write_text('export const API_KEY = "sk-outside-the-workspace";\n')
    root = home / "projects" / "repo"
    (root / "pkg" / "sub").mkdir(parents=True)
    return root, home


def context_of(root: Path, name: str, text: str, language_id: str = "python") -> str:
    ws = Workspace([str(root)])
    opened = ws.open((root / name).as_uri(), text, language_id=language_id)
    prompt = ContextEngine(ws).build(opened, len(text.encode()), Budget())
    return "".join(path + "\n" + content for path, content in prompt.context_files)


def test_relative_import_climbing_above_the_root_is_not_read(layout):
    root, _ = layout
    # In pkg/sub/mod.py five dots climb sub -> pkg -> repo -> projects -> home.
    text = "from .....secret import API_KEY\n\nkey = API_KEY\nx = "
    assert "sk-outside" not in context_of(root, "pkg/sub/mod.py", text)


def test_js_relative_path_climbing_above_the_root_is_not_read(layout):
    root, _ = layout
    text = 'import { API_KEY } from "../../keys";\n\nconst key = API_KEY;\nconst x = '
    assert "sk-outside" not in context_of(root, "main.ts", text, "typescript")


def test_symlinked_file_to_outside_is_not_read(layout):
    root, home = layout
    (root / "cfg.py").symlink_to(home / ".env")
    text = "from cfg import API_KEY\n\nkey = API_KEY\nx = "
    assert "sk-outside" not in context_of(root, "main.py", text)


def test_symlinked_folder_to_outside_is_not_read(layout):
    root, home = layout
    (root / "shared").symlink_to(home / "secrets", target_is_directory=True)
    text = "from shared.creds import API_KEY\n\nkey = API_KEY\nx = "
    assert "sk-outside" not in context_of(root, "main.py", text)


def test_symlink_inside_the_workspace_still_gives_context(layout):
    root, _ = layout
    (root / "pkg" / "impl.py").write_text("def helper(value):\n    return value * 2\n")
    (root / "alias.py").symlink_to(root / "pkg" / "impl.py")
    text = "from alias import helper\n\nresult = helper(3)\nx = "
    context = context_of(root, "main.py", text)
    assert "alias.py" in context and "def helper(value):" in context


def test_workspace_opened_through_a_symlink_still_gives_context(layout, tmp_path):
    root, _ = layout
    (root / "util.py").write_text("def helper(value):\n    return value * 2\n")
    link = tmp_path / "repo-link"
    link.symlink_to(root, target_is_directory=True)
    text = "from util import helper\n\nresult = helper(3)\nx = "
    assert "def helper(value):" in context_of(link, "main.py", text)


def test_a_file_that_becomes_a_symlink_to_outside_is_not_read_again(layout, monkeypatch):
    root, home = layout
    monkeypatch.setattr(symbols_module, "_STAT_INTERVAL_S", 0.0)  # re-stat on every use
    (root / "cfg.py").write_text("def helper(value):\n    return value * 2\n")
    ws = Workspace([str(root)])
    engine = ContextEngine(ws)
    text = "from cfg import helper, API_KEY\n\nresult = helper(API_KEY)\nx = "
    opened = ws.open((root / "main.py").as_uri(), text, language_id="python")
    first = engine.build(opened, len(text), Budget())
    assert "def helper(value):" in dict(first.context_files)["cfg.py"]
    # Same imports (the resolution is cached), but cfg.py now leaves the workspace.
    (root / "cfg.py").unlink()
    (root / "cfg.py").symlink_to(home / ".env")
    second = engine.build(opened, len(text), Budget())
    assert all("sk-outside" not in content for _, content in second.context_files)


def test_open_documents_outside_the_workspace_are_used_as_sent(layout):
    root, home = layout
    ws = Workspace([str(root)])
    ws.open((home / "notes.py").as_uri(), "def remembered():\n    return 1\n", language_id="python")
    text = "value = remembered()\nx = "
    opened = ws.open((root / "main.py").as_uri(), text, language_id="python")
    prompt = ContextEngine(ws).build(opened, len(text), Budget())
    assert "def remembered():" in "".join(c for _, c in prompt.context_files)


def test_confined_path(layout):
    root, home = layout
    roots = real_folders([str(root)])
    (root / "cfg.py").symlink_to(home / ".env")
    (root / "loop.py").symlink_to(root / "loop.py")
    (root / "ok.py").write_text("x = 1\n")
    assert confined_path(str(root / "ok.py"), roots) == str((root / "ok.py").resolve())
    assert confined_path(str(root / "pkg" / ".." / "ok.py"), roots) is not None
    assert confined_path(str(root / "cfg.py"), roots) is None
    assert confined_path(str(root / ".." / "repo-sibling.py"), roots) is None
    assert confined_path(str(root / "loop.py"), roots) is None
    assert confined_path(str(root / "ok.py"), []) is None  # no folder: nothing from disk
    # A sibling whose name starts with the root's is not inside it.
    sibling = Path(str(root) + "-evil")
    sibling.mkdir()
    (sibling / "x.py").write_text(SECRET)
    assert confined_path(str(sibling / "x.py"), roots) is None
    assert os.path.isfile(sibling / "x.py")


def test_resolve_imports_only_names_files_inside_the_roots(layout):
    root, home = layout
    (root / "cfg.py").symlink_to(home / ".env")
    (root / "pkg" / "util.py").write_text("def helper():\n    pass\n")
    source = "from .....secret import API_KEY\nfrom cfg import X\nfrom ..util import helper\n"
    path = root / "pkg" / "sub" / "mod.py"
    spec = load("python")
    data = source.encode()
    symbols = extract(str(path), spec, data, parser_for(spec).parse(data), line_starts_of(data))
    # Without the check: home/secret.py and repo/cfg.py (-> home/.env) would be named too.
    assert resolve_imports(symbols, [str(root)]) == [str(root / "pkg" / "util.py")]
