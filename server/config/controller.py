"""[controller] and its sub-sections: the adaptive speculation controller.

``ControllerConfig`` is what a user sets: whether the server runs the
controller, how it is wired, and the policy (``ControllerPolicy``: the
sections ``[controller.slo]``, ``[controller.hysteresis]``, ...).
``ControllerSettings`` is what the controller (server/controller) receives:
the same policy plus what the server derives at start
(``controller_settings()`` in server/controller_loop.py): the candidate
configs, the initial config and ``schedule.max_batch``. The checks of every
section are in ``validation.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from quickdraft.server.config import validation
from quickdraft.server.config.tree import DERIVED
from quickdraft.server.speculative import MAX_K, SpecConfig, default_candidates


@dataclass
class AcceptanceSettings:
    """Per-position acceptance model (Beta posteriors, one set per drafting mode)."""

    prior_first_autoregressive: float = 0.72
    """Prior mean acceptance of draft position 1, autoregressive drafting
    (EAGLE-3 on HumanEval: about 72%)."""
    prior_first_parallel: float = 0.64
    """Prior mean acceptance of draft position 1, parallel drafting (about 64%)."""
    prior_strength: float = 4.0
    """Pseudo-trials behind each position's prior; small so data dominate fast."""
    extrapolation_decay: float = 0.9
    """Conditional acceptance at a position with no data = the previous
    position's estimate times this (conservative: published conditional rates
    are roughly flat, so this under-estimates long K until measured)."""
    parallel_vs_autoregressive: float = 0.9
    """Parallel conditional acceptance ~ this x autoregressive's at the same
    position; lets data from one mode inform the other's prior."""
    transfer_min_trials: float = 30.0
    """Effective trials the other mode needs at a position before it informs this one's prior."""
    half_life_requests: float = 400.0
    """Old evidence loses half its weight after this many observed requests."""
    credible_z: float = 1.64
    """z of the reported credible band (1.64: a 90% two-sided band)."""
    recent_requests: int = 24
    """Window (requests, per mode) for shift and collapse detection."""
    shift_threshold: float = 0.12
    """Absolute change in position-1 acceptance, recent window vs long-run,
    that counts as an acceptance shift (also needs 4 sigma)."""
    shift_min_trials: float = 100.0
    """Position-1 trials the recent window needs before a shift can be declared."""
    shift_keep: float = 0.1
    """On a shift, the shifted mode's old acceptance evidence is scaled by this ..."""
    shift_keep_other: float = 0.02
    """... and the other mode's by this: what shifted one drafter (the code
    being written) usually shifts the other, whose estimate then follows the
    shifted mode's through the prior until it is measured again."""
    max_positions: int = MAX_K
    """Draft positions tracked (at most 16, the largest K)."""

    def validate(self) -> None:
        validation.check_acceptance(self)


@dataclass
class StepModelSettings:
    """Step-time model: ``step = c0 + c1*B*(K+1) + drafting``, fitted per mode
    jointly (verification is shared), robust (Huber) and regularised."""

    drafter_cost_ratio_autoregressive: float = 0.15
    """Prior: one autoregressive drafter pass costs this fraction of a target
    step at the same batch (EAGLE heads are one or two layers)."""
    drafter_cost_ratio_parallel: float = 0.25
    """Prior: the parallel drafter pass's fixed and per-draft-token costs as a
    fraction of the target's fixed and per-token costs."""
    prior_strength: float = 0.05
    """Weight of the drafting-cost priors, in measured cells' units. Small:
    they only need to pin what the data leave undetermined (a mode never
    measured, or measured at one K and batch size); stronger priors bias
    well-measured modes toward the prior ratios."""
    half_life_requests: float = 2000.0
    """Old step-time evidence loses half its weight after this many requests."""
    recent_per_cell: int = 48
    """Step times kept per (mode, K, batch bucket) cell; the cell's value is their median."""
    buckets_per_doubling: int = 4
    """Batch-size resolution of cells: buckets per doubling of the batch (1..16)."""
    cell_weight_cap: float = 32.0
    """Cap on one cell's weight, so the active config cannot drown the others."""
    huber_k: float = 1.5
    """Huber threshold in robust standard deviations of relative residuals."""
    local_min_requests: float = 4.0
    """A cell's measured residual corrects predictions for its own (mode, K)
    near its batch size, weighted by its precision against the fit's spread
    (direct measurements win over the global fit where they exist); cells
    with fewer effective (decayed) requests than this count proportionally less."""
    drift_min_requests: int = 6
    """Live requests a cell restored from a tuned profile needs before its live
    median replaces the profile's value and measures the drift (live /
    profile) by which cells known only from the profile are re-levelled."""

    def validate(self) -> None:
        validation.check_step_model(self)


