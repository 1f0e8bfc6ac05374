"""Byte-level BPE tokenizer (the `tokenizers` library) with Qwen3-Coder's special tokens.

The special tokens come first (ids 0..9, in quickdraft.prompt_format order), so
prompts rendered for Qwen3-Coder tokenize here with the same structure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from quickdraft.prompt_format import DRAFT_SLOT, ENDOFTEXT, SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    """tokenizer.json plus the config files transformers and vLLM read."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "unk_token": None,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != ENDOFTEXT],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT, "additional_special_tokens": config["additional_special_tokens"]}, indent=2)
        + "\n"
    )


def special_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    assert ids[ENDOFTEXT] == 0 and ids[DRAFT_SLOT] == len(SPECIAL_TOKENS) - 1, ids
    return ids
