"""The embedded model's MODEL_CARD.md describes the files that are shipped.

Reads the card's machine-readable facts block and its tables and compares them
with the files: sizes, parameter counts from the safetensors headers, config
fields, the tokenizer's special tokens, and the training data manifest. No
engine, no torch: JSON and safetensors headers only.
"""

from __future__ import annotations

import json
import re
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = ROOT / "quickdraft" / "models" / "embedded"
CARD = EMBEDDED / "MODEL_CARD.md"
MANIFEST = ROOT / "training" / "results" / "data_manifest.json"
LIMIT_BYTES = 24_000_000  # the 24 MB
MODELS = ("target", "drafter-p-eagle", "drafter-eagle3")


# ---------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def card() -> str:
    return CARD.read_text()


def section(card: str, name: str) -> str:
    m = re.search(rf"<!-- generated: {re.escape(name)} -->\n(.*?)<!-- end: {re.escape(name)} -->", card, re.S)
    assert m, f"MODEL_CARD.md has no generated section {name!r}"
    assert m.group(1).strip(), f"section {name!r} is empty: run python -m training.model_card_tables --write"
    return m.group(1)


@pytest.fixture(scope="module")
def facts(card) -> dict:
    m = re.search(r"```json\n(.*?)\n```", section(card, "facts"), re.S)
    assert m, "facts section has no ```json block"
    return json.loads(m.group(1))


