"""Bridge settings: defaults < command line < initializationOptions < didChangeConfiguration.

Editors send camelCase keys, either flat or under a ``quickdraft`` section.
A value of the wrong type is ignored with a warning, never fatal.

The connection settings (``CONNECTION``: where code and the token go, which
token file is read, how the server is authenticated) are fixed when the
bridge starts: the command line and the launching editor's
initializationOptions set them; ``merged_at_runtime`` (didChangeConfiguration,
workspace/configuration) leaves them as they are. At run time settings may be
a workspace's own (a repository's .vscode/settings.json, a project-local
config), and a repository must not be able to send its reader's code and
token elsewhere, or have an arbitrary file read and sent as the token.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

log = logging.getLogger(__name__)

SECTION = "quickdraft"

# Fields only the command line and initializationOptions may set (see above).
CONNECTION = frozenset({"server", "auth_token_file", "tls", "tls_root_cert_file"})


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    # host:port of the quickdraft gRPC server.
    server: str = "127.0.0.1:50051"
    # File holding a bearer token for the server (read on every settings change).
    auth_token_file: str = ""
    tls: bool = False
    tls_root_cert_file: str = ""
    # Wait this long after the last request before asking the model; a newer
    # request for the same document replaces the waiting one.
    debounce_ms: int = 75
    max_tokens: int = 128
    single_line_max_tokens: int = 48
    request_timeout_ms: int = 10_000
    enable_in_comments: bool = False
    enable_in_strings: bool = False
    # Documents larger than this are not parsed nor completed (said in the log).
    max_file_bytes: int = 1_000_000
    repository_context: bool = True
    # On a line holding only whitespace, send the prompt from the start of that
    # line (the line itself left out), so the model writes the whole line with
    # its indentation, as in its fill-in-the-middle training; the indentation
    # the cursor already has is dropped from the answer. The embedded model
    # answers nothing at a blank line's indentation 6 times in 10 otherwise
    # (docs/lsp.md, Post-processing, "A blank line").
    blank_line_from_line_start: bool = True
    # Keep consecutive prompts of a document alike, so the server's prefix cache
    # serves most of each one: the prefix window keeps its first line while it
    # fits, and repository context chunks keep their place in the prompt (new
    # ones go after them) instead of being re-sorted by relevance on every
    # keystroke (docs/lsp.md, "Stable prompts").
    stable_prompt: bool = True
    # After a suggestion is accepted (its whole text inserted where it was
    # shown), ask for the next one at once, without waiting for the editor's
    # request or the debounce: the next line's, before Enter, when the
    # suggestion ended its line; else at the end of the inserted text. Opt in:
    # it spends engine work on suggestions the editor may never ask for.
    prefetch_after_accept: bool = False
    disabled_languages: tuple[str, ...] = field(default_factory=tuple)

    def merged(self, options: Mapping[str, Any] | None) -> "Settings":
        """These settings updated from an editor's options object."""
        if not isinstance(options, Mapping):
            return self
        if isinstance(options.get(SECTION), Mapping):
            options = options[SECTION]
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            key = _camel(f.name)
            if key not in options and f.name not in options:
                continue
            value = options.get(key, options.get(f.name))
            checked = _check(f.name, value, getattr(self, f.name))
            if checked is not None:
                changes[f.name] = checked
        return dataclasses.replace(self, **changes)

    def merged_at_runtime(self, options: Mapping[str, Any] | None) -> tuple["Settings", list[str]]:
        """``merged`` without the connection settings: the new settings, and
        the camelCase keys that asked to change one of them (ignored)."""
        new = self.merged(options)
        ignored = sorted(_camel(name) for name in CONNECTION if getattr(new, name) != getattr(self, name))
        if ignored:
            new = dataclasses.replace(new, **{name: getattr(self, name) for name in CONNECTION})
        return new, ignored

    def read_token(self) -> str | None:
        if not self.auth_token_file:
            return None
        try:
            with open(self.auth_token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as err:
            log.warning("cannot read auth token file %s: %s", self.auth_token_file, err)
            return None

    def read_root_cert(self) -> bytes | None:
        if not self.tls_root_cert_file:
            return None
        try:
            with open(self.tls_root_cert_file, "rb") as f:
                return f.read()
        except OSError as err:
            log.warning("cannot read TLS root certificate %s: %s", self.tls_root_cert_file, err)
            return None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _check(name: str, value: Any, current: Any) -> Any:
    if isinstance(current, bool):
        ok = isinstance(value, bool)
    elif isinstance(current, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif isinstance(current, str):
        ok = isinstance(value, str)
    elif isinstance(current, tuple):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    else:
        ok = False
    if not ok:
        log.warning("ignoring setting %s=%r (expected %s)", _camel(name), value, type(current).__name__)
        return None
    return value
