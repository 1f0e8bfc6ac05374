"""Write docs/configuration.md. The generator is quickdraft.server.config.reference;
`python -m quickdraft.server.config markdown` prints the same text.
tests/test_docs.py fails when the file is stale. Run: python scripts/config_reference.py"""

from __future__ import annotations

import sys
from pathlib import Path

from quickdraft.server.config.reference import render

TARGET = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET}", file=sys.stderr)
