"""Languages the context engine understands: grammar, compiled queries, block style.

Grammars come from the per-language wheels (tree-sitter-python, ...), which
ship compiled parsers; nothing is downloaded at run time. A grammar and its
queries are loaded the first time a document of that language shows up.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from functools import cache

import tree_sitter as ts

from quickdraft.lsp_bridge import queries

INDENT = "indent"  # blocks end by dedenting (Python)
BRACES = "braces"  # blocks end with a closing brace


@dataclass(frozen=True)
class _Grammar:
    module: str
    function: str
    queries: dict[str, str]
    block_style: str
    line_comment: str
    # How deep module-level imports sit (C includes nest in #ifdef guards).
    import_depth: int = 1


_GRAMMARS: dict[str, _Grammar] = {
    "python": _Grammar("tree_sitter_python", "language", queries.PYTHON, INDENT, "#"),
    "javascript": _Grammar("tree_sitter_javascript", "language", queries.JAVASCRIPT, BRACES, "//"),
    "typescript": _Grammar("tree_sitter_typescript", "language_typescript", queries.TYPESCRIPT, BRACES, "//"),
    "typescriptreact": _Grammar("tree_sitter_typescript", "language_tsx", queries.TYPESCRIPT, BRACES, "//"),
    "go": _Grammar("tree_sitter_go", "language", queries.GO, BRACES, "//"),
    "rust": _Grammar("tree_sitter_rust", "language", queries.RUST, BRACES, "//"),
    "java": _Grammar("tree_sitter_java", "language", queries.JAVA, BRACES, "//"),
    "c": _Grammar("tree_sitter_c", "language", queries.C, BRACES, "//", import_depth=3),
    "cpp": _Grammar("tree_sitter_cpp", "language", queries.CPP, BRACES, "//", import_depth=3),
}

# LSP language ids that share a grammar with a canonical one.
_ALIASES = {
    "javascriptreact": "javascript",
    "jsx": "javascript",
    "tsx": "typescriptreact",
    "cuda-cpp": "cpp",
    "objective-c": "c",
    "python3": "python",
}

_EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".tsx": "typescriptreact",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp",
    ".hh": "cpp", ".hpp": "cpp", ".hxx": "cpp", ".h++": "cpp", ".ipp": "cpp",
}  # fmt: skip

SUPPORTED = tuple(_GRAMMARS)


@dataclass(frozen=True)
class LanguageSpec:
    """A loaded language: its grammar, queries and how its blocks end."""

    name: str
    language: ts.Language
    queries: dict[str, ts.Query] = field(repr=False)
    block_style: str
    line_comment: str
    import_depth: int

    def query(self, name: str) -> ts.Query | None:
        return self.queries.get(name)


def canonical_id(language_id: str, path: str = "") -> str | None:
    """The grammar name for an LSP language id, or for the file extension when
    the id is unknown (plaintext, empty)."""
    lid = (language_id or "").lower()
    lid = _ALIASES.get(lid, lid)
    if lid in _GRAMMARS:
        return lid
    ext = os.path.splitext(path)[1].lower()
    return _EXTENSIONS.get(ext)


def language_for(language_id: str, path: str = "") -> LanguageSpec | None:
    name = canonical_id(language_id, path)
    return load(name) if name else None


def language_for_path(path: str) -> LanguageSpec | None:
    name = _EXTENSIONS.get(os.path.splitext(path)[1].lower())
    return load(name) if name else None


@cache
def load(name: str) -> LanguageSpec:
    grammar = _GRAMMARS[name]
    module = importlib.import_module(grammar.module)
    language = ts.Language(getattr(module, grammar.function)())
    compiled = {key: ts.Query(language, source) for key, source in grammar.queries.items()}
    return LanguageSpec(
        name=name,
        language=language,
        queries=compiled,
        block_style=grammar.block_style,
        line_comment=grammar.line_comment,
        import_depth=grammar.import_depth,
    )
