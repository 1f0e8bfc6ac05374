"""The load generator against a real quickdraft server over a fake engine:
closed and open loops, bounds, cancellations the server sees, failures, both
protocols, and `quickdraft bench run`."""

from __future__ import annotations

import asyncio
import json

import pytest

from quickdraft.bench.figures import summarize_run
from quickdraft.bench.loadgen import GrpcTarget, OpenAITarget, Result, RunSpec, run_load
from quickdraft.bench.servers import free_port
from quickdraft.bench.workload import Planned, Task, Workload, WorkloadSpec


def workload(**kw) -> Workload:
    return Workload.from_spec(WorkloadSpec(**{"tasks": 32, "seed": 1, "single_line_max_tokens": 12, "multi_line_max_tokens": 24, **kw}))


async def drive(target, w, spec, progress=None):
    await target.open()
    try:
        return await run_load(target, w, spec, progress)
    finally:
        await target.close()


def test_closed_loop_counts_every_request_and_the_server_aborts_the_cancelled(fake_quickdraft):
    engine = fake_quickdraft.engine
    aborted_before = len(engine.aborted)
    seen: list[Result] = []
    w = workload(cancel_share=0.5, cancel_after_ms=(15, 40), chat_share=0.0)
    run = asyncio.run(drive(GrpcTarget(fake_quickdraft.address), w, RunSpec(concurrency=4, max_requests=40, warmup_requests=1), seen.append))
    fig = summarize_run(run)
    assert len(run.results) == len(seen) == 40
    assert [r.index for r in run.results] == list(range(40))
    assert fig["failed"] == 0, fig["failures"]
    assert fig["completed"] + fig["cancelled"] == 40
    assert fig["cancelled"] >= 5  # planned cancels at 15-40 ms hit requests that take ~85 ms
    assert all(r.planned_cancel for r in run.results if r.outcome == "cancelled")
    done = [r for r in run.results if r.outcome == "ok"]
    assert all(r.tokens > 0 and r.ttft_s > 0 and r.e2e_s >= r.ttft_s for r in done)
    # the fake engine accepts 2 drafts per step: 3 tokens per step, except a shorter last step
    assert 2.0 < fig["mean_acceptance_length"] <= 3.0
    assert fig["slo"]["inline"]["requests"] == fig["completed"]

    # The server aborted engine work for cancelled requests only (a cancel can also land
    # before the engine started or after it finished: then there is nothing to abort).
    cancelled = {r.index for r in run.results if r.outcome == "cancelled"}
    aborted = {int(rid.split("-")[1]) for rid in engine.aborted[aborted_before:]}
    assert aborted and aborted <= cancelled


def test_closed_loop_stops_at_its_time_bound(fake_quickdraft):
    w = workload(cancel_share=0.0)
    run = asyncio.run(drive(GrpcTarget(fake_quickdraft.address), w, RunSpec(concurrency=2, max_requests=10_000, duration_s=0.4, warmup_requests=0)))
    assert 2 <= len(run.results) < 200
    assert run.wall_s < 5


def test_open_loop_poisson_arrivals_and_its_in_flight_cap(fake_quickdraft):
    w = workload(cancel_share=0.0)
    run = asyncio.run(drive(GrpcTarget(fake_quickdraft.address), w, RunSpec(mode="open", rate_per_s=40, max_requests=20, warmup_requests=0, seed=3)))
    assert len(run.results) == 20 and run.dropped == 0
    assert all(r.outcome == "ok" for r in run.results)
    starts = sorted(r.start_s for r in run.results)
    assert 0.1 < starts[-1] < 5  # ~20 arrivals at 40/s
    capped = asyncio.run(drive(GrpcTarget(fake_quickdraft.address), w, RunSpec(mode="open", rate_per_s=500, max_requests=40, max_in_flight=1, warmup_requests=0)))
    assert capped.dropped > 0 and len(capped.results) + capped.dropped == 40


