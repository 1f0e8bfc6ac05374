"""FIM + repository-context LoRA fine-tune of SmolLM2-135M (issue 27).

    python -m training.smollm2_fim --base DIR --out DIR [--seconds S] [--rank R]
    python -m training.smollm2_fim --smoke --out /tmp/smk        # tiny random base, CPU, seconds

The base is the folder ``quickdraft model build smollm2-135m-base`` makes
(server/model_cache.py). What ships is a delta, not a model: LoRA factors
of every linear layer, the RMSNorm weights, and the rows of the tokens this
module adds. ``model_cache.merge_delta`` applies it at install time.

Tokens. SmolLM2's vocabulary has ``<repo_name>`` and ``<file_sep>`` but no
FIM tokens. We add Qwen-Coder's strings (quickdraft.prompt_format), so the
model speaks the server's "qwen-fim" format: the server, the bridge and the
sample builders need no second format, and a prompt for Qwen3-Coder-30B works
unchanged. ``<|repo_name|>`` and ``<|file_sep|>`` start from SmolLM2's own
``<repo_name>``/``<file_sep>`` rows (same role, learnt in pretraining); the
FIM tokens and the drafter's slot token start from the mean embedding.

Data: the old mix (training/samples.py: FIM, repository level, plain) and
context samples (training/context_samples.py: the bridge's own prompt around a
hole), half each, from the installed packages' permissive sources
(training/corpus.py), the held-out distributions excluded and used for the
held-out losses.

Loss on the middles, their end and the text outside FIM samples; a FIM
prompt's own tokens weigh ``--prompt-loss-weight`` (0 by default,
``LossTargets``), and the added tokens never count. Those only ever appear in prompts, so
the model reads them and never writes them: with loss on them it learns where
a prompt puts ``<|fim_suffix|>`` (after any prefix, at a line's end) and then,
given a plain prompt such as ``def fibonacci(n):\n``, answers with it (a stop
token: an empty completion). Old-mix FIM samples with an empty middle are left
out: ``samples.split_middle`` makes them mostly from a cursor on a blank line,
with the suffix repeating that line's break, which teaches an empty answer at
the line start where the bridge asks for a line.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from quickdraft.prompt_format import (DRAFT_SLOT, ENDOFTEXT, FILE_SEP, FIM_MIDDLE, FIM_PAD, FIM_PREFIX, FIM_SUFFIX, REPO_NAME,
                                      CodeContext, render, stop_token_ids)
from training.context_samples import ensure_bridge

ensure_bridge()  # quickdraft.server from a plain checkout (PYTHONPATH=repo root), as on the GPU machine
from quickdraft.server import model_cache  # noqa: E402

ADDED_TOKENS: tuple[str, ...] = (FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME, FILE_SEP, DRAFT_SLOT)
# New token -> the SmolLM2 token whose embedding it starts from.
INIT_FROM = {REPO_NAME: "<repo_name>", FILE_SEP: "<file_sep>"}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# SmolLM2's own special tokens (ids 0-5), for the tiny smoke base.
SMOLLM2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>")


class LoRALinear(nn.Module):
    """y = W x + (alpha / r) B A x, W frozen; B starts at zero so training starts at the base."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.rank, self.scale = rank, alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=torch.float32))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.to(x.dtype).T @ self.lora_B.to(x.dtype).T) * self.scale


