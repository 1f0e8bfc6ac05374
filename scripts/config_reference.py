"""Write docs/configuration.md from server/config.py: every section and field
with its type, default and docstring. tests/test_docs.py fails when the file
is stale. Run: python scripts/config_reference.py"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "server" / "config.py"
TARGET = ROOT / "docs" / "configuration.md"
SECTIONS = {
    "ModelConfig": "model", "SpeculationConfig": "speculation", "EngineConfig": "engine", "ServerConfig": "server",
    "LimitsConfig": "limits", "SecurityConfig": "security", "TelemetryConfig": "telemetry",
    "ControllerConfig": "controller", "HttpConfig": "http",
}


def fields(cls: ast.ClassDef):
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = ""
            if i + 1 < len(body) and isinstance(body[i + 1], ast.Expr) and isinstance(getattr(body[i + 1], "value", None), ast.Constant):
                doc = " ".join(str(body[i + 1].value.value).split())
            default = ast.unparse(node.value) if node.value is not None else ""
            if default.startswith("field(default_factory="):
                default = default[len("field(default_factory=") : -1].replace("lambda: ", "")
            yield node.target.id, ast.unparse(node.annotation), default, doc


def render() -> str:
    tree = ast.parse(SOURCE.read_text())
    out = [
        "# Configuration reference",
        "",
        "Generated from `server/config.py` by `python scripts/config_reference.py`; do not edit by hand.",
        "Set values in a TOML file (`quickdraft serve --config FILE`), as environment variables",
        "`QUICKDRAFT_<SECTION>__<FIELD>`, or with `--set section.field=value`.",
        "",
    ]
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name in SECTIONS:
            out += [f"## [{SECTIONS[cls.name]}]", "", " ".join((ast.get_docstring(cls) or "").split()), "", "| field | type | default | meaning |", "|---|---|---|---|"]
            for name, typ, default, doc in fields(cls):
                out.append(f"| `{name}` | `{typ}` | `{default}` | {doc.replace('|', '/')} |")
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET}", file=sys.stderr)