@dataclass
class SLOSettings:
    """TTFT service-level objectives per latency class, and the TTFT model."""

    ttft_s: dict[str, float] = field(default_factory=lambda: {"inline": 0.3, "chat": 1.5})
    """Limit on the ``quantile`` TTFT per latency class (inline, chat,
    batch), seconds; classes not listed (by default ``batch``) are
    unconstrained. A table replaces the default whole."""
    quantile: float = 0.95
    """Which TTFT quantile the limits apply to, in [0.5, 1)."""
    min_samples: int = 12
    """Requests of a class before its SLO is enforced (unknown TTFT never excludes)."""
    significance: float = 0.05
    """Where the controller measures every config (live switching), a
    config breaks a limit only when so many of its requests exceed it that
    a quantile within the limit would leave that many over it with at most
    this probability (a binomial test): in a dozen samples the 95th
    percentile is the largest one, and one slow prefill would otherwise
    condemn a config. 1 judges by the sample quantile alone."""
    window: int = 64
    """Recent requests kept per (latency class, config, load bucket) for the
    TTFT model; each config keeps its record while others run."""
    kappa_prior: float = 1.5
    """Prior for TTFT's growth per second of step time (half a step waiting on
    average, plus the step that carries the prefill)."""

    def validate(self) -> None:
        validation.check_slo(self)


@dataclass
class HysteresisSettings:
    """Keeps the controller from flapping; a switch may rebuild the engine."""

    margin: float = 0.07
    """Switch only for a predicted TPOT gain above this fraction (``warm_margin``
    when the target engine is warm) ..."""
    confidence_z: float = 1.0
    """... plus this many standard errors of the predicted gain (noisy
    hardware or few measurements demand a larger gain) ..."""
    sustain_decisions: int = 2
    """... held by this many consecutive decide() calls ..."""
    sustain_s: float = 3.0
    """... over at least this many seconds ..."""
    min_dwell_s: float = 30.0
    """... and at least this long after the previous switch ..."""
    min_dwell_after_load_change_s: float = 10.0
    """... or this long, when a load regime change came after the previous switch."""
    pending_timeout_s: float = 180.0
    """A switch neither applied() nor apply_failed() by then is dropped."""
    failed_config_cooldown_s: float = 300.0
    """A config whose switch failed is not proposed again for this long."""
    slo_margin: float = 0.1
    """Leave a config for missing a TTFT SLO only when its predicted TTFT
    exceeds the limit by this fraction (entering requires meeting the limit)."""
    warm_margin: float = 0.03
    """The gain needed to switch to a warm (standby) engine, instead of
    ``margin`` (the smaller of the two applies): that switch is instant and
    costs no rebuild, so holding a config 3-7% worse for the whole load is
    the larger loss."""
    load_horizon_s: float = 120.0
    """How long a load is expected to last after a switch. A warm (standby)
    engine is taken instead of building the predicted best when it serves
    this horizon faster, counting the rebuild time (measured) during which
    the active engine keeps serving."""

    def validate(self) -> None:
        validation.check_hysteresis(self)


@dataclass
class ExplorationSettings:
    """Bounded exploration of configs the model is unsure about."""

    enabled: bool = True
    """Explore at all (False: only model predictions and fallbacks move the config)."""
    max_share: float = 0.10
    """Share of wall time that may go to exploring (rebuilds included), at first ..."""
    min_share: float = 0.02
    """... decaying to this ..."""
    share_decay: float = 0.7
    """... by this factor per exploration."""
    initial_allowance_s: float = 60.0
    """Exploration seconds available at start (one probe, two rebuilds included)."""
    bank_cap_s: float = 180.0
    """Unused exploration time accrues up to this."""
    rebuild_cost_s: float = 15.0
    """Charged per engine rebuild (there and back: twice per probe)."""
    min_requests: int = 16
    """A probe lasts until this many requests ran under it ..."""
    min_s: float = 10.0
    """... and at least this long ..."""
    max_s: float = 60.0
    """... or this long at most."""
    optimism: float = 0.15
    """TPOT bonus (fraction) for a config with no requests near the current
    load; shrinks as 1/sqrt(1 + requests)."""
    min_samples_near_load: float = 4.0
    """A config with this many effective requests near the current load
    counts as measured there and is not probed again."""
    keep_tolerance: float = 0.01
    """After a probe, the probed config stays only if no config is predicted
    more than this much faster (returning is already paid for)."""
    min_samples_trusted: float = 8.0
    """Requests a drafting mode needs before the policy switches to it on the
    model's word alone; before that, reaching it is a (budgeted) probe."""
    stable_load_s: float = 10.0
    """No probing this soon after a load change (the data would be confounded)."""
    max_load_for_build: float = 2.0
    """A probe that needs a new engine (the config is not warm) waits until
    at most this many requests run. Every running stream pays for the build:
    on a CPU it takes the serving engine's cores for 30-45 s (2-3x TPOT). On
    a GPU, where a build costs the serving engine little (``build_slowdown``
    near 1), the rule only delays a probe to a quieter moment."""

    def validate(self) -> None:
        validation.check_exploration(self)