class Adapter:
    """The trainable part of a model prepared by :func:`prepare`."""

    def __init__(self, model: nn.Module, rank: int, alpha: float, base_vocab: int, added: list[int], train_norms: bool) -> None:
        self.model, self.rank, self.alpha = model, rank, alpha
        self.base_vocab, self.added = base_vocab, added
        self.lora: dict[str, LoRALinear] = {}
        self.norms: dict[str, nn.Parameter] = {}
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if child_name in LORA_TARGETS and isinstance(child, nn.Linear):
                    wrapped = LoRALinear(child, rank, alpha).to(child.weight.device)
                    setattr(module, child_name, wrapped)
                    self.lora[f"{name}.{child_name}.weight"] = wrapped
        for p in model.parameters():
            p.requires_grad_(False)
        for w in self.lora.values():
            w.lora_A.requires_grad_(True)
            w.lora_B.requires_grad_(True)
        if train_norms:
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.requires_grad_(True)
                    self.norms[name] = p
        emb = model.get_input_embeddings().weight
        emb.requires_grad_(True)
        keep = torch.zeros(emb.shape[0], 1, device=emb.device, dtype=emb.dtype)
        keep[base_vocab:] = 1
        # Only the added rows learn: the base rows get no gradient, and with
        # weight decay 0 AdamW leaves them exactly as they were.
        emb.register_hook(lambda g: g * keep)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        lora = [p for w in self.lora.values() for p in (w.lora_A, w.lora_B)]
        return [{"params": lora, "weight_decay": 0.0, "lr": lr},
                {"params": list(self.norms.values()), "weight_decay": 0.0, "lr": lr * 0.1},
                {"params": [self.model.get_input_embeddings().weight], "weight_decay": 0.0, "lr": lr}]

    def delta(self, dtype: torch.dtype = torch.float16) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(delta.json, delta.safetensors tensors) in model_cache's format. Names are the merged model's
        (the wrapper's ``.base`` left out)."""
        tensors: dict[str, torch.Tensor] = {}
        for name, w in self.lora.items():
            tensors[f"{name}.lora_A"] = w.lora_A.detach().to(dtype).cpu().contiguous()
            tensors[f"{name}.lora_B"] = w.lora_B.detach().to(dtype).cpu().contiguous()
        for name, p in self.norms.items():
            tensors[f"{name}.full"] = p.detach().float().cpu().contiguous()
        emb = self.model.get_input_embeddings().weight
        tensors["added_embeddings"] = emb[self.base_vocab :].detach().float().cpu().contiguous()
        spec = {"format": model_cache.DELTA_FORMAT, "rank": self.rank, "alpha": self.alpha, "lora": sorted(self.lora),
                "full": sorted(self.norms), "added_tokens": [{"content": t, "id": i} for t, i in zip(ADDED_TOKENS, self.added)]}
        return spec, tensors


def prepare(model: nn.Module, tokenizer: Any, rank: int = 16, alpha: float = 32.0, train_norms: bool = True) -> Adapter:
    """Add the FIM tokens (rows initialised as INIT_FROM says, else the mean) and LoRA to every linear layer."""
    base_vocab = len(tokenizer)
    emb_rows = model.get_input_embeddings().weight.shape[0]
    if emb_rows != base_vocab:
        raise ValueError(f"the embedding has {emb_rows} rows but the tokenizer {base_vocab} tokens")
    init = [tokenizer.convert_tokens_to_ids(INIT_FROM[t]) if t in INIT_FROM else None for t in ADDED_TOKENS]
    added = model_cache.add_tokens(tokenizer, ADDED_TOKENS)
    model.resize_token_embeddings(base_vocab + len(added), mean_resizing=False)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        mean = emb[:base_vocab].mean(0)
        for row, src in zip(added, init):
            emb[row] = emb[src] if src is not None else mean
    return Adapter(model, rank, alpha, base_vocab, added, train_norms)


def export(adapter: Adapter, out: Path, meta: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    spec, tensors = adapter.delta()
    with torch.no_grad():  # the adapter takes the stored (rounded) factors: what is measured after is what ships
        for name, w in adapter.lora.items():
            w.lora_A.copy_(tensors[f"{name}.lora_A"].float())
            w.lora_B.copy_(tensors[f"{name}.lora_B"].float())
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / model_cache.DELTA_WEIGHTS), metadata={"format": "pt"})
    (out / model_cache.DELTA_CONFIG).write_text(json.dumps({**spec, **meta}, indent=1) + "\n")
    return out


# --- data ------------------------------------------------------------------------------


def texts_for(dist_files: dict[str, list[tuple[str, str]]], roots: list[str], *, ctx_seconds: float, workers: int, seed: int,
              budget_tokens: int, max_files: int | None = None, old_chars: int | None = None) -> tuple[list[str], list[str], dict]:
    """(old-mix texts, context-sample texts, stats) for these distributions."""
    from training import context_samples, corpus, samples

    # The bridge builds prompts to the preset's budget; context_samples reads this at call time (and forks after).
    context_samples.BUDGET_TOKENS = budget_tokens
    ctx, st = context_samples.build(dist_files, roots, seconds=ctx_seconds, workers=workers, seed=seed, max_files=max_files)
    old_files = corpus.cap(dist_files, old_chars, seed) if old_chars else dist_files
    old, dropped_old = drop_empty_middles(list(samples.samples(old_files, seed)))
    ctx, dropped_ctx = drop_empty_middles(ctx)
    return old, ctx, {"context": st, "old_mix_samples": len(old), "empty_middles_dropped": {"old_mix": dropped_old, "context": dropped_ctx}}


