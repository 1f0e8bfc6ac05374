"""Server configuration: one tree of dataclasses, one module per concern.

- sections: model.py, speculation.py, engine.py, server.py, limits.py,
  security.py, telemetry.py, http.py, replicas.py, controller.py (with its sub-sections
  ``[controller.slo]``, ``[controller.hysteresis]``, ...), joined in root.py
  (``QuickdraftConfig``);
- loading.py: defaults < TOML (``--config``) < environment
  (``QUICKDRAFT_CONTROLLER__HYSTERESIS__WARM_MARGIN``) < ``--set
  controller.hysteresis.warm_margin=...``;
- validation.py: every check, raising ``ConfigError`` naming the setting and the fix;
- tree.py: walks the tree (paths, environment names, field docstrings);
- reference.py: docs/configuration.md (``python -m quickdraft.server.config markdown``).

Every field is documented by the docstring right below it.
"""

from quickdraft.server.config.controller import (
    AcceptanceSettings,
    ControllerConfig,
    ControllerPolicy,
    ControllerSettings,
    ExplorationSettings,
    FallbackSettings,
    HysteresisSettings,
    LoadSettings,
    MeasureSettings,
    ScheduleSettings,
    SLOSettings,
    StepModelSettings,
)
from quickdraft.server.config.engine import EngineConfig, detect_device
from quickdraft.server.config.errors import ConfigError
from quickdraft.server.config.http import HttpConfig
from quickdraft.server.config.limits import LimitsConfig
from quickdraft.server.config.loading import load_config
from quickdraft.server.config.model import ModelConfig
from quickdraft.server.config.replicas import ReplicasConfig
from quickdraft.server.config.root import QuickdraftConfig
from quickdraft.server.config.security import SecurityConfig
from quickdraft.server.config.server import ServerConfig
from quickdraft.server.config.speculation import SpeculationConfig
from quickdraft.server.config.telemetry import TelemetryConfig

__all__ = [
    "QuickdraftConfig", "ConfigError", "load_config", "detect_device",
    "ModelConfig", "SpeculationConfig", "EngineConfig", "ServerConfig", "LimitsConfig",
    "SecurityConfig", "TelemetryConfig", "HttpConfig", "ReplicasConfig", "ControllerConfig",
    "ControllerPolicy", "ControllerSettings", "AcceptanceSettings", "StepModelSettings", "SLOSettings",
    "HysteresisSettings", "ExplorationSettings", "FallbackSettings", "LoadSettings", "ScheduleSettings",
    "MeasureSettings",
]
