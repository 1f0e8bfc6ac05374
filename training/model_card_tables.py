"""The generated parts of quickdraft/models/embedded/MODEL_CARD.md.

    python -m training.model_card_tables            # print the generated sections
    python -m training.model_card_tables --write    # replace them in the card
    python -m training.model_card_tables --check    # exit 1 if the card is stale

Sections sit between `<!-- generated: NAME -->` and `<!-- end: NAME -->` markers:

- `facts`: a JSON block with every shipped file's size, parameter counts from
  the safetensors headers, the config fields the card talks about and the
  tokenizer's special tokens (tests/test_model_card.py checks it, and the
  tables, against the files);
- `sizes`: the size table;
- `train-data`, `held-out`, `skipped`: tables from training/results/data_manifest.json.

Only the standard library is used, so it runs anywhere in a second.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = ROOT / "quickdraft" / "models" / "embedded"
CARD = EMBEDDED / "MODEL_CARD.md"
MANIFEST = ROOT / "training" / "results" / "data_manifest.json"
LIMIT_BYTES = 24_000_000  # 24 MB (decimal)

CONFIG_FIELDS = (
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)
DRAFTER_FIELDS = ("draft_vocab_size", "target_hidden_size", "ptd_token_id")

WHAT = {
    "target/model.safetensors": "target weights (Qwen3ForCausalLM)",
    "target/config.json": "target config",
    "target/generation_config.json": "stop tokens for generation",
    "target/tokenizer.json": "byte-level BPE tokenizer",
    "target/tokenizer_config.json": "tokenizer config for transformers/vLLM",
    "target/special_tokens_map.json": "special tokens for transformers",
    "drafter-p-eagle/model.safetensors": "P-EAGLE drafter weights (incl. `mask_hidden`)",
    "drafter-p-eagle/config.json": "P-EAGLE config (vLLM reads it)",
    "drafter-p-eagle/quickdraft_drafter.json": "P-EAGLE config for training/eagle3.py",
    "drafter-eagle3/model.safetensors": "EAGLE-3 drafter weights",
    "drafter-eagle3/config.json": "EAGLE-3 config (vLLM reads it)",
    "drafter-eagle3/quickdraft_drafter.json": "EAGLE-3 config for training/eagle3.py",
}


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def param_count(path: Path) -> int:
    total = 0
    for t in safetensors_header(path).values():
        count = 1
        for s in t["shape"]:
            count *= s
        total += count
    return total


def model_files() -> list[Path]:
    return sorted(p for p in EMBEDDED.rglob("*") if p.is_file() and p != CARD)


def facts() -> dict:
    files = {}
    for p in model_files():
        rel = p.relative_to(EMBEDDED).as_posix()
        entry = {"bytes": p.stat().st_size}
        if p.suffix == ".safetensors":
            entry["params"] = param_count(p)
            entry["dtypes"] = sorted({t["dtype"] for t in safetensors_header(p).values()})
        files[rel] = entry
    out = {
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files.values()),
        "limit_bytes": LIMIT_BYTES,
    }
    for name in ("target", "drafter-p-eagle", "drafter-eagle3"):
        cfg = json.loads((EMBEDDED / name / "config.json").read_text())
        keep = CONFIG_FIELDS + (DRAFTER_FIELDS if name != "target" else ())
        sec = {k: cfg[k] for k in keep if k in cfg}
        if name != "target":
            sec["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
            sec["parallel_slots"] = cfg.get("quickdraft", {}).get("parallel_slots", 0)
        out[name] = sec
    tok = json.loads((EMBEDDED / "target" / "tokenizer.json").read_text())
    out["tokenizer"] = {
        "model": tok["model"]["type"],
        "pre_tokenizer": tok["pre_tokenizer"]["type"],
        "vocab_size": len(tok["model"]["vocab"]),
        "merges": len(tok["model"]["merges"]),
        "special_tokens": {a["content"]: a["id"] for a in tok["added_tokens"] if a.get("special")},
    }
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f}"


def section_facts() -> str:
    """JSON, one file or one section per line (readable in the card, diffable)."""
    f = facts()
    lines = ['{', ' "files": {']
    items = list(f["files"].items())
    for i, (rel, e) in enumerate(items):
        lines.append(f"  {json.dumps(rel)}: {json.dumps(e)}" + ("," if i < len(items) - 1 else ""))
    lines.append(" },")
    rest = [k for k in f if k != "files"]
    for i, k in enumerate(rest):
        lines.append(f" {json.dumps(k)}: {json.dumps(f[k])}" + ("," if i < len(rest) - 1 else ""))
    lines.append("}")
    text = "\n".join(lines)
    assert json.loads(text) == f
    return "```json\n" + text + "\n```"


def section_sizes() -> str:
    f = facts()
    rows = ["| file | bytes | MB | parameters | what |", "|---|---:|---:|---:|---|"]
    for rel, e in f["files"].items():
        params = f"{e['params']:,}" if "params" in e else ""
        rows.append(f"| `{rel}` | {e['bytes']:,} | {_mb(e['bytes'])} | {params} | {WHAT.get(rel, '')} |")
    total_params = sum(e.get("params", 0) for e in f["files"].values())
    rows.append(f"| **total** | **{f['total_bytes']:,}** | **{_mb(f['total_bytes'])}** | **{total_params:,}** | limit {LIMIT_BYTES / 1e6:.0f} MB |")
    return "\n".join(rows)


ROLES = {
    "<|endoftext|>": "end of text; EOS and padding",
    "<|fim_prefix|>": "fill-in-the-middle: code before the cursor",
    "<|fim_middle|>": "fill-in-the-middle: the completion follows",
    "<|fim_suffix|>": "fill-in-the-middle: code after the cursor",
    "<|fim_pad|>": "fill-in-the-middle padding (a stop token)",
    "<|repo_name|>": "repository-level prompt: repository name",
    "<|file_sep|>": "repository-level prompt: next file",
    "<|im_start|>": "chat turn start",
    "<|im_end|>": "chat turn end (a stop token)",
    "<|draft_slot|>": "P-EAGLE slot token (`ptd_token_id`); quickdraft's own, not Qwen's",
}


def section_tokens() -> str:
    f = facts()["tokenizer"]
    gen = json.loads((EMBEDDED / "target" / "generation_config.json").read_text())
    stops = set(gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]])
    rows = ["| token | id | stops generation | role |", "|---|---:|---|---|"]
    for tok, i in sorted(f["special_tokens"].items(), key=lambda x: x[1]):
        esc = tok.replace("|", "\\|")  # GFM splits table cells at "|", even in code spans
        rows.append(f"| `{esc}` | {i} | {'yes' if i in stops else ''} | {ROLES.get(tok, '')} |")
    return "\n".join(rows)


ARCH_ROWS = (
    ("class", "architectures"),
    ("decoder layers", "num_hidden_layers"),
    ("hidden size", "hidden_size"),
    ("MLP intermediate size", "intermediate_size"),
    ("attention heads (query)", "num_attention_heads"),
    ("key/value heads", "num_key_value_heads"),
    ("head dim", "head_dim"),
    ("vocabulary", "vocab_size"),
    ("draft vocabulary", "draft_vocab_size"),
    ("target layers read (aux hidden states)", "eagle_aux_hidden_state_layer_ids"),
    ("parallel slots (drafts per pass - 1)", "parallel_slots"),
    ("slot token id", "ptd_token_id"),
    ("context (positions)", "max_position_embeddings"),
)


def section_architecture() -> str:
    f = facts()
    names = ("target", "drafter-p-eagle", "drafter-eagle3")

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, list):
            return ", ".join(str(x) for x in v)
        if isinstance(v, bool):
            return "yes" if v else "no"
        return str(v)

    rows = ["| | target | P-EAGLE drafter | EAGLE-3 drafter |", "|---|---|---|---|"]
    for label, key in ARCH_ROWS:
        rows.append(f"| {label} (`{key}`) | " + " | ".join(cell(f[n].get(key)) for n in names) + " |")
    params = [f["files"][f"{n}/model.safetensors"]["params"] for n in names]
    rows.append("| parameters | " + " | ".join(f"{p:,}" for p in params) + " |")
    return "\n".join(rows)


def _manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def section_train_data() -> str:
    m = _manifest()
    rows = ["| distribution | licence (as its metadata declares it) | files | chars |", "|---|---|---:|---:|"]
    for name, d in sorted(m["train_distributions"].items()):
        rows.append(f"| {name} | {d['license']} | {d['files']:,} | {d['chars']:,} |")
    s = m["stats"]
    rows.append(f"| **{s['train_distributions']} distributions** | | **{s['train_files']:,}** | **{s['train_chars']:,}** |")
    return "\n".join(rows)


def section_held_out() -> str:
    m = _manifest()
    rows = ["| distribution | licence | files |", "|---|---|---:|"]
    for name, d in sorted(m["held_out_distributions"].items()):
        rows.append(f"| {name} | {d['license']} | {d['files']:,} |")
    s = m["stats"]
    rows.append(f"| **{len(m['held_out_distributions'])} distributions** | | **{s['held_out_files']:,}** ({s['held_out_chars']:,} chars) |")
    return "\n".join(rows)


def section_skipped() -> str:
    m = _manifest()
    rows = ["| distribution | why it was left out |", "|---|---|"]
    for name, why in sorted(m["skipped"].items()):
        rows.append(f"| {name} | {why} |")
    return "\n".join(rows)


SECTIONS = {
    "facts": section_facts,
    "sizes": section_sizes,
    "tokens": section_tokens,
    "architecture": section_architecture,
    "train-data": section_train_data,
    "held-out": section_held_out,
    "skipped": section_skipped,
}


def render_into(text: str) -> str:
    for name, fn in SECTIONS.items():
        pattern = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n).*?(<!-- end: {re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{CARD}: no markers for section {name!r}")
        body = fn()
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="replace the generated sections in the card")
    g.add_argument("--check", action="store_true", help="exit 1 if the card's generated sections are stale")
    args = ap.parse_args(argv)
    if args.write or args.check:
        old = CARD.read_text()
        new = render_into(old)
        if args.check:
            if new != old:
                print(f"{CARD} is stale: run python -m training.model_card_tables --write", file=sys.stderr)
                return 1
            return 0
        CARD.write_text(new)
        return 0
    for name, fn in SECTIONS.items():
        print(f"<!-- generated: {name} -->\n{fn()}\n<!-- end: {name} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