def drop_empty_middles(texts: list[str]) -> tuple[list[str], int]:
    """The texts without FIM samples whose middle is empty, and how many were dropped."""
    empty = FIM_MIDDLE + ENDOFTEXT
    kept = [t for t in texts if not t.endswith(empty)]
    return kept, len(texts) - len(kept)


def encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Ids with the prompt format's token strings as control tokens (as the server's raw path does)."""
    return [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]


def mix(old: torch.Tensor, ctx: torch.Tensor, ctx_share: float, seed: int) -> torch.Tensor:
    """Rows of both kinds, ``ctx_share`` of them context samples: the larger kind is cut down,
    as a run sees less than one pass over either (the old mix's plain and repository samples
    are what teach prefix-only prompts, and outnumbered they are lost)."""
    if len(ctx) == 0:
        return old
    n_old = min(len(old), int(len(ctx) * (1 - ctx_share) / ctx_share))
    n_ctx = min(len(ctx), int(round(n_old * ctx_share / (1 - ctx_share)))) if ctx_share < 1 else len(ctx)
    g = torch.Generator().manual_seed(seed)
    return torch.cat([old[torch.randperm(len(old), generator=g)[:n_old]], ctx[torch.randperm(len(ctx), generator=g)[:n_ctx]]])


# --- training --------------------------------------------------------------------------


@dataclass(frozen=True)
class LossTargets:
    """Which next-token targets the loss counts, and how much.

    A context sample is some 1,500 prompt tokens around a middle of a few
    dozen: with every token counted, the middle is about 1% of the loss and
    the model mostly relearns to continue code it already continues well,
    while what it lacks (what belongs between a prefix and a suffix) goes
    unlearnt. ``prompt_weight`` weighs the targets inside a FIM prompt
    (from ``<|fim_prefix|>`` to ``<|fim_middle|>``); the middle, its
    ``<|endoftext|>`` and text outside FIM samples (plain and repository
    samples) weigh 1. The added tokens are never targets (see the module
    docstring)."""

    ignore: torch.Tensor
    fim_prefix: int
    fim_middle: int
    end: int
    prompt_weight: float = 1.0

    @classmethod
    def of(cls, tokenizer: Any, ignore: torch.Tensor, prompt_weight: float = 1.0) -> "LossTargets":
        ids = tokenizer.convert_tokens_to_ids([FIM_PREFIX, FIM_MIDDLE, ENDOFTEXT])
        return cls(ignore, int(ids[0]), int(ids[1]), int(ids[2]), prompt_weight)

    def weights(self, targets: torch.Tensor) -> torch.Tensor:
        """[B, T] weights of the targets [B, T]."""
        b, t = targets.shape
        idx = torch.arange(t, device=targets.device).expand(b, t)

        def last(tok: int) -> torch.Tensor:
            return torch.where(targets == tok, idx, -1).cummax(dim=1).values

        def first(tok: int) -> torch.Tensor:
            return torch.where(targets == tok, idx, t).min(dim=1).values

        in_prompt = last(self.fim_prefix) > torch.maximum(last(self.fim_middle), last(self.end))
        # A packed row can begin inside a prompt: before its first marker, that is
        # the case exactly when the first marker is <|fim_middle|>.
        fp, fm, fe = first(self.fim_prefix), first(self.fim_middle), first(self.end)
        lead = (idx < torch.minimum(torch.minimum(fp, fm), fe).unsqueeze(1)) & (fm < torch.minimum(fp, fe)).unsqueeze(1)
        w = torch.where(in_prompt | lead, self.prompt_weight, 1.0)
        return w.masked_fill(torch.isin(targets, self.ignore), 0.0)


def lm_loss(model: nn.Module, batch: torch.Tensor, targets: LossTargets) -> torch.Tensor:
    """Weighted next-token cross-entropy over rows [B, T+1] (``LossTargets.weights``).

    The output head runs only where a target weighs something: with the prompts
    of context samples left out, that is a fraction of the positions, and the
    head (49k x 576) with its float32 logits is most of a step's memory."""
    target = batch[:, 1:]
    w = targets.weights(target)
    keep = w > 0
    hidden = model.get_decoder()(input_ids=batch[:, :-1]).last_hidden_state
    logits = model.get_output_embeddings()(hidden[keep])
    ce = F.cross_entropy(logits.float(), target[keep], reduction="none")
    return (ce * w[keep]).sum() / w[keep].sum().clamp_min(1.0)


