"""Fail fast on the H200 before the long tune run: import what the engine
imports and build vLLM's engine config (no GPU work) for one parallel and one
autoregressive config. Usage: python3 -P scripts/h200/preflight.py CONFIG.toml"""

import importlib
import sys
import time

from quickdraft.server.config import load_config
from quickdraft.server.engine import Engine
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.vllm_live import check_supported

t0 = time.monotonic()
for name in ("vllm.entrypoints.chat_utils", "vllm.v1.engine.async_llm", "vllm.v1.engine.core",
             "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.qwen3_moe",
             "vllm.model_executor.models.llama_eagle3", "vllm.v1.spec_decode.eagle",
             "vllm.v1.attention.backends.flash_attn"):
    importlib.import_module(name)
cfg = load_config(sys.argv[1])
cfg.validate()
check_supported()
for spec, live in ((SpecConfig(True, 5), True), (SpecConfig(True, 5), False), (SpecConfig(False, 3), False), (SpecConfig.off(), False)):
    Engine(cfg, spec, live).engine_args().create_engine_config()
    print("engine config ok:", spec.label(), "live" if live else "static", flush=True)
print(f"preflight ok in {time.monotonic() - t0:.1f} s")
