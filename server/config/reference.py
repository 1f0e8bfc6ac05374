"""docs/configuration.md, generated from the tree: every section and setting
with its type, default, environment name and docstring.

``python -m quickdraft.server.config markdown > docs/configuration.md``
writes it; tests/test_docs.py fails when the committed file differs.
"""

from __future__ import annotations

import dataclasses

from quickdraft.server.config import tree
from quickdraft.server.config.loading import ALIASES
from quickdraft.server.config.root import QuickdraftConfig
from quickdraft.server.presets import PRESETS

COMMAND = "python -m quickdraft.server.config markdown > docs/configuration.md"

INTRO = f"""\
# Configuration reference

Generated from `server/config/` by `{COMMAND}`; do not edit by hand.

## Setting a value

Every setting has one dotted path, e.g. `controller.hysteresis.warm_margin`,
and can be set three ways; later sources win over earlier ones:

1. a TOML file, `quickdraft serve --config FILE`, where the sections of the
   path are tables:

   ```toml
   [speculation]
   num_speculative_tokens = 3

   [controller.hysteresis]
   warm_margin = 0.05
   ```

2. an environment variable: `QUICKDRAFT_` and the path in upper case with each
   dot written as a double underscore, e.g.
   `QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN=0.05`;
3. `quickdraft serve --set controller.hysteresis.warm_margin=0.05` (repeatable).
   `--preset`, `--host`, `--port`, `--metrics-port`, `--http`, `--http-port`
   and `--controller` are shorthands for `--set` of the matching setting.

The preset (`model.preset`) supplies what a setting left at `none` means.
Environment and `--set` values are text: `true`/`false`, `none` for an unset
optional setting, lists and tables as JSON (`[[1, 4, 5], [5, 16, 3]]`,
`{{"inline": 0.3}}`); a list or table replaces the default whole.
`quickdraft serve` checks the whole configuration before it starts the engine
and names the setting and the fix when one is wrong.

Former names still read: {", ".join(f"`{old}` (now `{new}`)" for old, new in ALIASES.items())}.

## Derived at start

The controller receives `ControllerSettings` (server/config/controller.py):
the `[controller]` policy sections below plus values the server derives when it
starts the controller (`controller_settings()` in server/controller_loop.py):

- `candidates`: off, autoregressive and parallel K in {{1, 3, 5, 7}}, without
  parallel K above the preset's trained parallel slots;
- `initial`: the `[speculation]` config;
- `enabled`: true (the server builds a controller only when `controller.enabled`);
- `schedule.max_batch`: `engine.max_num_seqs`;
- `schedule.parallel`: as set, but false where the installed vLLM build crashes
  on parallel-drafting schedules (the CPU build of 0.32) and
  `speculation.live_switching` is off.
"""


def render() -> str:
    out = [INTRO, *_presets()]
    for path, section in tree.sections(QuickdraftConfig):
        out += [f"## [{path}]", "", tree.section_doc(section), ""]
        out += ["| setting | type | default | environment variable | meaning |", "|---|---|---|---|---|"]
        defaults = section()
        for s in tree.settings_of(section, path + "."):
            if s.derived_from:
                default, env, doc = "derived", "-", f"Not settable: the server sets it from `{s.derived_from}`. {s.doc}"
            else:
                default, env, doc = f"`{tree.toml_value(getattr(defaults, s.name))}`", f"`{s.env_name}`", s.doc
            kind = next(f.type for f in dataclasses.fields(section) if f.name == s.name)
            out.append(f"| `{s.name}` | `{_cell(kind)}` | {default} | {env} | {_cell(doc)} |")
        out.append("")
    return "\n".join(out)


def _presets() -> list[str]:
    out = ["## Presets", "", "`model.preset` picks one; `custom` takes `model.target` and `model.drafter`.", "",
           "| preset | target | drafter (parallel / autoregressive) | K | drafting | context | description |",
           "|---|---|---|---|---|---|---|"]
    for p in PRESETS.values():
        drafters = " / ".join(f"`{_short(d)}`" for d in dict.fromkeys((p.parallel_drafter, p.drafter)) if d)
        drafting = ("parallel" if p.parallel_drafting else "autoregressive") if drafters else "none"
        k = p.num_speculative_tokens if drafters else "-"
        # A model built here lives in the user's cache: name it machine-independently.
        target = f"(cache)/models/{p.cached_model}" if p.cached_model else _short(p.target)
        out.append(f"| `{p.name}` | `{target}` | {drafters} | {k} | {drafting} "
                   f"| {p.max_model_len} | {_cell(p.description)} |")
    return out + [""]


def _short(path: str) -> str:
    """Hub ids as they are; the embedded model's absolute paths from the package on."""
    marker = "quickdraft/models/"
    return path[path.index(marker):] if marker in path else path


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
