"""The one error every configuration check raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is wrong; the message names it and says how to fix it."""
