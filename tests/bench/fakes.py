"""A fake vLLM engine with a speed and an acceptance, for the benchmarks'
tests: the gate, the load generator and the micro-benchmarks run their real
logic over it, with no vLLM engine and in milliseconds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import lru_cache
from types import SimpleNamespace

from quickdraft.server.engine import EngineSnapshot
from quickdraft.server.prompt_tokens import PromptTokenizer
from quickdraft.server.speculative import SpecConfig


@lru_cache(maxsize=1)
def embedded_tokenizer():
    from transformers import AutoTokenizer

    from quickdraft.server.presets import embedded_dir

    return AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))


@lru_cache(maxsize=1)
def embedded_prompt_tokens() -> PromptTokenizer:
    return PromptTokenizer(embedded_tokenizer())


@dataclass
class FakeEngine:
    """Steps of ``step_s`` (times ``1 + drafter_cost * K``); each step yields
    ``1 + min(K, accepted)`` tokens when speculating, like a drafter that is
    always right on its first ``accepted`` drafts."""

    spec: SpecConfig
    live: bool = False
    """Switches to any setting in place (``switch``), as a live vLLM engine does."""
    step_s: float = 0.01
    accepted: int = 2
    drafter_cost: float = 0.05
    max_tokens: int | None = None  # None: the sampling's max_tokens
    tokenizer: object = field(default_factory=embedded_tokenizer)
    prompt_tokens: PromptTokenizer = field(default_factory=embedded_prompt_tokens)
    stop_token_ids: list[int] = field(default_factory=lambda: [0])
    snapshot: EngineSnapshot = field(default_factory=EngineSnapshot)
    dead: bool = False
    aborted: list[str] = field(default_factory=list)
    generated: int = 0
    switches: int = 0
    max_k: int = 7
    drafter: str | None = None

    async def generate(self, request_id, prompt_ids, sampling):
        limit = self.max_tokens or sampling.max_tokens
        k = self.spec.max_k
        per_step = 1 + min(k, self.accepted)
        step = self.step_s * (1 + self.drafter_cost * k)
        hist = [0] * (k + 1)
        done = 0
        while done < limit:
            if step > 0:
                await asyncio.sleep(step)
            n = min(per_step, limit - done)
            done += n
            if k:
                hist[min(k, n - 1)] += 1
            last = done >= limit
            metrics = SimpleNamespace(histogram=list(hist), num_draft_tokens=sum(hist) * k) if last and k else None
            out = SimpleNamespace(text="x" * n, token_ids=list(range(n)), finish_reason="length" if last else None, spec_decode_metrics=metrics)
            self.generated += n
            yield SimpleNamespace(outputs=[out])

    def can_switch_to(self, spec: SpecConfig) -> bool:
        return (self.live and spec.k <= self.max_k) or spec == self.spec

    async def switch(self, spec: SpecConfig) -> float:
        if not self.can_switch_to(spec):
            raise ValueError(f"this engine runs {self.spec.label()} for its life")
        if spec != self.spec:
            self.switches += 1
        self.spec = spec
        return 0.0

    def describe(self) -> str:
        return self.spec.label()

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def num_unfinished(self):
        return 0

    def shutdown(self):
        self.dead = True


def factory(step_s: float = 0.01, **kw):
    """An ``engine_factory`` for QuickdraftServer / the gate: a FakeEngine per setting."""

    async def make(cfg, spec, live=False):
        return FakeEngine(spec, live, step_s=step_s, **kw)

    return make
