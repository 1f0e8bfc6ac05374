"""Tree-sitter queries, per language, for everything the context engine extracts.

Capture names, shared by all languages:

- ``imports``:     ``@import`` (module-level imports, includes, package clauses)
- ``scopes``:      ``@scope`` a class/function-like node, ``@body`` its body
- ``definitions``: ``@definition`` a named definition, ``@name`` its name
- ``identifiers``: ``@identifier`` names used in code
- ``non_code``:    ``@comment``, ``@string``, and ``@code`` for code nested
                   inside a string (interpolations)
- ``statements``:  ``@statement`` nodes that start a statement or member, the
                   places where the prompt may be cut
- ``blocks``:      ``@block`` statement blocks (an empty one asks for a
                   multi-line completion)
- ``module_refs``: ``@module`` module paths of imports (languages whose
                   imports the engine follows), ``@name`` imported names
"""

from __future__ import annotations

PYTHON = {
    "imports": """
        (import_statement) @import
        (import_from_statement) @import
        (future_import_statement) @import
    """,
    "scopes": """
        (class_definition body: (block) @body) @scope
        (function_definition body: (block) @body) @scope
    """,
    "definitions": """
        (decorated_definition definition: (function_definition name: (identifier) @name)) @definition
        (decorated_definition definition: (class_definition name: (identifier) @name)) @definition
        (function_definition name: (identifier) @name) @definition
        (class_definition name: (identifier) @name) @definition
        (module (expression_statement (assignment left: (identifier) @name)) @definition)
    """,
    "identifiers": "(identifier) @identifier",
    "non_code": """
        (comment) @comment
        (string) @string
        (interpolation) @code
    """,
    "statements": """
        (module (_) @statement)
        (block (_) @statement)
    """,
    "blocks": "(block) @block",
    "module_refs": """
        (import_statement name: (dotted_name) @module)
        (import_statement name: (aliased_import name: (dotted_name) @module))
        (import_from_statement module_name: (_) @module name: (dotted_name) @name)
        (import_from_statement module_name: (_) @module name: (aliased_import name: (dotted_name) @name))
        (import_from_statement module_name: (_) @module (wildcard_import))
    """,
}

_JS_COMMON = {
    "imports": "(import_statement) @import",
    "non_code": """
        (comment) @comment
        (string) @string
        (template_string) @string
        (template_substitution) @code
        (regex) @string
    """,
    "statements": """
        (program (_) @statement)
        (statement_block (_) @statement)
        (class_body (_) @statement)
        (switch_body (_) @statement)
    """,
    "blocks": """
        (statement_block) @block
        (class_body) @block
    """,
    "module_refs": "(import_statement source: (string (string_fragment) @module))",
}

_JS_SCOPES = """
    (class_declaration body: (class_body) @body) @scope
    (class body: (class_body) @body) @scope
    (function_declaration body: (statement_block) @body) @scope
    (generator_function_declaration body: (statement_block) @body) @scope
    (function_expression body: (statement_block) @body) @scope
    (method_definition body: (statement_block) @body) @scope
    (arrow_function body: (statement_block) @body) @scope
"""

_JS_DEFINITIONS = """
    (function_declaration name: (identifier) @name) @definition
    (generator_function_declaration name: (identifier) @name) @definition
    (method_definition name: (property_identifier) @name) @definition
    (program (lexical_declaration (variable_declarator name: (identifier) @name)) @definition)
    (program (variable_declaration (variable_declarator name: (identifier) @name)) @definition)
    (program (export_statement declaration: (lexical_declaration (variable_declarator name: (identifier) @name))) @definition)
"""

JAVASCRIPT = {
    **_JS_COMMON,
    "scopes": _JS_SCOPES,
    "definitions": _JS_DEFINITIONS + "(class_declaration name: (identifier) @name) @definition",
    "identifiers": """
        (identifier) @identifier
        (property_identifier) @identifier
    """,
}

TYPESCRIPT = {
    **_JS_COMMON,
    "scopes": _JS_SCOPES
    + """
        (abstract_class_declaration body: (class_body) @body) @scope
        (interface_declaration body: (interface_body) @body) @scope
        (enum_declaration body: (enum_body) @body) @scope
        (internal_module body: (statement_block) @body) @scope
    """,
    "definitions": _JS_DEFINITIONS
    + """
        (class_declaration name: (type_identifier) @name) @definition
        (abstract_class_declaration name: (type_identifier) @name) @definition
        (interface_declaration name: (type_identifier) @name) @definition
        (type_alias_declaration name: (type_identifier) @name) @definition
        (enum_declaration name: (identifier) @name) @definition
        (function_signature name: (identifier) @name) @definition
    """,
    "identifiers": """
        (identifier) @identifier
        (property_identifier) @identifier
        (type_identifier) @identifier
    """,
}

GO = {
    "imports": """
        (package_clause) @import
        (import_declaration) @import
    """,
    "scopes": """
        (function_declaration body: (block) @body) @scope
        (method_declaration body: (block) @body) @scope
        (func_literal body: (block) @body) @scope
        (type_declaration (type_spec type: (struct_type (field_declaration_list) @body))) @scope
        (type_declaration (type_spec type: (interface_type) @body)) @scope
    """,
    "definitions": """
        (function_declaration name: (identifier) @name) @definition
        (method_declaration name: (field_identifier) @name) @definition
        (type_declaration (type_spec name: (type_identifier) @name)) @definition
        (source_file (const_declaration (const_spec name: (identifier) @name)) @definition)
        (source_file (var_declaration (var_spec name: (identifier) @name)) @definition)
    """,
    "identifiers": """
        (identifier) @identifier
        (type_identifier) @identifier
        (field_identifier) @identifier
    """,
    "non_code": """
        (comment) @comment
        (interpreted_string_literal) @string
        (raw_string_literal) @string
        (rune_literal) @string
    """,
    "statements": """
        (source_file (_) @statement)
        (statement_list (_) @statement)
        (field_declaration_list (_) @statement)
    """,
    "blocks": """
        (block) @block
        (field_declaration_list) @block
    """,
}

