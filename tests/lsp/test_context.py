"""The context engine: queries per language, trimming, repository context."""

from __future__ import annotations

import textwrap

import pytest

from quickdraft.lsp_bridge.context import FILE_OVERHEAD, Budget, ContextEngine, from_line_start
from quickdraft.lsp_bridge.languages import SUPPORTED, canonical_id, load
from quickdraft.lsp_bridge.symbols import extract, resolve_imports
from quickdraft.lsp_bridge.syntax import parser_for
from quickdraft.lsp_bridge.trimming import import_spans, prefix_window, scope_headers, suffix_window
from quickdraft.lsp_bridge.workspace import Workspace

# One sample per grammar: (language id, file name, source, expected definitions, expected import text)
SAMPLES = {
    "python": ("m.py", """
        import os
        from pkg.mod import thing

        LIMIT = 3

        @decorator
        def helper(x):
            return x

        class Box:
            def open(self):
                pass
        """, {"LIMIT", "helper", "Box", "open"}, "from pkg.mod import thing"),
    "javascript": ("m.js", """
        import fs from "fs";
        const LIMIT = 3;
        function helper(x) { return x; }
        class Box { open() { return 1; } }
        """, {"LIMIT", "helper", "Box", "open"}, 'import fs from "fs";'),
    "typescript": ("m.ts", """
        import { a } from "./a";
        interface Shape { area(): number }
        type Id = string;
        enum Color { Red }
        export const LIMIT = 3;
        function helper(x: number): number { return x; }
        class Box { open(): void {} }
        """, {"Shape", "Id", "Color", "LIMIT", "helper", "Box", "open"}, 'import { a } from "./a";'),
    "typescriptreact": ("m.tsx", """
        import React from "react";
        function View(props: Props) { return <div>{props.x}</div>; }
        """, {"View"}, 'import React from "react";'),
    "go": ("m.go", """
        package main

        import "fmt"

        const Limit = 3

        type Box struct { w int }

        func (b *Box) Open() int { return b.w }

        func helper(x int) int { return x }
        """, {"Limit", "Box", "Open", "helper"}, 'import "fmt"'),
    "rust": ("m.rs", """
        use std::io;
        const LIMIT: i32 = 3;
        struct Box { w: i32 }
        enum Color { Red }
        trait Shape { fn area(&self) -> f64; }
        impl Box { fn open(&self) -> i32 { self.w } }
        fn helper(x: i32) -> i32 { x }
        """, {"LIMIT", "Box", "Color", "Shape", "area", "open", "helper"}, "use std::io;"),
    "java": ("M.java", """
        package demo;
        import java.util.List;
        public class Box {
            private int limit = 3;
            public int open(int x) { return x; }
        }
        interface Shape { double area(); }
        """, {"Box", "limit", "open", "Shape", "area"}, "import java.util.List;"),
    "c": ("m.c", """
        #include <stdio.h>
        #define LIMIT 3
        struct box { int w; };
        typedef int id_t;
        int helper(int x) { return x; }
        int declared(int y);
        """, {"LIMIT", "box", "id_t", "helper", "declared"}, "#include <stdio.h>"),
    "cpp": ("m.cpp", """
        #include <vector>
        namespace demo {
        class Box {
         public:
          int open(int x) { return x; }
        };
        }
        int Box::close() { return 0; }
        int helper(int x) { return x; }
        """, {"Box", "open", "close", "helper"}, "#include <vector>"),
}


def test_every_grammar_has_a_sample():
    assert set(SAMPLES) == set(SUPPORTED)


@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_definitions_and_imports_per_language(language):
    name, source, expected, import_text = SAMPLES[language]
    source = textwrap.dedent(source).lstrip()
    spec = load(language)
    data = source.encode()
    tree = parser_for(spec).parse(data)
    from quickdraft.lsp_bridge.document import line_starts_of

    symbols = extract(name, spec, data, tree, line_starts_of(data))
    assert expected <= set(symbols.definitions)
    ws = Workspace()
    opened = ws.open(f"file:///r/{name}", source, language_id=language)
    spans = import_spans(opened, opened.tree, len(data))
    assert import_text in [data[s.start : s.end].decode().strip() for s in spans]


