"""Does a K=0 range in a per-batch-size schedule cost what no speculation costs?

    .venv/bin/python bench/experiments/zero_k_schedule.py      (about 4 minutes on 2 cores)

Autoregressive K=3 with the schedule 1-2:K3, 3-16:K0, against speculation off
and plain K=3, at 1 and 8 concurrent streams, one engine after another in one
process (quickdraft tune's EngineMeasure). The answer (vLLM 0.32 CPU) is in
docs/vllm-notes.md: no, 1.52x off's TPOT at 8 streams.
"""
import statistics

from quickdraft.bench.tune import EngineMeasure
from quickdraft.bench.workload import load_prompts
from quickdraft.server.config import load_config
from quickdraft.server.speculative import SpecConfig

SETTINGS = {
    "off": SpecConfig.off(),
    "ar3": SpecConfig(False, 3),
    "ar3+K0@3+": SpecConfig.scheduled(False, ((1, 2, 3), (3, 16, 0))),
}


def main() -> None:
    cfg = load_config(env={})
    cfg.validate()
    m = EngineMeasure(cfg, load_prompts(48), 24, 48)
    out = {}
    try:
        for label, spec in SETTINGS.items():
            for c in (1, 8):
                obs = m(spec, c)
                out[(label, c)] = statistics.median(o.tpot_s for o in obs) * 1000
                print(label, c, f"{out[(label, c)]:.2f} ms", flush=True)
    finally:
        m.close()
    for c in (1, 8):
        print(f"c={c}: ar3+K0 / off = {out[('ar3+K0@3+', c)] / out[('off', c)]:.3f}, ar3+K0 / ar3 = {out[('ar3+K0@3+', c)] / out[('ar3', c)]:.3f}")


if __name__ == "__main__":
    main()