@dataclass
class FallbackSettings:
    """Safety moves that bypass hysteresis."""

    kv_high: float = 0.90
    """KV-cache usage at which K is reduced one candidate step (e.g. 5 -> 3) ..."""
    kv_critical: float = 0.97
    """... and at which it may be reduced again without waiting ``pressure_min_interval_s``."""
    kv_low: float = 0.75
    """The K cap is lifted after usage stayed below this ..."""
    kv_release_s: float = 60.0
    """... for this long (doubling, up to 16x, when pressure returns within
    four times this after a release)."""
    pressure_min_interval_s: float = 10.0
    """Minimum time between two pressure reductions (let the last one act)."""
    collapse_acceptance_length: float = 1.1
    """Mean accepted length (tokens per step, bonus included) below which,
    over the recent window, acceptance has collapsed (a wrong drafter emits
    gibberish) and speculation is turned off."""
    collapse_min_drafts: int = 64
    """Verification steps the window needs before a collapse is declared ..."""
    collapse_min_requests: int = 4
    """... spread over at least this many requests."""
    collapse_cooldown_s: float = 900.0
    """After a collapse, speculation stays off this long (then probes may retry it)."""

    def validate(self) -> None:
        validation.check_fallback(self)


@dataclass
class LoadSettings:
    """Load tracking and load-regime detection."""

    fast_tau_s: float = 1.5
    """Time constant of the load estimate decisions use."""
    slow_tau_s: float = 60.0
    """Time constant of the reference a regime change is measured against."""
    regime_ratio: float = 1.5
    """Fast/slow load ratio (or its inverse) that counts as a regime change."""
    snapshot_stale_s: float = 10.0
    """Engine snapshots older than this are ignored; request batch sizes are used instead."""

    def validate(self) -> None:
        validation.check_load(self)


@dataclass
class ScheduleSettings:
    """Per-batch-size K schedules (vLLM ``num_speculative_tokens_per_batch_size``)."""

    enabled: bool = True
    """Emit a per-batch-size schedule; False: one K for all batch sizes."""
    parallel: bool = True
    """Schedules for parallel drafting too. Without live switching, the server
    turns this off, whatever is set here, where vLLM's build crashes a P-EAGLE
    engine with a schedule once the batch reaches a range with another K (the
    CPU build of vLLM 0.32, docs/vllm-notes.md)."""
    max_batch: int = field(default=64, metadata={DERIVED: "engine.max_num_seqs"})
    """Largest batch the schedule is planned for; beyond it vLLM carries the
    last K forward."""
    allow_zero_k: bool = False
    """Let the schedule turn drafting off (K=0) at large batches inside a
    speculative engine. Off by default: a K=0 step still carries the drafter's
    bookkeeping; enable once a benchmark shows it costs about as much as no
    speculation."""
    k_tie_tolerance: float = 0.02
    """Prefer the smaller K unless a larger one is predicted this much faster
    (less KV cache, less exposure to acceptance drops)."""
    k_change_tolerance: float = 0.04
    """From one batch size to the next, keep the smaller batch's K unless
    another K is predicted this much faster. Predictions move a few percent
    with noise; without this, noise alone yields zig-zag schedules such as
    ``1-5:K3 6-9:K5 10-14:K3 15+:K1``, and a schedule that differs from a
    warm engine's costs a rebuild."""
    non_increasing: bool = False
    """Force K to fall (or stay) as the batch grows. Off by default: it holds
    for dense targets (verification gets dearer per token), but on the H200
    the Qwen3-Coder MoE target's best K rose with the batch (3 at 1 stream, 5
    at 4 and 8; docs/gpu-h200.md): a batch touches most experts whatever K is,
    so verification is nearly flat in K and drafting's share shrinks."""

    def validate(self) -> None:
        validation.check_schedule(self)