RUST = {
    "imports": """
        (use_declaration) @import
        (extern_crate_declaration) @import
    """,
    "scopes": """
        (function_item body: (block) @body) @scope
        (impl_item body: (declaration_list) @body) @scope
        (trait_item body: (declaration_list) @body) @scope
        (mod_item body: (declaration_list) @body) @scope
        (struct_item body: (field_declaration_list) @body) @scope
        (enum_item body: (enum_variant_list) @body) @scope
        (closure_expression body: (block) @body) @scope
    """,
    "definitions": """
        (function_item name: (identifier) @name) @definition
        (function_signature_item name: (identifier) @name) @definition
        (struct_item name: (type_identifier) @name) @definition
        (enum_item name: (type_identifier) @name) @definition
        (trait_item name: (type_identifier) @name) @definition
        (type_item name: (type_identifier) @name) @definition
        (const_item name: (identifier) @name) @definition
        (static_item name: (identifier) @name) @definition
        (macro_definition name: (identifier) @name) @definition
    """,
    "identifiers": """
        (identifier) @identifier
        (type_identifier) @identifier
        (field_identifier) @identifier
    """,
    "non_code": """
        (line_comment) @comment
        (block_comment) @comment
        (string_literal) @string
        (raw_string_literal) @string
        (char_literal) @string
    """,
    "statements": """
        (source_file (_) @statement)
        (block (_) @statement)
        (declaration_list (_) @statement)
    """,
    "blocks": """
        (block) @block
        (declaration_list) @block
    """,
}

JAVA = {
    "imports": """
        (package_declaration) @import
        (import_declaration) @import
    """,
    "scopes": """
        (class_declaration body: (class_body) @body) @scope
        (interface_declaration body: (interface_body) @body) @scope
        (enum_declaration body: (enum_body) @body) @scope
        (record_declaration body: (class_body) @body) @scope
        (method_declaration body: (block) @body) @scope
        (constructor_declaration body: (constructor_body) @body) @scope
        (lambda_expression body: (block) @body) @scope
    """,
    "definitions": """
        (class_declaration name: (identifier) @name) @definition
        (interface_declaration name: (identifier) @name) @definition
        (enum_declaration name: (identifier) @name) @definition
        (record_declaration name: (identifier) @name) @definition
        (method_declaration name: (identifier) @name) @definition
        (field_declaration declarator: (variable_declarator name: (identifier) @name)) @definition
    """,
    "identifiers": """
        (identifier) @identifier
        (type_identifier) @identifier
    """,
    "non_code": """
        (line_comment) @comment
        (block_comment) @comment
        (string_literal) @string
        (character_literal) @string
    """,
    "statements": """
        (program (_) @statement)
        (block (_) @statement)
        (class_body (_) @statement)
        (interface_body (_) @statement)
        (constructor_body (_) @statement)
    """,
    "blocks": """
        (block) @block
        (class_body) @block
        (constructor_body) @block
    """,
}

C = {
    "imports": "(preproc_include) @import",
    "scopes": """
        (function_definition body: (compound_statement) @body) @scope
        (struct_specifier body: (field_declaration_list) @body) @scope
        (union_specifier body: (field_declaration_list) @body) @scope
        (enum_specifier body: (enumerator_list) @body) @scope
    """,
    "definitions": """
        (function_definition declarator: (function_declarator declarator: (identifier) @name)) @definition
        (function_definition declarator: (pointer_declarator declarator: (function_declarator declarator: (identifier) @name))) @definition
        (declaration declarator: (function_declarator declarator: (identifier) @name)) @definition
        (struct_specifier name: (type_identifier) @name body: (_)) @definition
        (union_specifier name: (type_identifier) @name body: (_)) @definition
        (enum_specifier name: (type_identifier) @name body: (_)) @definition
        (type_definition declarator: (type_identifier) @name) @definition
        (preproc_def name: (identifier) @name) @definition
        (preproc_function_def name: (identifier) @name) @definition
    """,
    "identifiers": """
        (identifier) @identifier
        (type_identifier) @identifier
        (field_identifier) @identifier
    """,
    "non_code": """
        (comment) @comment
        (string_literal) @string
        (char_literal) @string
        (system_lib_string) @string
    """,
    "statements": """
        (translation_unit (_) @statement)
        (compound_statement (_) @statement)
        (field_declaration_list (_) @statement)
    """,
    "blocks": """
        (compound_statement) @block
        (field_declaration_list) @block
    """,
}

CPP = {
    **C,
    "scopes": C["scopes"]
    + """
        (class_specifier body: (field_declaration_list) @body) @scope
        (namespace_definition body: (declaration_list) @body) @scope
        (lambda_expression body: (compound_statement) @body) @scope
    """,
    "definitions": C["definitions"]
    + """
        (function_definition declarator: (function_declarator declarator: (field_identifier) @name)) @definition
        (function_definition declarator: (function_declarator declarator: (qualified_identifier name: (identifier) @name))) @definition
        (class_specifier name: (type_identifier) @name body: (_)) @definition
    """,
    "identifiers": C["identifiers"] + "(namespace_identifier) @identifier",
    "non_code": C["non_code"] + "(raw_string_literal) @string",
    "statements": C["statements"] + "(declaration_list (_) @statement)",
    "blocks": C["blocks"] + "(declaration_list) @block",
}
