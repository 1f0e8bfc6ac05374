"""Regenerate the committed Python stubs for proto/quickdraft/v1/*.proto.

Run from the repository root: ``python proto/generate.py``. The stubs land in
``quickdraft/v1/`` (the proto package path), so the generated import lines
(``from quickdraft.v1 import completion_pb2``) resolve inside the installed
package. ``tests/test_proto_stubs.py`` fails when the committed stubs differ
from what this script produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / "quickdraft" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto file under out_dir."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    for proto in proto_files():
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto.relative_to(PROTO_ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