@dataclass
class MeasureSettings:
    """Choosing by measurement where every candidate is a live switch away
    (server/controller/measured.py). A probe there costs one engine step to
    switch and one window served in the probed config, so the controller
    measures each config at the load at hand instead of predicting it."""

    enabled: bool = True
    """Where the serving engine can switch to every candidate live, pick the
    config with the lowest measured TPOT at the current load level, probing
    the ones not measured there; the step and acceptance models then only
    serve engines that need a rebuild to change. False: the models decide
    everywhere."""
    window_s: float = 0.5
    """A measurement window lasts at least this long (the server's
    controller loop ticks this often while measuring) ..."""
    min_tokens: int = 128
    """... and until the streams decoded this many tokens per request in the
    engine at the window's start (a quiet window is extended, to ten times
    ``window_s`` at most). Per request: with many streams most steps also
    prefill someone's prompt, and a window must hold enough arrivals for
    their share of its time to be typical."""
    abandon_above: float = 0.25
    """A probe's window ends early, once it is ``window_s`` long and holds a
    quarter of ``min_tokens`` per request, when its decode TPOT so far runs
    more than this fraction above the best config measured at the level:
    such a config is not chosen, and a full window of it slows every stream
    (seconds at high load). Where such a window is discarded because the
    load moved, the probe ends all the same: the controller goes back to the
    best config it measured at the level before. A large value (e.g. 100)
    lets every window run its length."""
    prefill_adjust: bool = True
    """Score each config at the load level's prefill rate (prompt tokens
    prefilled per decode token, over every config's windows there) instead
    of at the arrivals its own windows caught: with many streams, a window
    that caught more or longer prompts (or fewer prefix-cache hits) reads
    slower whichever config served it (at 8 streams, up to twice as slow:
    docs/benchmarks.md, `quickdraft bench windows`). How much one more
    prompt token per decode token costs is the slope of decode TPOT on
    prefill rate within each config's windows, pooled over the level's
    configs. False: each config's decode TPOT as its windows measured it."""
    windows_kept: int = 4
    """Windows kept per (load level, config); its TPOT is their token-weighted mean."""
    levels_per_doubling: int = 2
    """Load levels per doubling of the running requests (2: 1, 1.4, 2, 2.8, 4, ...)."""
    stable_ratio: float = 1.4
    """A window is discarded when its running requests (at its start, at its
    end, and on average) spread more than this ratio: the load was moving."""
    margin: float = 0.03
    """Measured TPOT gain over the serving config needed to switch."""
    switch_z: float = 0.0
    """Once a config is the choice at a load level, another replaces it only
    when measured faster by more than this many standard errors of the
    difference (the spread of the level's windows, pooled over its configs,
    over the square root of each config's windows): the serving config is
    measured window after window while the others keep the windows their
    probes took, and the lowest of those may be a lucky one. A probe not
    faster by that much goes back to the choice. 0 (default): the plain
    ``margin`` decides; on the 2-core CPU a controller with 1.5 measured
    level with one at 0 (docs/benchmarks.md)."""
    confirm_within: float = 0.10
    """A config measured in one window only, within this fraction of the
    best, is measured in a second window before the choice (a window's
    figure varies by a few percent). Within a drafting mode, a K counts as
    slower than the mode's best only beyond this fraction when it rules out
    the Ks past it."""
    stale_s: float = 180.0
    """A measurement older than this no longer counts as current: a config
    last measured within ``refresh_within`` of the best is measured again
    (refreshed) before it can be chosen ..."""
    refresh_within: float = 0.15
    """... while one measured slower than that is left alone for four times
    ``stale_s``."""
    prune_above: float = 0.3
    """At a load level where a config has no measurement, it is not probed
    when, at the nearest level where it was measured, it ran more than this
    fraction slower than that level's best and its K lies beyond its drafting
    mode's best K there in the direction the load moved (larger where the
    load rose, smaller where it fell): more load does not raise a mode's
    best K. No speculation is always probed. Probes of far-off configs cost
    most at high load, where windows last longest. A large value (e.g. 100)
    probes every config at every level."""

    def validate(self) -> None:
        validation.check_measure(self)


@dataclass
class ControllerPolicy:
    """The policy sections: what users set under [controller] and what the
    controller receives in ControllerSettings."""

    history_size: int = 64
    """Decisions kept for the controller's state (holds are kept only when their reason changes)."""
    acceptance: AcceptanceSettings = field(default_factory=AcceptanceSettings)
    step_model: StepModelSettings = field(default_factory=StepModelSettings)
    slo: SLOSettings = field(default_factory=SLOSettings)
    hysteresis: HysteresisSettings = field(default_factory=HysteresisSettings)
    exploration: ExplorationSettings = field(default_factory=ExplorationSettings)
    fallback: FallbackSettings = field(default_factory=FallbackSettings)
    load: LoadSettings = field(default_factory=LoadSettings)
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    measure: MeasureSettings = field(default_factory=MeasureSettings)