def table_rows(text: str) -> list[list[str]]:
    """Cells of each markdown table row, header and separator rows dropped.
    Splits at unescaped '|' and unescapes '\\|' (GFM)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if all(re.fullmatch(r":?-+:?", c) for c in cells if c):
            continue
        rows.append(cells)
    return rows[1:]  # header


def num(cell: str) -> int:
    return int(cell.strip("*").replace(",", ""))


def header(path: Path) -> dict:
    """Tensor name -> dtype and shape, read by the safetensors library (not by
    the card's generator, so a bug there cannot hide itself here)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: {"dtype": f.get_slice(k).get_dtype(), "shape": list(f.get_slice(k).get_shape())} for k in f.keys()}


def params(path: Path) -> int:
    return sum(math.prod(t["shape"]) for t in header(path).values())


def config(name: str) -> dict:
    return json.loads((EMBEDDED / name / "config.json").read_text())


def shipped_files() -> dict[str, int]:
    return {p.relative_to(EMBEDDED).as_posix(): p.stat().st_size for p in sorted(EMBEDDED.rglob("*")) if p.is_file() and p != CARD}


# ---------------------------------------------------------------- sizes


def test_facts_list_every_shipped_file_with_its_size(facts):
    on_disk = shipped_files()
    assert set(facts["files"]) == set(on_disk), "files in the card and on disk differ"
    for rel, size in on_disk.items():
        assert facts["files"][rel]["bytes"] == size, rel
    assert facts["total_bytes"] == sum(on_disk.values())


def test_total_is_within_24_mb(facts):
    assert facts["limit_bytes"] == LIMIT_BYTES
    assert sum(shipped_files().values()) <= LIMIT_BYTES
    # The card ships in the same folder (package data); it counts too.
    assert sum(p.stat().st_size for p in EMBEDDED.rglob("*") if p.is_file()) <= LIMIT_BYTES


def test_size_table_matches_files(card):
    on_disk = shipped_files()
    rows = table_rows(section(card, "sizes"))
    total = [r for r in rows if r[0] == "**total**"]
    files = {r[0].strip("`"): r for r in rows if r[0] != "**total**"}
    assert set(files) == set(on_disk)
    for rel, size in on_disk.items():
        _, b, mb, p, _ = files[rel]
        assert num(b) == size, rel
        assert float(mb) == round(size / 1e6, 3), rel
        if rel.endswith(".safetensors"):
            assert num(p) == params(EMBEDDED / rel), rel
        else:
            assert p == "", rel
    assert len(total) == 1
    all_bytes = sum(on_disk.values())
    assert num(total[0][1]) == all_bytes
    assert float(total[0][2].strip("*")) == round(all_bytes / 1e6, 3)
    assert num(total[0][3]) == sum(params(EMBEDDED / m / "model.safetensors") for m in MODELS)


def test_param_counts_and_dtypes_from_safetensors_headers(facts):
    for m in MODELS:
        path = EMBEDDED / m / "model.safetensors"
        entry = facts["files"][f"{m}/model.safetensors"]
        assert entry["params"] == params(path), m
        assert entry["dtypes"] == sorted({t["dtype"] for t in header(path).values()}) == ["BF16"], m
    # The prose rounds these: 8.0M target, drafters below 2M.
    assert round(facts["files"]["target/model.safetensors"]["params"] / 1e6, 1) == 8.0


# ---------------------------------------------------------------- configs


# Which config fields the card's architecture table shows (the values are checked against the files).
from training.model_card_tables import CONFIG_FIELDS as CONFIG_KEYS  # noqa: E402


@pytest.mark.parametrize("name", MODELS)
def test_config_facts_match_config_json(facts, name):
    cfg, f = config(name), facts[name]
    for key in CONFIG_KEYS:
        assert f[key] == cfg[key], (name, key)
    if name != "target":
        assert f["draft_vocab_size"] == cfg["draft_vocab_size"] == cfg["vocab_size"]
        assert f["target_hidden_size"] == cfg["target_hidden_size"] == config("target")["hidden_size"]
        assert f["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert f["parallel_slots"] == cfg.get("quickdraft", {}).get("parallel_slots", 0)
        assert f.get("ptd_token_id") == cfg.get("ptd_token_id")


def test_architecture_table_matches_configs(card, facts):
    """Each row names its config key in backticks; compare the three columns."""
    rows = table_rows(section(card, "architecture"))
    seen = set()
    for row in rows:
        m = re.search(r"`(\w+)`", row[0])
        if row[0] == "parameters":
            for cell, name in zip(row[1:], MODELS):
                assert num(cell) == params(EMBEDDED / name / "model.safetensors"), name
            seen.add("parameters")
            continue
        assert m, row
        key = m.group(1)
        seen.add(key)
        for cell, name in zip(row[1:], MODELS):
            cfg = config(name)
            if key == "eagle_aux_hidden_state_layer_ids":
                value = cfg.get("eagle_config", {}).get(key)
            elif key == "parallel_slots":
                value = cfg.get("quickdraft", {}).get(key) if name != "target" else None
            else:
                value = cfg.get(key)
            if value is None:
                assert cell == "-", (key, name)
            elif isinstance(value, list):
                assert cell == ", ".join(map(str, value)), (key, name)
            else:
                assert cell == str(value), (key, name)
    assert {"num_hidden_layers", "hidden_size", "vocab_size", "draft_vocab_size", "ptd_token_id", "parameters"} <= seen


def test_drafter_checkpoints_match_their_configs():
    """P-EAGLE: two layers (midlayer + layers.1) and mask_hidden; EAGLE-3: one layer, no mask_hidden."""
    for name in ("drafter-p-eagle", "drafter-eagle3"):
        h = header(EMBEDDED / name / "model.safetensors")
        layers = {"midlayer"} | {k.split(".")[1] for k in h if k.startswith("layers.")}
        assert len(layers) == config(name)["num_hidden_layers"], name
        assert ("mask_hidden" in h) == (name == "drafter-p-eagle"), name
        assert not any("embed_tokens" in k or k.startswith("lm_head") for k in h), f"{name} should share the target's embedding and head"
        assert h["fc.weight"]["shape"] == [256, 3 * 256]
    assert config("drafter-p-eagle")["num_hidden_layers"] == 2
    assert config("drafter-eagle3")["num_hidden_layers"] == 1
    assert "ptd_token_id" not in config("drafter-eagle3")


# ---------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizer_json() -> dict:
    return json.loads((EMBEDDED / "target" / "tokenizer.json").read_text())


def test_tokenizer_facts(facts, tokenizer_json):
    t = facts["tokenizer"]
    assert t["model"] == tokenizer_json["model"]["type"] == "BPE"
    assert t["pre_tokenizer"] == tokenizer_json["pre_tokenizer"]["type"] == "ByteLevel"
    assert t["vocab_size"] == len(tokenizer_json["model"]["vocab"])
    assert t["merges"] == len(tokenizer_json["model"]["merges"])
    for name in MODELS:
        assert config(name)["vocab_size"] == t["vocab_size"], name
    # The card says: 10 special + 256 bytes + merges.
    assert t["vocab_size"] == len(t["special_tokens"]) + 256 + t["merges"]


def test_special_tokens_and_ids(card, facts, tokenizer_json):
    actual = {a["content"]: a["id"] for a in tokenizer_json["added_tokens"] if a.get("special")}
    assert facts["tokenizer"]["special_tokens"] == actual
    in_table = {row[0].strip("`"): int(row[1]) for row in table_rows(section(card, "tokens"))}
    assert in_table == actual
    for tok, i in actual.items():
        assert tokenizer_json["model"]["vocab"].get(tok) == i, tok
    # Every special token in the tokenizer config is one of them.
    tcfg = json.loads((EMBEDDED / "target" / "tokenizer_config.json").read_text())
    assert set(tcfg["additional_special_tokens"]) | {tcfg["eos_token"]} == set(actual)
    # The P-EAGLE slot token is <|draft_slot|>.
    assert config("drafter-p-eagle")["ptd_token_id"] == actual["<|draft_slot|>"] == facts["drafter-p-eagle"]["ptd_token_id"]


def test_stop_column_matches_generation_config(card):
    gen = json.loads((EMBEDDED / "target" / "generation_config.json").read_text())
    stops = set(gen["eos_token_id"])
    for row in table_rows(section(card, "tokens")):
        assert (row[2] == "yes") == (int(row[1]) in stops), row


# ---------------------------------------------------------------- data


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def test_every_training_distribution_is_listed_with_its_licence(card, manifest):
    rows = table_rows(section(card, "train-data"))
    listed = {r[0]: r for r in rows if not r[0].startswith("**")}
    assert set(listed) == set(manifest["train_distributions"])
    for name, d in manifest["train_distributions"].items():
        _, lic, files, chars = listed[name]
        assert lic == d["license"], name
        assert num(files) == d["files"] and num(chars) == d["chars"], name
    total = [r for r in rows if r[0].startswith("**")]
    s = manifest["stats"]
    assert len(total) == 1
    assert total[0][0] == f"**{s['train_distributions']} distributions**"
    assert num(total[0][2]) == s["train_files"] == sum(d["files"] for d in manifest["train_distributions"].values())
    assert num(total[0][3]) == s["train_chars"] == sum(d["chars"] for d in manifest["train_distributions"].values())


def test_held_out_distributions_are_listed_and_disjoint(card, manifest):
    rows = table_rows(section(card, "held-out"))
    listed = {r[0]: r[1] for r in rows if not r[0].startswith("**")}
    assert listed == {k: v["license"] for k, v in manifest["held_out_distributions"].items()}
    assert sorted(listed) == manifest["stats"]["held_out_distributions"]
    assert not set(listed) & set(manifest["train_distributions"])


def test_skipped_distributions_are_listed(card, manifest):
    rows = table_rows(section(card, "skipped"))
    assert {r[0]: r[1] for r in rows} == manifest["skipped"]


def test_prose_summary_matches_manifest(card, manifest):
    s = manifest["stats"]
    assert f"{s['train_distributions']} distributions, {s['train_files']:,} files, {s['train_chars']:,} characters" in card
    assert f"{len(manifest['skipped'])} installed distributions were left out" in card
