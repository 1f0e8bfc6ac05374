"""What the controller knows and did, as plain values: ``Controller.state()``
returns a :class:`ControllerState`; front ends map it to their own messages."""

from __future__ import annotations

from dataclasses import dataclass

from ..speculative import AUTOREGRESSIVE, Mode, SpecConfig
from .decision import Decision
from .estimator import Prediction
from .events import Event
from .exploration import Probe
from .rebuild_cost import RebuildCost
from .step_model import StepFit
from .ttft_model import TTFTFit

SHOWN_K_WHEN_OFF = 7
"""Draft positions :meth:`ControllerState.shown_acceptance` lists while speculation is off."""


@dataclass(frozen=True)
class AcceptanceView:
    """Per draft position (index 0 = position 1) of one drafting mode."""

    conditional: tuple[float, ...]
    """Posterior mean of P(position accepted | the one before was)."""
    conditional_low: tuple[float, ...]
    conditional_high: tuple[float, ...]
    marginal: tuple[float, ...]
    """P(position accepted), comparable to vLLM's accepted_per_pos / drafts."""
    trials: tuple[float, ...]
    """Effective (decayed) trials behind each position."""


@dataclass(frozen=True)
class LoadView:
    current: float
    """Running requests, fast estimate."""
    reference: float
    """Running requests, slow estimate (load changes are judged against it)."""
    kv_cache_usage: float
    waiting: int


@dataclass(frozen=True)
class FallbackView:
    k_cap: int | None
    speculation_blocked_for_s: float
    reason: str


@dataclass(frozen=True)
class ExplorationView:
    bank_s: float
    share: float
    spent_s: float
    regret_s: float
    probes: int
    probe: Probe | None
    """The probe pending or running (a copy), None when there is none."""


@dataclass(frozen=True)
class MeasuredView:
    load: float
    config: SpecConfig
    tpot_s: float
    windows: int
    age_s: float


@dataclass(frozen=True)
class ControllerState:
    enabled: bool
    engine: SpecConfig
    """What the serving engine runs, its per-batch-size K schedule included."""
    config: SpecConfig
    """The per-step setting at the current load."""
    load: LoadView
    candidates: tuple[SpecConfig, ...]
    predictions: tuple[Prediction, ...]
    """Per candidate at the current load; empty before any step-time data."""
    decisions: tuple[Decision, ...]
    """The latest decisions, oldest first."""
    pending: Decision | None
    """A decision the server has not confirmed yet."""
    last_good: SpecConfig
    """What a restart starts with."""
    acceptance: dict[Mode, AcceptanceView]
    step_model: StepFit | None
    ttft_model: TTFTFit | None
    slo_ttft_s: dict[str, float]
    rebuild: RebuildCost
    fallback: FallbackView
    exploration: ExplorationView
    events: tuple[Event, ...]
    engine_rebuilds: int
    switches: int
    observations: int
    profile_path: str
    measuring: bool = False
    """Whether decisions are made by measurement (measured.py)."""
    measured: tuple[MeasuredView, ...] = ()
    """Per (load level, config): measured TPOT, oldest levels first."""

    def shown_acceptance(self) -> tuple[float, ...]:
        """Marginal acceptance per draft position of the serving engine's
        drafting mode (autoregressive while off), up to its largest K."""
        mode = self.engine.mode if self.engine.enabled else AUTOREGRESSIVE
        k = self.engine.max_k if self.engine.enabled else SHOWN_K_WHEN_OFF
        return self.acceptance[mode].marginal[:k]
