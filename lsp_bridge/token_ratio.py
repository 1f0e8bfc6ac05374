"""Bytes per prompt token, learned from the server's answers.

The bridge sizes prompts in bytes (it has no tokenizer; the model is the
server's business), converting the server's token budget with a ratio.
GetServerInfo announces an average ratio. Dense code (number tables, short
identifiers, non-ASCII text) tokenizes at about 2 bytes per token instead of
3.5, so a prompt sized with the average can pass the server's limit and be
refused. Every answer says how many tokens the prompt really was (the final
message's ``prompt_tokens``, or a refusal's trailing metadata), so the ratio
is learned per document, with the language's as a fallback for documents not
yet seen.
"""

from __future__ import annotations

from collections import OrderedDict

from quickdraft.lsp_bridge.context import FILE_OVERHEAD
from quickdraft.v1 import completion_pb2 as pb

# Weight of the newest observation; a document's code changes slowly.
SMOOTHING = 0.5
# Size prompts this much below the learned ratio: a prompt varies around its document's mean.
MARGIN = 0.92
MAX_DOCUMENTS = 512


def prompt_bytes(request: pb.CompleteRequest) -> int:
    """What the context engine counts against the budget for this request."""
    size = len(request.prefix.encode("utf-8", "surrogatepass")) + len(request.suffix.encode("utf-8", "surrogatepass"))
    for f in request.context_files:
        size += len(f.path.encode("utf-8", "surrogatepass")) + len(f.content.encode("utf-8", "surrogatepass")) + FILE_OVERHEAD
    return size


class BytesPerToken:
    """Learned ratios keyed by document and by language."""

    def __init__(self, announced: float):
        self.announced = announced
        self._documents: OrderedDict[str, float] = OrderedDict()
        self._languages: dict[str, float] = {}

    def observe(self, document: str, language: str, prompt_bytes: int, prompt_tokens: int) -> None:
        if prompt_bytes <= 0 or prompt_tokens <= 0:
            return
        ratio = prompt_bytes / prompt_tokens
        for table, key in ((self._documents, document), (self._languages, language)):
            old = table.get(key)
            table[key] = ratio if old is None else (1 - SMOOTHING) * old + SMOOTHING * ratio
        self._documents.move_to_end(document)
        while len(self._documents) > MAX_DOCUMENTS:
            self._documents.popitem(last=False)

    def refused(self, document: str, language: str, prompt_bytes: int, prompt_tokens: int) -> None:
        """A prompt the server refused as too long: this prompt's own ratio
        replaces the estimate (it must shrink now, not on average)."""
        if prompt_bytes <= 0 or prompt_tokens <= 0:
            return
        ratio = prompt_bytes / prompt_tokens
        self._documents[document] = min(self._documents.get(document, ratio), ratio)
        self._languages[language] = min(self._languages.get(language, ratio), ratio)

    def value(self, document: str, language: str) -> float:
        """The ratio to size this document's next prompt with."""
        ratio = self._documents.get(document) or self._languages.get(language) or self.announced
        return ratio * MARGIN
