"""Adaptive speculation controller: picks drafting mode (off / autoregressive
EAGLE-3 / parallel P-EAGLE), K and a per-batch-size K schedule from measured
TTFT, TPOT and acceptance. Plain, network-free, deterministic objects; the
server feeds them and acts on their decisions. See docs/controller.md.
"""

from .calibrate import SweepResult, SweepRow, plot_sweep, run_sweep
from .controller import Controller
from .decision import Action, Decision
from .estimator import Prediction
from .observation import LATENCY_CLASSES, EngineSnapshot, LatencyClass, Observation
from .profile import DEFAULT_PROFILE_DIR, ProfileKey, ProfileStore, load_into, save_from, weights_fingerprint, with_fingerprint
from .settings import (
    AcceptanceSettings,
    ControllerSettings,
    ExplorationSettings,
    FallbackSettings,
    HysteresisSettings,
    LoadSettings,
    ScheduleSettings,
    SLOSettings,
    StepModelSettings,
)
from .spec import (
    AUTOREGRESSIVE,
    OFF,
    PARALLEL,
    BatchRangeK,
    KSchedule,
    Mode,
    SpecConfig,
    default_candidates,
    engine_speculative_config,
)

__all__ = [
    # configs
    "SpecConfig", "KSchedule", "BatchRangeK", "Mode", "OFF", "AUTOREGRESSIVE", "PARALLEL",
    "default_candidates", "engine_speculative_config",
    # inputs
    "Observation", "EngineSnapshot", "LatencyClass", "LATENCY_CLASSES",
    # the controller
    "Controller", "Decision", "Action", "Prediction",
    # settings
    "ControllerSettings", "AcceptanceSettings", "StepModelSettings", "SLOSettings",
    "HysteresisSettings", "ExplorationSettings", "FallbackSettings", "LoadSettings", "ScheduleSettings",
    # profiles
    "ProfileKey", "ProfileStore", "DEFAULT_PROFILE_DIR", "load_into", "save_from", "weights_fingerprint", "with_fingerprint",
    # calibration sweep (quickdraft tune)
    "run_sweep", "SweepResult", "SweepRow", "plot_sweep",
]
