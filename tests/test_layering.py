"""Dependencies flow one way: lsp_bridge -> client -> wire <- server.

"wire" is what clients and the server share: the generated protobufs
(quickdraft/v1), quickdraft/wire.py and the prompt format. The server
imports neither the clients nor the benchmarks; the clients do not import
the server. Checked on every import statement of every module, those inside
functions included, by walking the source's AST (nothing is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top-level folder (or file) -> its package name, as pyproject.toml maps them.
PACKAGES = {"server": "quickdraft.server", "client": "quickdraft.client", "lsp_bridge": "quickdraft.lsp_bridge", "bench": "quickdraft.bench", "quickdraft": "quickdraft"}
WIRE = [ROOT / "quickdraft" / "wire.py", ROOT / "quickdraft" / "prompt_format.py", *sorted((ROOT / "quickdraft" / "v1").glob("*.py"))]
LAYERS = {
    "server": (sorted((ROOT / "server").rglob("*.py")), ("quickdraft.client", "quickdraft.bench", "quickdraft.lsp_bridge", "quickdraft.cli")),
    "client": (sorted((ROOT / "client").rglob("*.py")), ("quickdraft.server", "quickdraft.bench", "quickdraft.lsp_bridge", "quickdraft.cli")),
    "wire": (WIRE, ("quickdraft.server", "quickdraft.client", "quickdraft.bench", "quickdraft.lsp_bridge", "quickdraft.cli")),
    "lsp_bridge": (sorted((ROOT / "lsp_bridge").rglob("*.py")), ("quickdraft.server", "quickdraft.bench", "quickdraft.cli")),
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:]]
    return ".".join(parts).removesuffix(".__init__")


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module an import statement in ``path`` (or ``source``, read as if
    it were there) names, relative ones resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # "from quickdraft import client" imports quickdraft.client too.
            out.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
    return out


def forbidden_imports(path: Path, banned: tuple[str, ...], source: str | None = None) -> list[str]:
    return sorted(m for m in imported_modules(path, source) if any(m == b or m.startswith(b + ".") for b in banned))


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_no_layer_imports_against_the_flow(layer):
    files, banned = LAYERS[layer]
    assert files, f"no modules found for {layer}"
    wrong = {str(f.relative_to(ROOT)): bad for f in files if (bad := forbidden_imports(f, banned))}
    assert not wrong, f"{layer} must not import {banned}: {wrong}"


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    probe = ROOT / "server" / "controller" / "probe.py"
    source = "from .state import S\n\ndef f():\n    from quickdraft import client\n    from ...bench import x\n"
    assert "quickdraft.server.controller.state" in imported_modules(probe, source)
    assert forbidden_imports(probe, LAYERS["server"][1], source) == ["quickdraft.bench", "quickdraft.bench.x", "quickdraft.client"]