def test_language_ids_and_extensions():
    assert canonical_id("javascriptreact") == "javascript"
    assert canonical_id("plaintext", "/x/y.rs") == "rust"
    assert canonical_id("", "/x/y.hpp") == "cpp"
    assert canonical_id("markdown", "/x/readme.md") is None


def test_python_decorated_definition_snippet_includes_decorator():
    source = "@cache\ndef helper(x):\n    return x\n"
    spec = load("python")
    data = source.encode()
    from quickdraft.lsp_bridge.document import line_starts_of

    symbols = extract("m.py", spec, data, parser_for(spec).parse(data), line_starts_of(data))
    [definition] = symbols.definitions["helper"]
    assert symbols.snippet(definition).startswith("@cache\ndef helper")


# -- trimming ----------------------------------------------------------------------

BODY = "\n".join(f"        value_{i} = compute(value_{i - 1}, {i})" for i in range(1, 120))
LONG_PY = (
    "import os\nfrom typing import Any\n\n\nclass Engine:\n    \"\"\"Doc.\"\"\"\n\n    def run(self, x: int) -> int:\n"
    + BODY
    + "\n        result = call_something(\n            alpha,\n            beta,\n        )\n        return "
)
LONG_TAIL = "\n\n\n" + "\n".join(f"def tail_{i}(a):\n    return a + {i}\n" for i in range(60))


def _open(text: str, language: str = "python", name: str = "e.py", ws: Workspace | None = None):
    ws = ws or Workspace(["/r"])
    return ws, ws.open(f"file:///r/{name}", text, language_id=language)


def test_small_file_is_sent_whole():
    ws, opened = _open("x = 1\ny = \nz = 3\n")
    offset = len("x = 1\ny = ")
    prompt = ContextEngine(ws).build(opened, offset, Budget())
    assert (prompt.prefix, prompt.suffix, prompt.truncated) == ("x = 1\ny = ", "\nz = 3\n", False)


def test_prefix_keeps_imports_and_headers_when_the_middle_goes():
    _, opened = _open(LONG_PY + LONG_TAIL)
    offset = len(LONG_PY.encode())
    window = prefix_window(opened, opened.tree, offset, 1500)
    assert window.truncated
    assert len(window.text.encode()) <= 1500
    lines = window.text.split("\n")
    assert lines[:4] == ["import os", "from typing import Any", "class Engine:", "    def run(self, x: int) -> int:"]
    assert window.text.endswith("            beta,\n        )\n        return ")
    # The rest is whole lines of the original, ending at the cursor.
    body = "\n".join(lines[4:])
    assert LONG_PY.endswith(body) and LONG_PY[: len(LONG_PY) - len(body)].endswith("\n")
    assert "value_1 " not in window.text


def test_prefix_window_starts_at_a_statement_not_inside_one():
    call = "total = combine(\n" + "".join(f"    argument_{i},\n" for i in range(40)) + ")\n"
    text = "a = 1\n" + call + "b = 2\nc = "
    _, opened = _open(text)
    offset = len(text)
    # A budget whose line cut falls inside the multi-line call.
    budget = len(text) - text.index("    argument_20")
    window = prefix_window(opened, opened.tree, offset, budget)
    assert window.text == "b = 2\nc = "


def test_cursor_line_is_never_cut_and_never_mid_identifier():
    line = "result = " + " + ".join(f"identifier_{i}" for i in range(200))
    _, opened = _open(line)
    window = prefix_window(opened, opened.tree, len(line), 300)
    assert len(window.text) <= 300
    assert line.endswith(window.text)
    assert window.text.startswith((" ", "+")) or window.text.startswith("identifier_")
    cut = len(line) - len(window.text)
    assert not (line[cut - 1].isalnum() or line[cut - 1] == "_") or not (line[cut].isalnum() or line[cut] == "_")


def test_suffix_ends_after_a_whole_statement():
    text = "def f():\n    x = \n" + "".join(f"    y_{i} = call(\n        {i},\n    )\n" for i in range(50))
    _, opened = _open(text)
    offset = text.index("x = ") + 4
    window = suffix_window(opened, opened.tree, offset, 100)
    assert window.truncated
    assert text[offset:].startswith(window.text)
    assert window.text.endswith("    )\n")
    assert len(window.text.encode()) <= 100


