"""How a benchmark report names the command that made it (bench/report.py)."""

from __future__ import annotations

import sys

from quickdraft.bench import report


def test_the_command_names_the_module_it_was_started_as(monkeypatch):
    """`python -m quickdraft` runs the package's own __main__ (the device's
    installed layout): the command reads `python -m quickdraft bench ...`,
    with no trailing dot; a benchmark module keeps its dotted name."""
    monkeypatch.setattr(sys, "argv", [str(report.REPO / "__main__.py"), "bench", "phases", "--one-server"])
    assert report.command_line() == "python -m quickdraft bench phases --one-server"
    monkeypatch.setattr(sys, "argv", [str(report.REPO / "bench" / "gate.py"), "--json", "x"])
    assert report.command_line() == "python -m quickdraft.bench.gate --json x"
