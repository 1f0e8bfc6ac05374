"""``quickdraft tune``: the calibration sweep on this machine.

For every candidate config (off, autoregressive and parallel K in {1,3,5,7})
an in-process engine serves held-out completion prompts
(bench/data/heldout_prompts.jsonl) at concurrency 1, 4, 8 and 16 (closed
loop, greedy), after an unrecorded warm-up round per level; the requests
become controller observations. The controller's models are fitted on them
(server/controller/calibrate.py), the tuned profile is written where
``quickdraft serve --controller`` looks for it (same hardware, model, drafters
and vLLM version), and a plot of TPOT and TTFT against K per mode and
concurrency is saved.

It lives with the benchmarks because it is one: it measures engines on the
benchmark prompts. The server only reads the profile it writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from quickdraft.bench.workload import load_prompts
from quickdraft.server.config import load_config
from quickdraft.server.controller import Controller, Observation, run_sweep
from quickdraft.server.controller_loop import controller_settings, profile_key, profile_store
from quickdraft.server.engine import Engine
from quickdraft.server.preparation import Sampling
from quickdraft.server.prompt_tokens import tokenize
from quickdraft.server.service import speculative_stats
from quickdraft.server.speculative import SpecConfig
from quickdraft.v1 import completion_pb2 as pb

log = logging.getLogger("quickdraft.tune")


class EngineMeasure:
    """measure(spec, concurrency) -> observations, reusing one engine per
    setting (any setting, a per-batch-size K schedule included)."""

    def __init__(self, cfg, prompts: list[dict], requests_per_level: int, max_tokens: int, warmup_rounds: int = 1,
                 on_engine_ready: Callable[[float], None] | None = None):
        self.cfg = cfg
        self.on_engine_ready = on_engine_ready  # called with each engine's start time, seconds
        self.prompts = prompts
        self.requests = requests_per_level
        self.max_tokens = max_tokens
        # Unrecorded rounds of `concurrency` requests before each level: the first
        # batch of a new shape pays for JIT-compiled kernels (Triton on CUDA),
        # which belongs to warm-up, not to the level's TTFT.
        self.warmup_rounds = warmup_rounds
        self.loop = asyncio.new_event_loop()
        self.engine: Engine | None = None

    def __call__(self, spec: SpecConfig, concurrency: int) -> list[Observation]:
        return self.loop.run_until_complete(self._measure(spec, concurrency))

    async def _measure(self, spec: SpecConfig, concurrency: int) -> list[Observation]:
        if self.engine is None or self.engine.spec != spec:
            await self._close_engine()
            self.engine = await Engine.start(self.cfg, spec)
            print(f"engine {spec.label()} ready in {self.engine.start_seconds:.1f} s", flush=True)
            if self.on_engine_ready is not None:
                self.on_engine_ready(self.engine.start_seconds)
        engine = self.engine
        sampling = Sampling(max_tokens=self.max_tokens, temperature=0.0, top_p=1.0, stop=[], seed=None).to_vllm(engine.stop_token_ids)
        ids = [
            tokenize(engine.prompt_tokens, pb.CompleteRequest(prefix=p["prefix"], **({"suffix": p["suffix"]} if p["suffix"] is not None else {})), self.cfg.preset.prompt_format)
            for p in self.prompts
        ]
        observations: list[Observation] = []
        warmup = iter(range(self.requests, self.requests + self.warmup_rounds * concurrency))
        counter = iter(range(self.requests))

        async def warm(w: int) -> None:
            for i in warmup:
                async for _ in engine.generate(f"tune-warmup-{w}-{i}-{time.monotonic_ns()}", ids[i % len(ids)], sampling):
                    pass

        await asyncio.gather(*(warm(w) for w in range(concurrency)))
        before = _counters(engine)

        async def worker(w: int) -> None:
            for i in counter:
                t0 = time.perf_counter()
                first = last = None
                n = 0
                metrics = None
                async for out in engine.generate(f"tune-{w}-{i}-{time.monotonic_ns()}", ids[i % len(ids)], sampling):
                    c = out.outputs[0]
                    if c.token_ids:
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        n += len(c.token_ids)
                    if c.finish_reason is not None:
                        metrics = getattr(c, "spec_decode_metrics", None)
                if n < 2:
                    continue
                stats = speculative_stats(metrics, engine.spec)
                observations.append(
                    Observation.from_speculative_stats(
                        stats, latency_class="inline", ttft_s=first - t0, tpot_s=(last - first) / (n - 1), output_tokens=n, batch_size=concurrency, prompt_tokens=len(ids[i % len(ids)])
                    )
                )

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        if engine.spec.enabled and observations and not any(o.num_drafts for o in observations):
            # vLLM < 0.32 has no per-request acceptance: hand the level's
            # engine-wide counts to its last observation (the controller pools counts).
            await asyncio.sleep(0.2)  # the last step's stats arrive after the last token
            drafts, draft_tokens, per_pos = _delta(before, _counters(engine))
            last = observations[-1]
            observations[-1] = dataclasses.replace(last, num_drafts=drafts, num_draft_tokens=draft_tokens, accepted_per_position=per_pos)
        return observations

    async def _close_engine(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
            # Let vLLM's output handler see its cancellation before the loop moves on or closes.
            await asyncio.sleep(0.1)

    def close(self) -> None:
        self.loop.run_until_complete(self._close_engine())
        self.loop.close()


def _counters(engine: Engine) -> tuple[int, int, list[int]]:
    s = engine.snapshot
    return s.drafts, s.draft_tokens, list(s.accepted_per_position)


def _delta(before, after) -> tuple[int, int, tuple[int, ...]]:
    per = [a - (before[2][i] if i < len(before[2]) else 0) for i, a in enumerate(after[2])]
    return after[0] - before[0], after[1] - before[1], tuple(per)


def write_json(path: Path, cfg, key, result) -> None:
    """The sweep as data: where it ran, every row, and the picks."""
    import json

    from quickdraft.server.engine import hardware_description, vllm_version

    doc = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hardware": hardware_description(),
        "vllm": vllm_version(),
        "profile_key": dataclasses.asdict(key),
        "target": cfg.target_path(),
        "load_format": cfg.model.load_format,
        "rejection_sample_method": cfg.speculation.rejection_sample_method,
        "rows": [r.to_dict() for r in result.rows],
        "pick_per_concurrency": {str(c): label for c, label in sorted(result.best.items())},
        "start_config": result.start.label(),
        "failed": result.failed,
        "observations": [o.to_dict() for o in result.observations],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def add_subparser(sub) -> None:
    p = sub.add_parser("tune", help="calibration sweep: measure every speculative config here and write the controller's profile")
    p.add_argument("--config", help="TOML configuration file (model, engine, controller sections)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--concurrency", default="1,4,8,16", help="comma-separated concurrency levels")
    p.add_argument("--requests", type=int, default=24, help="requests per config and concurrency level")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--warmup-rounds", type=int, default=1, help="unrecorded rounds of `concurrency` requests before each level")
    p.add_argument("--configs", default="", help="e.g. 'off,parallel K=5,autoregressive K=3' (default: all candidates)")
    p.add_argument("--plot", type=Path, default=Path("bench/results/tune.png"))
    p.add_argument("--json", type=Path, default=None, help="also write the measurements and the picks per concurrency as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    logging.basicConfig(level="WARNING")
    cfg = load_config(args.config, overrides=dict(item.split("=", 1) for item in args.set))
    cfg.validate()
    key, store = profile_key(cfg), profile_store(cfg)
    ctl = Controller(controller_settings(cfg))
    configs = [SpecConfig.parse(c) for c in args.configs.split(",")] if args.configs else None
    starts: list[float] = []

    def engine_ready(seconds: float) -> None:
        # what a rebuild costs on this machine, saved with the profile
        starts.append(seconds)
        ctl.rebuild.seconds = statistics.median(starts)

    measure = EngineMeasure(cfg, load_prompts(48), args.requests, args.max_tokens, args.warmup_rounds,
                            on_engine_ready=engine_ready)
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = run_sweep(measure, controller=ctl, configs=configs, concurrencies=[int(c) for c in args.concurrency.split(",")], store=store, key=key, plot_path=args.plot)
    finally:
        measure.close()
    print(result.table())
    print("\ncontroller's pick per concurrency (lowest predicted TPOT within the TTFT SLO):")
    for c, label in sorted(result.best.items()):
        print(f"  concurrency {c}: {label}")
    if args.json:
        write_json(args.json, cfg, key, result)
        print(f"json: {args.json}")
    print(f"\nstart config: {result.start.label()}")
    print(f"profile: {result.profile_path}")
    print(f"plot: {result.plot_path or result.plot_skipped}")
    for failure in result.failed:
        print(f"failed: {failure}")
    return 0 if not result.failed else 1
