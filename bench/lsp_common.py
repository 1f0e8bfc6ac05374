"""Shared pieces of the LSP bridge benchmarks: a realistic large source file,
the bridge started under a real LSP client, percentiles, and the
markdown/JSON report every benchmark prints and writes."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import statistics
import sys
from collections.abc import Sequence
from typing import Any

# Names the generated file calls and the helper modules define, so that the
# repository context has something to find.
HELPERS = ["normalize", "validate", "render", "load_config", "merge_maps", "retry", "parse_header", "encode_frame"]


def generate_python(lines: int = 5000, seed: int = 0) -> str:
    """A deterministic Python module of about ``lines`` lines that looks like
    real code: imports, classes with methods, nested blocks, docstrings,
    comments, calls to helpers from other modules."""
    rng = random.Random(seed)
    out = [
        '"""Service layer: request handling, caching and reporting."""',
        "",
        "from __future__ import annotations",
        "",
        "import json",
        "import logging",
        "import os",
        "from dataclasses import dataclass, field",
        "from typing import Any, Iterable",
        "",
        "from helpers.text import normalize, render, parse_header",
        "from helpers.io import load_config, retry, encode_frame",
        "from helpers.maps import merge_maps, validate",
        "",
        "log = logging.getLogger(__name__)",
        "",
    ]
    n = 0
    while len(out) < lines:
        n += 1
        out += ["", "", "@dataclass", f"class Handler{n}:", f'    """Handles requests of kind {n}."""', ""]
        out += [f"    name: str = 'handler-{n}'", "    limit: int = 10", "    seen: dict[str, Any] = field(default_factory=dict)", ""]
        for m in range(rng.randint(6, 12)):
            helper = rng.choice(HELPERS)
            other = rng.choice(HELPERS)
            out += [
                f"    def step_{m}(self, items: Iterable[str], retries: int = 3) -> list[str]:",
                f'        """Step {m}: {helper} then {other}."""',
                "        results = []",
                "        for item in items:",
                f"            value = {helper}(item)",
                "            if not value:",
                "                # nothing to do for empty values",
                "                continue",
                f"            if len(results) > self.limit * {m + 1}:",
                f'                log.warning("too many results in step {m}: %d", len(results))',
                "                break",
                f"            results.append({other}(value, retries=retries))",
                f"        self.seen['step_{m}'] = len(results)",
                "        return results",
                "",
            ]
        out += [
            f"def make_handler_{n}(config_path: str) -> Handler{n}:",
            "    config = load_config(config_path)",
            f"    handler = Handler{n}(name=config.get('name', 'h{n}'))",
            "    handler.limit = int(config.get('limit', 10))",
            "    return handler",
        ]
    return "\n".join(out[:lines]) + "\n"


def helper_modules() -> dict[str, str]:
    """Other files of the generated repository (relative path -> source)."""
    text = "\n\n".join(
        f"def {name}(value, retries=3):\n    \"\"\"{name.replace('_', ' ')}.\"\"\"\n    return value\n" for name in HELPERS[:3]
    )
    io = "\n\n".join(f"def {name}(value, retries=3):\n    return value\n" for name in HELPERS[3:6])
    maps = "\n\n".join(f"def {name}(value, retries=3):\n    return dict(value)\n" for name in HELPERS[6:])
    return {"helpers/__init__.py": "", "helpers/text.py": text, "helpers/io.py": io, "helpers/maps.py": maps}


async def start_bridge(address: str, root: str, name: str, *, settings: dict, experimental: dict | None = None,
                       utf16: bool = False) -> tuple[Any, asyncio.Event, Any]:
    """``quickdraft lsp`` as a subprocess under a pygls client, initialized on
    the workspace ``root``: (client, an event set once the bridge reports its
    server up, the InitializeResult)."""
    from pathlib import Path

    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    client = LanguageClient(name, "1")
    up = asyncio.Event()

    @client.feature("quickdraft/status")
    def status(params) -> None:
        state = params["state"] if isinstance(params, dict) else getattr(params, "state", None)
        if state == "up":
            up.set()

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def log_message(params) -> None:
        pass

    await client.start_io(sys.executable, "-m", "quickdraft.lsp_bridge", "--server", address, "--log-level", "WARNING")
    general = types.GeneralClientCapabilities(position_encodings=[types.PositionEncodingKind.Utf16]) if utf16 else None
    result = await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(
            general=general,
            text_document=types.TextDocumentClientCapabilities(inline_completion=types.InlineCompletionClientCapabilities()),
            experimental=experimental,
        ),
        initialization_options=settings,
        workspace_folders=[types.WorkspaceFolder(uri=Path(root).as_uri(), name=os.path.basename(root))],
    ))
    client.initialized(types.InitializedParams())
    return client, up, result


def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return {
        "n": len(ordered),
        "mean_ms": statistics.fmean(ordered),
        "p50_ms": pick(0.50),
        "p90_ms": pick(0.90),
        "p99_ms": pick(0.99),
        "max_ms": ordered[-1],
    }


def machine() -> str:
    from quickdraft.server.engine import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def report(title: str, rows: list[dict], columns: list[tuple[str, str]], json_path: str | None, extra: dict | None = None) -> None:
    """Print a markdown table (columns: (key, header)) and write the JSON."""
    print(f"### {title}\n")
    print(f"machine: {machine()}\n")
    print("| " + " | ".join(h for _, h in columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key, "")
            cells.append(f"{value:.3f}" if isinstance(value, float) else str(value))
        print("| " + " | ".join(cells) + " |")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"title": title, "machine": machine(), "rows": rows, **(extra or {})}, f, indent=2)
        print(f"\nwrote {json_path}")
