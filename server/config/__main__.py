"""``python -m quickdraft.server.config markdown``: print docs/configuration.md."""

from __future__ import annotations

import sys

from quickdraft.server.config.reference import render

USAGE = "usage: python -m quickdraft.server.config markdown  (prints docs/configuration.md)"


def main(argv: list[str]) -> int:
    if argv != ["markdown"]:
        print(USAGE, file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