def test_suffix_keeps_the_rest_of_the_cursor_line():
    text = "call(a, " + "b" * 50 + ")\nnext = 1\n"
    _, opened = _open(text)
    window = suffix_window(opened, opened.tree, len("call(a, "), 5)
    assert window.text == "b" * 50 + ")\n"


def test_scope_headers_for_braces():
    source = "class Box {\n  open(x) {\n    const y = x;\n    \n  }\n}\n"
    _, opened = _open(source, "javascript", "box.js")
    offset = source.index("    \n") + 4
    headers = [opened.doc.data[s.start : s.end].decode() for s in scope_headers(opened, opened.tree, offset)]
    assert headers == ["class Box {\n", "  open(x) {\n"]


def test_scope_headers_for_python_blank_line_after_last_statement():
    source = "class A:\n    def f(self):\n        x = 1\n        \n\ndef g():\n    pass\n"
    _, opened = _open(source)
    offset = source.index("        \n") + 8
    headers = [opened.doc.data[s.start : s.end].decode() for s in scope_headers(opened, opened.tree, offset)]
    assert headers == ["class A:\n", "    def f(self):\n"]
    # At the module level after the class, no header applies.
    top = source.index("def g")
    assert scope_headers(opened, opened.tree, top) == []


@pytest.mark.parametrize("tokens", [64, 300, 1536])
def test_prompt_fits_the_budget(tokens):
    ws, opened = _open(LONG_PY + LONG_TAIL)
    ws.open("file:///r/other.py", "def compute(a, b):\n    return a * b\n", language_id="python")
    budget = Budget(tokens=tokens, chars_per_token=3.5)
    prompt = ContextEngine(ws).build(opened, len(LONG_PY.encode()), budget)
    used = len(prompt.prefix.encode()) + len(prompt.suffix.encode())
    used += sum(len(p.encode()) + len(c.encode()) + FILE_OVERHEAD for p, c in prompt.context_files)
    cursor_line = "        return "
    assert prompt.prefix.endswith(cursor_line)
    assert used <= max(budget.chars, len(cursor_line) + len(prompt.suffix.encode()))


# -- repository context ---------------------------------------------------------


def test_definitions_of_names_near_the_cursor_most_relevant_last():
    ws = Workspace(["/r"])
    ws.open("file:///r/far.py", "def far_away(a):\n    return a\n", language_id="python")
    ws.open("file:///r/near.py", "def close_by(a):\n    return a\n\n\ndef unrelated():\n    pass\n", language_id="python")
    text = "x = far_away(1)\n" + "pad = 0\n" * 30 + "y = close_by(x)\nz = "
    opened = ws.open("file:///r/main.py", text, language_id="python")
    prompt = ContextEngine(ws).build(opened, len(text), Budget())
    paths = [p for p, _ in prompt.context_files]
    assert paths == ["far.py", "near.py"]
    near = dict(prompt.context_files)["near.py"]
    assert "def close_by" in near and "unrelated" not in near


def test_partial_word_at_cursor_matches_definition_prefixes():
    ws = Workspace(["/r"])
    ws.open("file:///r/lib.py", "def parse_config(path):\n    return path\n", language_id="python")
    opened = ws.open("file:///r/main.py", "cfg = parse_c", language_id="python")
    prompt = ContextEngine(ws).build(opened, len("cfg = parse_c"), Budget())
    assert [p for p, _ in prompt.context_files] == ["lib.py"]


def test_recently_edited_files_come_first_and_other_languages_are_ignored():
    from quickdraft.lsp_bridge.workspace import Change

    ws = Workspace(["/r"])
    notes = ws.open("file:///r/notes.py", "a = 1\nb = 2\n", language_id="python")
    ws.change(notes.uri, 2, [Change("c = 3\n", (1, 0), (1, 0))])
    ws.open("file:///r/lib.go", "package lib\nfunc helper() int { return 1 }\n", language_id="go")
    ws.open("file:///r/lib.py", "def helper():\n    return 1\n", language_id="python")
    opened = ws.open("file:///r/main.py", "x = helper()\ny = ", language_id="python")
    prompt = ContextEngine(ws).build(opened, len("x = helper()\ny = "), Budget())
    assert [p for p, _ in prompt.context_files] == ["notes.py", "lib.py"]
    assert "c = 3" in dict(prompt.context_files)["notes.py"]


