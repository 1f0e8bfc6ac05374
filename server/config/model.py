"""[model]: what to serve."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    """What to serve: a preset (a target/drafter pair) and overrides of its parts."""

    preset: str = "embedded"
    """Named model/drafter pair (see Presets above): embedded,
    qwen3-coder-30b-p-eagle, gpt-oss-20b-p-eagle, gpt-oss-120b-p-eagle, or
    "custom" (then `target` is required)."""
    target: str | None = None
    """Target model: local directory or Hugging Face id. None: the preset's."""
    drafter: str | None = None
    """EAGLE-3 / P-EAGLE drafter: directory or id. None: the preset's."""
    parallel_drafter: str | None = None
    """Drafter used when parallel drafting is on, if it differs from
    `drafter` (the embedded preset ships one of each). None: the preset's."""
    dtype: str = "auto"
    """Weights/activations dtype for vLLM: auto (on CPU the preset's: float32
    for the embedded model, bfloat16 for smollm2-135m-base; the checkpoint's on
    GPU), float32, bfloat16, float16."""
    max_model_len: int | None = None
    """Context window in tokens (prompt + completion). None: the preset's."""
    load_format: str = "auto"
    """vLLM load format; "dummy" serves random weights (timing studies only)."""
    revision: str | None = None
    """Model revision when `target` is a hub id. None: the default branch."""
    tokenizer: str | None = None
    """Tokenizer directory or id. None: the target's. Set it when the target
    directory holds only a config.json (load_format = "dummy")."""