@torch.no_grad()
def eval_loss(model: nn.Module, data: torch.Tensor, targets: LossTargets, batch_size: int) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(data), batch_size):
        rows = data[i : i + batch_size]
        with torch.autocast(device_type=data.device.type, dtype=torch.bfloat16, enabled=data.is_cuda):
            total += lm_loss(model, rows, targets).item() * len(rows)
        n += len(rows)
    return total / max(1, n)


RESUME_FILE = "resume.pt"  # in --out: the trainable weights, optimizer and schedule position of a run cut by --stop-after
DATA_FILE = "data.pt"  # in --out: the packed training and held-out rows, so a resumed run skips the corpus


def train(adapter: Adapter, data: torch.Tensor, targets: LossTargets, *, seconds: float, max_steps: int | None, batch: int,
          lr: float, log: Callable[[dict], None], seed: int, stop_after: float | None = None,
          resume: dict[str, Any] | None = None, clock: Callable[[], float] = time.time) -> tuple[list[dict], dict[str, Any] | None]:
    """AdamW on the adapter, cosine schedule over the wall-clock budget ``seconds`` (or max_steps).

    ``stop_after`` ends this call's training after that many seconds while the
    schedule still spans ``seconds``; the second value returned is then the
    state to pass back as ``resume`` (a device call lasts 10 minutes at most,
    a run may need two). It is None when the schedule ran to its end."""
    from training.target import cosine_lr

    model = adapter.model
    g = torch.Generator().manual_seed(seed)
    groups = adapter.param_groups(lr)
    peaks = [grp["lr"] for grp in groups]
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), fused=data.is_cuda)
    trainable = [p for grp in groups for p in grp["params"]]
    hist: list[dict] = []
    done_s, step, tokens = 0.0, 0, 0
    if resume is not None:
        with torch.no_grad():
            for p, saved in zip(trainable, resume["trainable"], strict=True):
                p.copy_(saved.to(p.device))
        opt.load_state_dict(resume["optimizer"])
        g.set_state(resume["generator"])
        done_s, step, tokens, hist = resume["seconds"], resume["step"], resume["tokens"], list(resume["history"])
    model.train()
    t0 = clock()
    loss = torch.zeros(())
    while True:
        now = clock() - t0
        elapsed = done_s + now
        frac = step / max_steps if max_steps else elapsed / seconds
        if frac >= 1.0 or (max_steps and elapsed >= seconds):
            break
        if stop_after is not None and now >= stop_after:
            model.eval()
            return hist, {"trainable": [p.detach().cpu() for p in trainable], "optimizer": opt.state_dict(), "generator": g.get_state(),
                          "seconds": elapsed, "step": step, "tokens": tokens, "history": hist}
        for grp, peak in zip(opt.param_groups, peaks):
            grp["lr"] = cosine_lr(frac, peak)
        rows = data[torch.randint(0, len(data), (batch,), generator=g).to(data.device)]
        with torch.autocast(device_type=data.device.type, dtype=torch.bfloat16, enabled=data.is_cuda):
            loss = lm_loss(model, rows, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        step += 1
        tokens += rows.numel()
        if step == 1 or step % 25 == 0:
            rec = {"step": step, "seconds": round(elapsed, 1), "tokens": tokens, "loss": round(loss.item(), 4), "lr": opt.param_groups[0]["lr"]}
            hist.append(rec)
            log(rec)
    if step and (not hist or hist[-1]["step"] != step):  # the last step, so the history says how far it got
        rec = {"step": step, "seconds": round(done_s + clock() - t0, 1), "tokens": tokens, "loss": round(loss.item(), 4),
               "lr": opt.param_groups[0]["lr"]}
        hist.append(rec)
        log(rec)
    model.eval()
    return hist, None


@torch.no_grad()
def merged_matches(adapter: Adapter, base_dir: Path, delta_dir: Path, sample: torch.Tensor, tokenizer_len: int) -> float:
    """Largest |logit| difference between the trained adapter and model_cache's merge of the
    exported delta into the base folder, on ``sample``: what ships computes what was trained."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state = load_file(str(base_dir / model_cache.WEIGHTS))
    state = {k: v.float() for k, v in state.items()}
    config = json.loads((base_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    spec, tensors = model_cache.read_delta(delta_dir)
    model_cache.merge_delta(state, config, tok, spec, tensors)
    assert len(tok) == tokenizer_len
    dev = sample.device
    merged = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    merged.resize_token_embeddings(config["vocab_size"], mean_resizing=False)
    missing = merged.load_state_dict(state, strict=False)
    assert not [k for k in missing.missing_keys if k != "lm_head.weight"], missing
    merged.tie_weights()
    merged.to(dev).eval()
    a = adapter.model(input_ids=sample).logits.float()
    b = merged(input_ids=sample).logits.float()
    return float((a - b).abs().max())


def answer_cases() -> dict[str, CodeContext]:
    """The probes: the cursor on a blank line as the bridge asks (from the line's start,
    completer.make_request), as a raw client asks (after the indentation), and plain."""
    from quickdraft.lsp_bridge.context import from_line_start

    fib = ("def fibonacci(n):\n    ", "\n\nprint(fibonacci(10))\n")
    push = ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        ",
            "\n\n    def pop(self):\n        return self.items.pop()\n")
    return {
        "fim_fibonacci": CodeContext(*from_line_start(*fib), file_path="fib.py"),
        "fim_fibonacci_at_indent": CodeContext(*fib, file_path="fib.py"),
        "plain_fibonacci": CodeContext(prefix="def fibonacci(n):\n"),
        "fim_stack_push": CodeContext(*from_line_start(*push), file_path="stack.py", repo_name="demo"),
        "fim_stack_push_at_indent": CodeContext(*push, file_path="stack.py", repo_name="demo"),
    }


@torch.no_grad()
def answers(model: nn.Module, tokenizer: Any, dev: torch.device, new_tokens: int = 40) -> dict[str, dict[str, Any]]:
    """Greedy answers to the probes, as the server would return them (cut at its stop tokens),
    with the first token's top three: an empty answer shows which stop token came first."""
    from training.target import greedy_generate

    stops = set(stop_token_ids(tokenizer.get_vocab()))
    out = {}
    for name, ctx in answer_cases().items():
        ids = encode(tokenizer, [render(ctx)])[0]
        prompt = torch.tensor([ids], device=dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            first = model(input_ids=prompt).logits[0, -1].float().softmax(-1)
        gen = greedy_generate(model, prompt, new_tokens)[0, len(ids):].tolist()
        cut = next((i for i, t in enumerate(gen) if t in stops), len(gen))
        top = torch.topk(first, 3)
        out[name] = {"text": tokenizer.decode(gen[:cut]),
                     "first": [[tokenizer.convert_ids_to_tokens(int(i)), round(float(p), 3)] for p, i in zip(top.values, top.indices)]}
    return out


def tiny_base(texts: list[str], out: Path, vocab: int = 512, seed: int = 0) -> Path:
    """A random 2-layer Llama with a SmolLM2-like tokenizer (its special tokens, no FIM ones),
    written as model_cache writes the real base: the smoke run's and the tests' stand-in."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SMOLLM2_SPECIALS),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", bos_token="<|im_start|>", unk_token="<|endoftext|>",
                                  pad_token="<|im_end|>")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    model_cache.write_model_dir(out, state, cfg.to_dict(), tok, dtype="float32")
    return out


# --- the run ---------------------------------------------------------------------------


def add_text_args(ap: argparse.ArgumentParser, *, ctx_seconds: float, old_chars: int) -> None:
    """The options ``texts`` reads (and --smoke, which the caller adds)."""
    ap.add_argument("--budget-tokens", type=int, default=1536, help="the bridge's prompt budget when building context samples")
    ap.add_argument("--ctx-seconds", type=float, default=ctx_seconds, help="time for building context samples")
    ap.add_argument("--old-chars", type=int, default=old_chars, help="characters of the old mix (FIM, repository, plain)")
    ap.add_argument("--site-packages", type=Path, help="collect the corpus from this folder only (no stdlib)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)


def texts(args: argparse.Namespace, summary: dict[str, Any]) -> tuple[list[str], list[str], list[str], list[str]]:
    """(train old mix, train context samples, held-out old mix, held-out context samples) for ``main``'s arguments."""
    from training import context_samples
    from training import corpus as corpus_mod

    if args.site_packages:
        corp = corpus_mod.collect([args.site_packages], include_stdlib=False)
        roots = [str(args.site_packages)]
    else:
        corp = corpus_mod.collect()
        roots = context_samples.default_roots()
    workers = args.workers or corpus_mod.cpu_count()
    summary["corpus"] = corp.stats()
    train_old, train_ctx, st = texts_for(corp.train, roots, ctx_seconds=args.ctx_seconds, workers=workers, seed=args.seed,
                                         budget_tokens=args.budget_tokens, max_files=60 if args.smoke else None, old_chars=args.old_chars)
    held_old, held_ctx, st_held = texts_for(corp.held_out, roots, ctx_seconds=min(args.ctx_seconds, 15), workers=workers,
                                            seed=args.seed + 1, budget_tokens=args.budget_tokens, max_files=10 if args.smoke else 120,
                                            old_chars=3_000_000)
    summary["texts"] = {"train": st, "held_out": st_held}
    return train_old, train_ctx, held_old, held_ctx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="the dequantized base folder (quickdraft model path smollm2-135m-base)")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT/delta (the shippable delta), logs and summary.json")
    ap.add_argument("--results", type=Path, help="copy the small results here as they appear ($OUT on the device)")
    ap.add_argument("--seconds", type=float, default=600, help="training wall-clock budget")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (the schedule follows steps)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--lr", type=float, default=4e-4)
    # Rows a step. Float32 logits are 49,159 x 4 bytes a weighed target (lm_loss): every token counted,
    # 32 rows ran out of memory on an 80 GB H100.
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048, help="packed row length (the preset's window)")
    ap.add_argument("--prompt-loss-weight", type=float, default=0.0,
                    help="loss weight of targets inside FIM prompts (LossTargets); 1.0 counts every token alike")
    add_text_args(ap, ctx_seconds=60, old_chars=60_000_000)
    ap.add_argument("--ctx-share", type=float, default=0.5)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on a CPU; without --base a random 2-layer stand-in base")
    ap.add_argument("--stop-after", type=float,
                    help="end this call's training after this many seconds (the schedule still spans --seconds) and save "
                         "OUT/resume.pt and OUT/data.pt for --resume")
    ap.add_argument("--resume", action="store_true", help="go on from OUT/resume.pt with OUT/data.pt (the same --out and arguments)")
    args = ap.parse_args(argv)

    from training.pipeline import Log, pack

    t_start = time.time()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results = args.results or out
    results.mkdir(parents=True, exist_ok=True)
    log = Log(results / "smollm2_fim_log.jsonl")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}

    def save() -> None:
        summary["wall_s"] = round(time.time() - t_start, 1)
        (results / "smollm2_fim_summary.json").write_text(json.dumps(summary, indent=1))

    if args.smoke:
        args.seq, args.batch, args.budget_tokens = min(args.seq, 128), min(args.batch, 4), min(args.budget_tokens, 96)
        args.max_steps = args.max_steps or 40
        args.ctx_seconds = min(args.ctx_seconds, 20)
        args.old_chars = min(args.old_chars, 300_000)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    resume = torch.load(out / RESUME_FILE, weights_only=False) if args.resume else None
    base = args.base
    if resume is not None:
        summary = resume["summary"]
        summary["resumed_args"] = {k: str(v) for k, v in vars(args).items()}
    else:
        # 1. corpus and texts (worker processes fork before CUDA is touched)
        train_old, train_ctx, held_old, held_ctx = texts(args, summary)
        log({"texts": summary["texts"]})
        save()
        if base is None:
            if not args.smoke:
                ap.error("--base is required (quickdraft model path smollm2-135m-base), except with --smoke")
            base = tiny_base(train_old[:400], out / "tiny-base")
    if base is None:
        base = out / "tiny-base"

    # 2. base and tokenizer
    tok = AutoTokenizer.from_pretrained(str(base))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).to(dev)
    adapter = prepare(model, tok, args.rank, args.alpha)
    summary["added_tokens"] = dict(zip(ADDED_TOKENS, adapter.added))

    seq = args.seq
    n_held = 8 if args.smoke else 256
    if resume is not None:
        cached = torch.load(out / DATA_FILE)
        data = cached["train"].long().to(dev)
        held = {k: (v.long().to(dev) if v is not None else None) for k, v in cached["held"].items()}
    else:
        t0 = time.time()
        old_rows = pack(encode(tok, train_old), seq)
        ctx_rows = pack(encode(tok, train_ctx), seq) if train_ctx else torch.empty(0, seq + 1, dtype=torch.long)
        data = mix(old_rows, ctx_rows, args.ctx_share, args.seed).to(dev)
        held = {"held_out_old_mix": pack(encode(tok, held_old), seq)[:n_held].to(dev),
                "held_out_context": pack(encode(tok, held_ctx), seq)[:n_held].to(dev) if held_ctx else None,
                "train_rows": data[: min(len(data), n_held)]}
        summary["data"] = {"old_rows": len(old_rows), "context_rows": len(ctx_rows), "train_rows": len(data), "seq": seq,
                           "held_rows": {k: (len(v) if v is not None else 0) for k, v in held.items()}, "encode_s": round(time.time() - t0, 1)}
        log({"data": summary["data"]})
        if args.stop_after is not None:
            torch.save({"train": data.int().cpu(), "held": {k: (v.int().cpu() if v is not None else None) for k, v in held.items()}},
                       out / DATA_FILE)

    ignore = torch.tensor(adapter.added, device=dev)
    every = LossTargets.of(tok, ignore)
    targets = replace(every, prompt_weight=args.prompt_loss_weight)
    summary["loss_targets"] = f"every token but the added ones; FIM prompt tokens weigh {args.prompt_loss_weight}"

    def losses() -> dict[str, float]:
        # Every token (comparable with earlier runs), and the middles alone (what a completion is).
        out = {k: round(eval_loss(model, v, every, batch_size=8), 4) for k, v in held.items() if v is not None and len(v)}
        middles = replace(every, prompt_weight=0.0)
        out |= {f"{k}_middles": round(eval_loss(model, v, middles, batch_size=8), 4)
                for k, v in held.items() if k != "train_rows" and v is not None and len(v)}
        return out

    if resume is None:
        summary["loss_before"] = losses()
        summary["answers_before"] = answers(model, tok, dev, 16 if args.smoke else 40)
        log({"loss_before": summary["loss_before"]})
        save()

    # 3. train, export, check the merge, answer
    hist, state = train(adapter, data, targets, seconds=args.seconds, max_steps=args.max_steps, batch=args.batch,
                        lr=args.lr if not args.smoke else 1e-2, log=log, seed=args.seed + 7, stop_after=args.stop_after, resume=resume)
    if state is not None:
        torch.save({**state, "summary": summary}, out / RESUME_FILE)
        summary["history"], summary["steps"], summary["stopped_at_s"] = hist, state["step"], round(state["seconds"], 1)
        log({"stopped": {"step": state["step"], "seconds": round(state["seconds"], 1)}, "resume": str(out / RESUME_FILE)})
        save()
        return 0
    summary["history"] = hist
    summary["steps"] = hist[-1]["step"] if hist else 0
    summary["loss_after"] = losses()
    log({"loss_after": summary["loss_after"]})
    delta_dir = export(adapter, out / "delta", {"name": "smollm2-135m-fim", "base_weights_sha256": model_cache.sha256_file(base / model_cache.WEIGHTS),
                                                "steps": summary["steps"], "seq": seq, "budget_tokens": args.budget_tokens})
    summary["delta_bytes"] = sum(p.stat().st_size for p in delta_dir.iterdir())
    sample = held["held_out_old_mix"][:2, :seq] if len(held["held_out_old_mix"]) else data[:2, :seq]
    summary["merge_max_logit_diff"] = merged_matches(adapter, base, delta_dir, sample, len(tok))
    summary["answers_after"] = answers(model, tok, dev, 16 if args.smoke else 40)
    log({"merge_max_logit_diff": summary["merge_max_logit_diff"], "delta_bytes": summary["delta_bytes"], "answers": summary["answers_after"]})
    if results != out:
        import shutil

        shutil.copytree(delta_dir, results / "delta", dirs_exist_ok=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