def test_python_import_resolution(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for rel in ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py", "pkg/util.py", "pkg/sub/sibling.py", "top.py"]:
        (tmp_path / rel).write_text("def f():\n    pass\n")
    source = "import top\nfrom pkg.sub import leaf\nfrom . import sibling\nfrom ..util import x\nimport missing\n"
    path = tmp_path / "pkg" / "sub" / "here.py"
    spec = load("python")
    data = source.encode()
    from quickdraft.lsp_bridge.document import line_starts_of

    symbols = extract(str(path), spec, data, parser_for(spec).parse(data), line_starts_of(data))
    found = [p.replace(str(tmp_path) + "/", "") for p in resolve_imports(symbols, [str(tmp_path)])]
    assert found == ["top.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py", "pkg/sub/sibling.py", "pkg/util.py"]


def test_typescript_relative_import_resolution(tmp_path):
    (tmp_path / "src" / "lib").mkdir(parents=True)
    (tmp_path / "src" / "shapes.ts").write_text("export function area() { return 1; }\n")
    (tmp_path / "src" / "lib" / "index.ts").write_text("export const x = 1;\n")
    source = 'import { area } from "./shapes.js";\nimport { x } from "./lib";\nimport React from "react";\n'
    spec = load("typescript")
    data = source.encode()
    from quickdraft.lsp_bridge.document import line_starts_of

    path = tmp_path / "src" / "main.ts"
    symbols = extract(str(path), spec, data, parser_for(spec).parse(data), line_starts_of(data))
    found = [p.replace(str(tmp_path) + "/", "") for p in resolve_imports(symbols, [str(tmp_path)])]
    assert found == ["src/shapes.ts", "src/lib/index.ts"]


def test_imported_workspace_files_are_read_from_disk(tmp_path):
    (tmp_path / "geometry.py").write_text("def area(r):\n    return 3.14 * r * r\n\n\ndef perimeter(r):\n    return 6.28 * r\n")
    ws = Workspace([str(tmp_path)])
    text = "from geometry import area\n\nsize = area(2)\nz = "
    opened = ws.open((tmp_path / "main.py").as_uri(), text, language_id="python")
    prompt = ContextEngine(ws).build(opened, len(text), Budget())
    files = dict(prompt.context_files)
    assert "def area(r):" in files["geometry.py"]
    assert "perimeter" not in files["geometry.py"]


def test_prefix_window_prefers_opening_on_a_whole_definition():
    methods = "".join(f"    def m{i}(self):\n        a = {i}\n        return a\n\n" for i in range(30))
    text = "class C:\n" + methods + "    def last(self):\n        "
    _, opened = _open(text)
    offset = len(text)
    # Cut so that the window would open on "        return a" of some method.
    start = text.rindex("        return a", 0, text.index("    def m25"))
    window = prefix_window(opened, opened.tree, offset, len(text) - start + len("class C:\n"))
    body = window.text.split("\n", 1)[1]  # after the kept "class C:" header
    assert window.text.startswith("class C:\n")
    assert body.startswith("    def m25(self):\n")


@pytest.mark.parametrize(
    ("prefix", "suffix", "expected"),
    [
        ("def f():\n    ", "\n    return 1\n", ("def f():\n", "    return 1\n")),  # after the indentation
        ("def f():\n  ", "  \n    return 1\n", ("def f():\n", "    return 1\n")),  # inside it
        ("x = 1\n", "", ("x = 1\n", "")),  # an empty last line
        ("\t", "\nx", ("", "x")),  # the file's first line
        ("def f():\n    ret", "\n", None),  # code before the cursor
        ("def f():\n    ", "pass\n", None),  # code after it
    ],
)
def test_from_line_start(prefix, suffix, expected):
    assert from_line_start(prefix, suffix) == expected
