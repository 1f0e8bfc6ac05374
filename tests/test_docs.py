"""Generated docs are up to date."""

from scripts.config_reference import TARGET, render


def test_configuration_reference_is_current():
    assert TARGET.read_text() == render(), "docs/configuration.md is stale: run python scripts/config_reference.py"
