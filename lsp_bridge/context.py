"""The context engine: what the model sees for one completion.

Prompt = prefix and suffix around the cursor (trimmed at syntactic boundaries)
plus repository context: definitions of the symbols used near the cursor,
found in other open documents and in the files this one imports, and the
neighbourhood of recent edits in other documents. Context files are plain
source (path + content), most relevant last; the server renders them in the
model's repository format, the bridge never writes model tokens.

Stable prompts (``stable``, the default): consecutive prompts of one document
should begin alike, so that the server's prefix cache serves them. Per
document the engine keeps its repository context chunks in the order they
entered the prompt (a chunk that stops being relevant stays while there is
room; a new one goes after the others and replaces only chunks it clearly
outranks), and the prefix window's first line (trimming.Anchor).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import tree_sitter as ts

from quickdraft.lsp_bridge.symbols import Definition, FileSymbols, SymbolIndex, resolve_imports
from quickdraft.lsp_bridge.syntax import captures, matches
from quickdraft.lsp_bridge.text import decode, encode
from quickdraft.lsp_bridge.trimming import Anchor, prefix_window, suffix_window
from quickdraft.lsp_bridge.workspace import OpenDocument, Workspace
# The blank-line rule lives in the wire layer, shared with the server; named here
# too, for completer.py, bench/ and training/, which import it from here.
from quickdraft.prompt_format import from_line_start  # noqa: F401

DEFAULT_BUDGET_TOKENS = 1536
DEFAULT_CHARS_PER_TOKEN = 3.5

# Repository context gets at most this share of the budget when the file
# itself does not fit; the suffix gets this share of what the file gets.
CONTEXT_SHARE = 0.3
SUFFIX_SHARE = 0.25
# Identifiers this many bytes around the cursor count as "used near the cursor".
NEAR_BEFORE = 2000
NEAR_AFTER = 500
# Per context file: separator tokens and newlines the server adds around it.
FILE_OVERHEAD = 16
RECENT_FILES = 2
RECENT_EDIT_LINES = 8
IMPORTED_BONUS = 0.5
RECENT_SCORE = 0.01
# Stable prompts: a new prefix window is cut this share under its budget, and
# kept while it fills between WINDOW_FLOOR and all of the budget.
WINDOW_SLACK = 0.05
WINDOW_FLOOR = 0.75
# A new context chunk takes the place of chunks already in the prompt only if
# it scores this many times higher than each of them (chunks no longer
# relevant score 0) ...
EVICT_RATIO = 2.0
# ... and fills free room only up to this share of the context's cap, so a cap
# that shrinks a byte per keystroke (a small file, growing) does not swap a
# chunk out and another in again and again.
ADD_SHARE = 0.9

_GROUPS = {"typescript": "js", "typescriptreact": "js", "javascript": "js", "c": "c", "cpp": "c"}


@dataclass(frozen=True)
class Budget:
    """Prompt budget announced by the server (GetServerInfo().limits)."""

    tokens: int = DEFAULT_BUDGET_TOKENS
    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN

    @property
    def chars(self) -> int:
        return int(self.tokens * self.chars_per_token)


@dataclass
class Prompt:
    prefix: str
    suffix: str
    # (workspace-relative path, content), most relevant last.
    context_files: list[tuple[str, str]] = field(default_factory=list)
    truncated: bool = False


@dataclass
class _Snippet:
    path: str
    start_line: int
    end_line: int  # inclusive
    text: str
    score: float
    size: int = field(init=False)  # bytes of text

    def __post_init__(self) -> None:
        self.size = len(encode(self.text))

    @property
    def key(self) -> tuple[str, int, int]:
        return self.path, self.start_line, self.end_line


@dataclass
class _Stable:
    """What one document's previous prompt was made of (stable prompts)."""

    chunks: list[_Snippet] = field(default_factory=list)  # in prompt order
    anchor: Anchor | None = None


def _group(language: str) -> str:
    return _GROUPS.get(language, language)


