"""bench/llama_cpp.py: llama.cpp's row in bench.speculation, timed like vLLM's configs."""

import sys
import types

from quickdraft.bench import llama_cpp
from quickdraft.bench.speculation import ConfigResult, table


class FakeLlama:
    made: list["FakeLlama"] = []

    def __init__(self, model_path, n_ctx, n_threads, seed, verbose):
        self.model_path, self.n_threads = model_path, n_threads
        self.prompts: list[str] = []
        self.closed = False
        FakeLlama.made.append(self)

    def create_completion(self, prompt, max_tokens, temperature, stream):
        assert stream and temperature == 0.0
        self.prompts.append(prompt)
        n = min(max_tokens, len(prompt))  # a prompt of n characters answers n tokens
        for i in range(n):
            yield {"choices": [{"text": "x"}]}

    def close(self):
        self.closed = True


def test_llama_cpp_row_counts_every_prompt_but_the_warm_up(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama, __version__="0.0-test"))
    prompts = [{"prefix": "a" * 5, "suffix": None}, {"prefix": "b" * 1, "suffix": "ignored"}, {"prefix": "c" * 9, "suffix": None}]
    res = ConfigResult(label="llama.cpp", parallel=False, k=-1)
    llama_cpp.run(tmp_path / "m.gguf", prompts, max_tokens=8, res=res, threads=2)
    llm = FakeLlama.made[-1]
    assert llm.prompts == ["aaaaa", "aaaaa", "b", "c" * 9], "the prefix alone, the first prompt twice (warm-up)"
    assert llm.closed and llm.n_threads == 2
    assert res.requests == 3 and res.tokens == 5 + 1 + 8
    assert res.decode_tokens == 4 + 0 + 7, "a one-token answer has no decode time"
    assert len(res.ttft) == 3 and len(res.engine_start_s) == 1


def test_the_llama_cpp_row_has_no_acceptance_and_compares_with_off():
    off = ConfigResult(label="off", parallel=False, k=0, decode_seconds=2.0, decode_tokens=100, ttft=[0.5])
    ll = ConfigResult(label="llama.cpp (m.gguf, prefix only)", parallel=False, k=-1, decode_seconds=1.0, decode_tokens=100, ttft=[0.2])
    row = table([off, ll]).splitlines()[-1]
    assert row == "| llama.cpp (m.gguf, prefix only) | - | - | 10.00 | 2.00x | 200 |"
