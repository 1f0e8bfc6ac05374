"""bench phases --clock: each request timed by the load generator or by the server."""

from __future__ import annotations

import json

import pytest

from quickdraft.bench.loadgen import Result
from quickdraft.bench.phases.run import on_server_clock
from quickdraft.bench.phases.statics import load_statics
from quickdraft.bench.phases.timeline import PhasesSpec


def test_the_server_clock_takes_the_servers_first_token_and_decoding():
    # The client saw its first text 80 ms late (held back), then the rest in a burst.
    r = Result(index=1, kind="fim", latency_class="inline", planned_cancel=False, outcome="ok", ttft_s=0.110, tokens=11, decode_s=0.010, server_ttft_s=0.030, server_tpot_s=0.009)
    s = on_server_clock(r)
    assert s.ttft_s == pytest.approx(0.030) and s.decode_s == pytest.approx(0.090) and s.tpot_s == pytest.approx(0.009)
    assert r.decode_s == 0.010, "the client's figures are left as they were"
    one = on_server_clock(Result(index=2, kind="fim", latency_class="inline", planned_cancel=False, outcome="ok", ttft_s=0.1, tokens=1, decode_s=0.0, server_ttft_s=0.05))
    assert one.decode_s is None and one.ttft_s == pytest.approx(0.05), "one token: no decoding to time"
    failed = Result(index=3, kind="fim", latency_class="inline", planned_cancel=False, outcome="failed", error="UNAVAILABLE")
    assert on_server_clock(failed) is failed


def test_a_clock_other_than_client_or_server_is_refused():
    with pytest.raises(ValueError, match="--clock"):
        PhasesSpec(clock="wall").validate()


def test_statics_timed_on_another_clock_are_refused(tmp_path):
    path = tmp_path / "phases.json"
    path.write_text(json.dumps({"benchmark": "controller_phases", "date": "d", "spec": {"concurrency": [1, 8, 1], "clock": "client"},
                                "runs": [], "workload": {}}))
    with pytest.raises(ValueError, match="client's clock"):
        load_statics(path, PhasesSpec(clock="server"))
    runs, _ = load_statics(path, PhasesSpec(clock="client"))
    assert runs == []
    path.write_text(json.dumps({"benchmark": "controller_phases", "date": "d", "spec": {"concurrency": [1, 8, 1]},
                                "runs": [], "workload": {}}))
    with pytest.raises(ValueError, match="client's clock"):
        load_statics(path, PhasesSpec(clock="server")), "a run from before --clock was timed by the client"


def test_the_report_shows_the_servers_clock_beside_the_clients():
    from quickdraft.bench.phases.report import server_clock_table
    from quickdraft.bench.phases.timeline import Phase

    phases = [Phase(0, 1, 0.0, 20.0), Phase(1, 8, 20.0, 40.0)]
    fig = lambda ms: {"settled": {"tpot_ms_token_weighted": 2.0, "server_tpot_ms": {"mean": ms}}}  # noqa: E731
    doc = {"spec": {"clock": "client"}, "runs": [
        {"label": "p7", "phases": [{"phase": 0, **fig(3.34)}, {"phase": 1, **fig(15.87)}]},
        {"label": "from a sweep", "phases": [{"phase": 0, "settled": {"tpot_ms_token_weighted": 2.0}}]}]}
    lines = server_clock_table(doc, phases)
    assert "| config | phase 1: 1 stream | phase 2: 8 streams |" in lines
    assert "| p7 | 3.34 | 15.87 |" in lines and not any(line.startswith("| from a sweep") for line in lines)
    assert server_clock_table({**doc, "spec": {"clock": "server"}}, phases) == [], "a run on the server's clock says it once"