@dataclass
class ControllerConfig(ControllerPolicy):
    """The adaptive speculation controller (server/controller, docs/controller.md):
    whether the server runs it, how it is wired, and its policy (the sections below)."""

    enabled: bool = False
    """True: measure TTFT/TPOT and switch speculative configs at run time
    (`quickdraft serve --controller`)."""
    decide_every_s: float = 2.0
    """How often the controller samples the engine and decides (1-2 s lets it
    react within ~30 s of a load change, an engine rebuild included)."""
    profile_dir: str | None = None
    """Where tuned profiles live. None: ~/.cache/quickdraft/profiles."""
    allow_rebuild: bool = True
    """Apply decisions that need a new engine (another drafter, K above
    speculation.max_k, or speculation off on a plain engine) by building it.
    Live switches (server/vllm_live.py) are applied either way."""
    standby_engines: int = 0
    """Engines kept warm for other configs (0..4): the one switched away from,
    and at start the controller's pick for a full batch when it needs another
    engine. A switch to a warm engine is instant instead of a rebuild (40-48 s
    on a 2-core CPU). Each costs the model's memory and engine.cpu_kv_cache_gib
    (CPU) or its GPU memory share; an idle vLLM engine waits without using a
    core. 0: every switch the serving engine cannot make live rebuilds."""
    observations_file: str | None = None
    """Append every observation the controller takes to this file (JSON
    lines: ``t``, the controller clock's Unix time, and either
    ``observation``, a finished request, or ``window``, a measurement window),
    to replay a live run offline (``Observation.from_dict``,
    ``Window.from_dict``, ``sim.TraceEngine``). None: off."""

    @property
    def ttft_slo_s(self) -> dict[str, float]:
        """The former name of ``slo.ttft_s`` (the loader still accepts it)."""
        return self.slo.ttft_s


@dataclass
class ControllerSettings(ControllerPolicy):
    """Everything the controller needs; defaults suit a CPU box (~15 s rebuilds).
    The server builds it from ControllerConfig (controller_settings() in
    server/controller_loop.py)."""

    candidates: tuple[SpecConfig, ...] = field(default_factory=default_candidates)
    """Configs the policy may choose; "off" is always added. The server
    derives them: default_candidates() without parallel K above the preset's
    trained slots."""
    initial: SpecConfig = field(default_factory=SpecConfig.off)
    """Config assumed at start when no profile says otherwise. The server
    derives it from [speculation]."""
    enabled: bool = True
    """False: decide() always holds (observations and state still work). The
    server builds a controller only when controller.enabled, so passes True."""

    def __post_init__(self) -> None:
        self.candidates = tuple(dict.fromkeys((SpecConfig.off(),) + tuple(self.candidates)))
        self.validate()

    def validate(self) -> None:
        validation.check_controller_settings(self)

    def ks(self, parallel: bool) -> tuple[int, ...]:
        """Candidate K values of one drafting mode, ascending."""
        return tuple(sorted({c.k for c in self.candidates if c.enabled and c.parallel == parallel}))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ControllerSettings":
        """Build from nested plain data; configs may be labels ("parallel K=5")."""
        kwargs: dict[str, Any] = {}
        subs = {f.name: f for f in dataclasses.fields(cls)}
        for key, val in d.items():
            if key not in subs:
                raise ValueError(f"unknown controller setting {key!r}; valid: {sorted(subs)}")
            if key == "candidates":
                kwargs[key] = tuple(_as_config(v) for v in val)
            elif key == "initial":
                kwargs[key] = _as_config(val)
            elif isinstance(val, Mapping):
                sub_cls = type(getattr(cls(), key))
                names = {f.name for f in dataclasses.fields(sub_cls)}
                bad = set(val) - names
                if bad:
                    raise ValueError(f"unknown {key} setting(s) {sorted(bad)}; valid: {sorted(names)}")
                kwargs[key] = sub_cls(**val)
            else:
                kwargs[key] = val
        return cls(**kwargs)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["candidates"] = [c.label() for c in self.candidates]
        out["initial"] = self.initial.label()
        return out


def _as_config(v: Any) -> SpecConfig:
    if isinstance(v, SpecConfig):
        return v
    if isinstance(v, str):
        return SpecConfig.parse(v)
    if isinstance(v, Mapping):
        return SpecConfig(bool(v.get("parallel", False)), int(v.get("k", 0)))
    raise ValueError(f"cannot read a speculative config from {v!r}; use e.g. 'parallel K=5'")
