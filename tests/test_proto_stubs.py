"""The committed stubs in quickdraft/v1 are what proto/generate.py makes from proto/."""

from pathlib import Path

from proto.generate import ROOT, generate


def test_committed_stubs_match_regeneration(tmp_path: Path):
    generate(tmp_path)
    produced = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert produced, "protoc produced nothing"
    for rel in produced:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is not committed; run python proto/generate.py"
        assert committed.read_text() == (tmp_path / rel).read_text(), f"{rel} is stale; run python proto/generate.py"
