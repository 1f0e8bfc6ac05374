"""Shared test settings. Integration fixtures live in tests/integration/conftest.py."""

import os

# vLLM's CPU build reads these at engine start; keep tests small and offline.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
