"""Adaptive speculation controller: picks drafting mode (off / autoregressive
EAGLE-3 / parallel P-EAGLE), K and a per-batch-size K schedule from measured
TTFT, TPOT and acceptance. Plain, network-free, deterministic objects; the
server feeds them and acts on their decisions. See docs/controller.md.

The settings it decides between are ``quickdraft.server.speculative.SpecConfig``;
its own parameters are ``quickdraft.server.config.ControllerSettings``.
"""

from .calibrate import SweepResult, SweepRow, plot_sweep, run_sweep
from .controller import Controller
from .decision import Action, Decision
from .estimator import Plan, Prediction
from .events import Event
from .observation import LATENCY_CLASSES, EngineSnapshot, LatencyClass, Observation
from .profile import DEFAULT_PROFILE_DIR, ProfileKey, ProfileStore, load_into, save_from, weights_fingerprint, with_fingerprint
from .state import ControllerState

__all__ = [
    # inputs
    "Observation", "EngineSnapshot", "LatencyClass", "LATENCY_CLASSES",
    # the controller
    "Controller", "Decision", "Action", "Plan", "Prediction", "ControllerState", "Event",
    # profiles
    "ProfileKey", "ProfileStore", "DEFAULT_PROFILE_DIR", "load_into", "save_from", "weights_fingerprint", "with_fingerprint",
    # calibration sweep (quickdraft tune)
    "run_sweep", "SweepResult", "SweepRow", "plot_sweep",
]