class ContextEngine:
    def __init__(self, workspace: Workspace, symbols: SymbolIndex | None = None, *, repository_context: bool = True,
                 stable: bool = True):
        self.workspace = workspace
        self.symbols = symbols or SymbolIndex(workspace.max_file_bytes)
        # Disk reads are confined to this workspace's folders (symbols.py).
        self.symbols.roots = lambda: workspace.real_folders
        self.repository_context = repository_context
        self._stable_prompts = stable
        # uri -> what its previous prompt was made of (stable prompts only).
        self._previous: dict[str, _Stable] = {}
        # uri -> (import specifiers, resolved paths): resolution touches the disk.
        self._imports: dict[str, tuple[tuple, list[str]]] = {}

    @property
    def stable(self) -> bool:
        return self._stable_prompts

    @stable.setter
    def stable(self, on: bool) -> None:
        self._stable_prompts = on
        if not on:
            self._previous.clear()

    def forget(self, uri: str) -> None:
        self._imports.pop(uri, None)
        self._previous.pop(uri, None)
        self.symbols.forget_open(uri)

    def build(self, opened: OpenDocument, offset: int, budget: Budget) -> Prompt:
        tree = opened.tree
        total = budget.chars
        size = len(opened.doc.data)
        previous = self._previous.setdefault(opened.uri, _Stable()) if self._stable_prompts else None
        context_cap = total - size if size <= total * (1 - CONTEXT_SHARE) else int(total * CONTEXT_SHARE)
        files: list[tuple[str, str]] = []
        if self.repository_context and context_cap > FILE_OVERHEAD:
            files = self.repository_files(opened, tree, offset, context_cap, previous)
        used = sum(len(encode(p)) + len(encode(c)) + FILE_OVERHEAD for p, c in files)

        file_budget = total - used
        suffix_budget = min(size - offset, max(int(file_budget * SUFFIX_SHARE), file_budget - offset))
        suffix = suffix_window(opened, tree, offset, suffix_budget)
        prefix_budget = max(file_budget - len(encode(suffix.text)), file_budget // 2)
        if previous is None:
            prefix = prefix_window(opened, tree, offset, prefix_budget)
        else:
            prefix = prefix_window(opened, tree, offset, prefix_budget, keep=previous.anchor, slack=WINDOW_SLACK, floor=WINDOW_FLOOR)
            previous.anchor = prefix.anchor
        return Prompt(prefix.text, suffix.text, files, prefix.truncated or suffix.truncated)

    # -- repository context ---------------------------------------------

    def repository_files(self, opened: OpenDocument, tree: ts.Tree | None, offset: int, cap: int,
                         previous: _Stable | None = None) -> list[tuple[str, str]]:
        snippets = self._recent_edit_snippets(opened)
        if tree is not None and opened.spec is not None:
            snippets += self._definition_snippets(opened, tree, offset)
        if previous is not None:
            previous.chunks = _keep_chunks(previous.chunks, snippets, cap)
            return _render(previous.chunks, opened)
        return self._pack(snippets, cap, opened)

    def _names_near(self, opened: OpenDocument, tree: ts.Tree, offset: int) -> tuple[dict[str, float], str]:
        """Identifiers near the cursor with their distance in (approximate)
        lines, and the partial word being typed at the cursor."""
        data = opened.doc.data
        nearest: dict[bytes, int] = {}
        partial = ""
        nodes = captures(opened.spec, "identifiers", tree.root_node, (offset - NEAR_BEFORE, offset + NEAR_AFTER))
        for node in nodes.get("identifier", []):
            start, end = node.start_byte, node.end_byte
            if start < offset <= end:
                partial = decode(data[start:offset])
                continue
            # Byte distance keeps this loop cheap; lines are about 40 bytes.
            distance = offset - end if end <= offset else start - offset
            name = data[start:end]
            if distance < nearest.get(name, 1 << 30):
                nearest[name] = distance
        names = {decode(name): distance / 40 for name, distance in nearest.items() if len(name) > 1}
        return names, partial

    def _sources(self, opened: OpenDocument, tree: ts.Tree) -> list[tuple[FileSymbols, bool]]:
        """Files to look for definitions in, with whether this document imports them."""
        sources: list[tuple[FileSymbols, bool]] = []
        imported = self._imported_paths(opened, tree)
        seen = {opened.path}
        for other in self.workspace.documents():
            if other.uri == opened.uri or other.spec is None or _group(other.spec.name) != _group(opened.spec.name):
                continue
            symbols = self.symbols.for_open(other)
            if symbols is not None:
                sources.append((symbols, other.path in imported))
                seen.add(other.path)
        for path in imported:
            if path not in seen:
                symbols = self.symbols.for_path(path)
                if symbols is not None:
                    sources.append((symbols, True))
                    seen.add(path)
        return sources

    def _imported_paths(self, opened: OpenDocument, tree: ts.Tree) -> list[str]:
        spec = opened.spec
        refs = tuple(
            (decode(m["module"][0].text or b""), tuple(decode(n.text or b"") for n in m.get("name", [])))
            for m in matches(spec, "module_refs", tree.root_node, max_depth=spec.import_depth)
        )
        cached = self._imports.get(opened.uri)
        if cached is not None and cached[0] == refs:
            return cached[1]
        stub = FileSymbols(opened.path, spec, b"", [0], imports=list(refs))
        roots = self.workspace.folders or []
        paths = resolve_imports(stub, roots)
        self._imports[opened.uri] = (refs, paths)
        return paths

    def _definition_snippets(self, opened: OpenDocument, tree: ts.Tree, offset: int) -> list[_Snippet]:
        names, partial = self._names_near(opened, tree, offset)
        scored: dict[tuple[str, int], tuple[float, Definition, FileSymbols]] = {}

        def consider(definition: Definition, symbols: FileSymbols, score: float) -> None:
            key = (definition.path, definition.start_byte)
            if key not in scored or scored[key][0] < score:
                scored[key] = (score, definition, symbols)

        for symbols, imported in self._sources(opened, tree):
            bonus = IMPORTED_BONUS if imported else 0.0
            for name, distance in names.items():
                for definition in symbols.definitions.get(name, ()):
                    consider(definition, symbols, 1.0 / (1 + distance) + bonus)
            if len(partial) >= 2:
                for name, definitions in symbols.definitions.items():
                    if name.startswith(partial) and name != partial:
                        for definition in definitions:
                            consider(definition, symbols, 0.5 + bonus)
        snippets = []
        for score, definition, symbols in scored.values():
            snippets.append(
                _Snippet(
                    self.workspace.relative_path(definition.path),
                    definition.start_line,
                    definition.end_line,
                    symbols.snippet(definition),
                    score,
                )
            )
        return snippets

    def _recent_edit_snippets(self, opened: OpenDocument) -> list[_Snippet]:
        snippets = []
        for other in self.workspace.recently_edited(opened.uri, RECENT_FILES):
            if other.skip_reason is not None or other.doc.last_edit_offset is None:
                continue
            doc = other.doc
            line = doc.line_of(min(doc.last_edit_offset, len(doc.data)))
            first = max(0, line - RECENT_EDIT_LINES)
            last = min(doc.line_count - 1, line + RECENT_EDIT_LINES)
            end = doc.line_starts[last + 1] if last + 1 < doc.line_count else len(doc.data)
            text = doc.slice(doc.line_starts[first], end).rstrip() + "\n"
            snippets.append(_Snippet(self.workspace.relative_path(other.path), first, last, text, RECENT_SCORE))
        return snippets

    def _pack(self, snippets: list[_Snippet], cap: int, opened: OpenDocument) -> list[tuple[str, str]]:
        """Best snippets that fit ``cap`` bytes, grouped per file, files ordered
        from least to most relevant (the model reads the last one nearest the cursor)."""
        chosen: dict[str, list[_Snippet]] = {}
        used = 0
        for snippet in sorted(snippets, key=lambda s: -s.score):
            cost = len(encode(snippet.text)) + (0 if snippet.path in chosen else len(snippet.path) + FILE_OVERHEAD)
            if used + cost > cap:
                continue
            chosen.setdefault(snippet.path, []).append(snippet)
            used += cost
        files = _render([s for group in sorted(chosen.values(), key=lambda g: max(s.score for s in g)) for s in group], opened)
        return files


def _cost(chunks: list[_Snippet]) -> int:
    """Bytes ``chunks`` take in a prompt, file headers included (what ``_pack`` counts)."""
    return sum(c.size for c in chunks) + sum(len(path) + FILE_OVERHEAD for path in {c.path for c in chunks})


def _keep_chunks(previous: list[_Snippet], snippets: list[_Snippet], cap: int) -> list[_Snippet]:
    """The context chunks of this prompt, in prompt order, given the previous
    prompt's and this cursor's candidates (stable prompts).

    Chunks of the previous prompt keep their place, with fresh text and score
    when they are candidates again and a score of 0 when not. While they
    exceed ``cap`` the lowest-scored go, the later of equals first. Candidates
    are then taken best first: into free room up to ``ADD_SHARE`` of the cap,
    or in place of chunks that each score under 1/``EVICT_RATIO`` of theirs.
    They join at the end, least relevant first, so that a document's first
    prompt has its most relevant chunk nearest the cursor, as ``_pack`` does.
    """
    fresh: dict[tuple[str, int, int], _Snippet] = {}
    for s in snippets:
        if s.key not in fresh or fresh[s.key].score < s.score:
            fresh[s.key] = s
    chunks = [fresh.pop(c.key, None) or replace(c, score=0.0) for c in previous]
    used = _cost(chunks)
    while chunks and used > cap:
        del chunks[min(range(len(chunks)), key=lambda i: (chunks[i].score, -i))]
        used = _cost(chunks)
    if not fresh:
        return chunks
    room = int(cap * ADD_SHARE)
    paths = {c.path for c in chunks}
    added: list[_Snippet] = []
    for new in sorted(fresh.values(), key=lambda s: -s.score):
        cost = new.size + (0 if new.path in paths else len(new.path) + FILE_OVERHEAD)
        if used + cost > room:
            # Chunks this one clearly outranks, weakest (then latest) first, until it fits.
            weaker = sorted((i for i, c in enumerate(chunks) if c.score * EVICT_RATIO < new.score), key=lambda i: (chunks[i].score, -i))
            out: set[int] = set()
            for i in weaker:
                out.add(i)
                rest = [c for j, c in enumerate(chunks) if j not in out]
                if _cost(rest + added + [new]) <= cap:
                    chunks = rest
                    break
            else:
                continue
            paths = {c.path for c in chunks + added}
            used = _cost(chunks + added)
            cost = new.size + (0 if new.path in paths else len(new.path) + FILE_OVERHEAD)
        added.append(new)
        paths.add(new.path)
        used += cost
    best_of_file: dict[str, float] = {}
    for c in added:
        best_of_file[c.path] = max(best_of_file.get(c.path, 0.0), c.score)
    return chunks + sorted(added, key=lambda c: (best_of_file[c.path], c.score))


def _render(chunks: list[_Snippet], opened: OpenDocument) -> list[tuple[str, str]]:
    """Chunks as context files: grouped per file, files in the order of their
    first chunk, chunks in line order with a comment line between non-adjacent ones."""
    groups: dict[str, list[_Snippet]] = {}
    for chunk in chunks:
        groups.setdefault(chunk.path, []).append(chunk)
    comment = (opened.spec.line_comment if opened.spec else "#") + " ..."
    files = []
    for path, group in groups.items():
        group = sorted(group, key=lambda s: s.start_line)
        parts: list[str] = []
        last_end = -2
        for snippet in group:
            if snippet.start_line <= last_end:  # overlaps what is already there
                continue
            if parts and snippet.start_line > last_end + 1:
                parts.append(comment + "\n")
            parts.append(snippet.text)
            last_end = snippet.end_line
        files.append((path, "".join(parts)))
    return files
