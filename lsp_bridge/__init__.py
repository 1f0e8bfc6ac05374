"""The language server editors start (``quickdraft lsp``).

Editor --LSP--> bridge --gRPC stream--> quickdraft server. Modules:

- ``server``      pygls handlers (thin adapters), protocol tweaks
- ``cli``         ``quickdraft lsp`` arguments, ``python -m quickdraft.lsp_bridge``
- ``settings``    settings from the command line and the editor
- ``document``    document text, line index, LSP edits as byte edits
- ``text``        UTF-8 and LSP position-unit conversions
- ``workspace``   open documents, parse trees, workspace folders
- ``languages``   grammars and compiled queries per language
- ``queries``     the tree-sitter queries themselves
- ``syntax``      incremental parse trees, query helpers
- ``trimming``    prefix/suffix windows at syntactic boundaries
- ``symbols``     definitions and imports of files, import resolution
- ``context``     the prompt: windows plus repository context within a budget
- ``postprocess`` gating, single/multi-line shape, cutting and de-duplication
- ``cache``       recent completions, typing through a shown completion
- ``backend``     gRPC channel, server limits, health and reconnect
- ``completer``   one completion request end to end
"""