def test_failures_are_counted_not_raised():
    w = workload(cancel_share=0.0)
    target = GrpcTarget(f"127.0.0.1:{free_port()}", timeout_s=2)  # nothing listens there
    run = asyncio.run(drive(target, w, RunSpec(concurrency=2, max_requests=4, warmup_requests=0)))
    fig = summarize_run(run)
    assert fig["failed"] == 4 and fig["completed"] == 0
    assert all(k.startswith("UNAVAILABLE") for k in fig["failures"])
    assert fig["slo"]["inline"]["attainment"] == 0.0


def test_openai_protocol_against_quickdrafts_http_api(fake_quickdraft):
    w = workload(cancel_share=0.0)
    target = OpenAITarget(f"http://127.0.0.1:{fake_quickdraft.http_port}", model="embedded", render_fim=False)
    run = asyncio.run(drive(target, w, RunSpec(concurrency=2, max_requests=8, warmup_requests=0)))
    fig = summarize_run(run)
    assert fig["completed"] == 8, fig["failures"]
    assert all(r.tokens > 0 for r in run.results)
    assert fig["mean_acceptance_length"] is not None  # quickdraft's HTTP API reports it


def test_openai_body_renders_fim_for_upstream_vllm():
    from quickdraft.prompt_format import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX

    t = OpenAITarget("http://127.0.0.1:9", model="embedded", render_fim=True, stop_token_ids=[3, 4])
    body = t.body(Planned(0, Task(prefix="def f(", suffix=")\n", path="a.py", kind="single-line", max_tokens=12, stop=("\n",)), "inline", None))
    assert body["prompt"] == f"{FIM_PREFIX}def f({FIM_SUFFIX})\n{FIM_MIDDLE}"
    assert body["stop_token_ids"] == [3, 4] and body["stop"] == ["\n"] and body["stream"] is True
    plain = OpenAITarget("http://127.0.0.1:9", model="embedded", render_fim=False).body(
        Planned(0, Task(prefix="x = ", suffix=None, path="", kind="multi-line", max_tokens=8), "inline", None))
    assert plain["prompt"] == "x = " and "suffix" not in plain and "stop_token_ids" not in plain


@pytest.mark.parametrize("address", ["10.1.2.3:50051", "example.com:443", "http://192.0.2.7:8000"])
def test_only_loopback_targets(address):
    with pytest.raises(ValueError, match="loopback"):
        OpenAITarget(address, model="m") if address.startswith("http") else GrpcTarget(address)


def test_bench_run_command_writes_json_and_markdown(fake_quickdraft, tmp_path, capsys):
    from quickdraft.cli import main

    rc = main(["bench", "run", "--server", fake_quickdraft.address, "--requests", "12", "--concurrency", "3", "--tasks", "16",
               "--cancel-share", "0.25", "--out", str(tmp_path), "--no-progress", "--per-request", "--label", "fake"])
    assert rc == 0
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["figures"]["requests"] == 12 and doc["figures"]["concurrency"] == 3
    assert doc["workload"]["cancel_share"] == 0.25 and doc["workload"]["source"] == "heldout"
    assert {"hardware", "cpus", "load_average"} <= set(doc["machine"]) and doc["versions"]["quickdraft"]
    assert len(doc["requests"]) == 12
    md = (tmp_path / "run.md").read_text()
    assert md.startswith("| config | load |") and "| fake | c=3 |" in md
    assert "| fake | c=3 |" in capsys.readouterr().out


def test_bench_run_refuses_bad_arguments(capsys):
    from quickdraft.cli import main

    assert main(["bench", "run", "--requests", "3"]) == 2  # neither --server nor --serve
    assert main(["bench", "run", "--server", "10.0.0.1:50051", "--requests", "3"]) == 2
    assert main(["bench", "run", "--server", "127.0.0.1:1", "--cancel-share", "2"]) == 2
    err = capsys.readouterr().err
    assert "--server HOST:PORT or --serve" in err and "loopback" in err and "cancel_share" in err
