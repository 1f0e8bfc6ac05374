"""Per-position acceptance: Beta posteriors of the conditional acceptance
``a_i = P(position i accepted | positions < i accepted)``, one set per
drafting mode, with exponential forgetting.

Expected tokens per verification step for K drafts (bonus token included)::

    E[L](K) = 1 + sum_{i<=K} prod_{j<=i} a_j

With independent posteriors the posterior mean of the product is the product
of the means, so plugging in means gives the posterior mean of E[L].
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..config.controller import AcceptanceSettings
from ..speculative import AUTOREGRESSIVE, PARALLEL, SPEC_MODES, Mode
from .observation import Observation


@dataclass(frozen=True)
class PositionEstimate:
    """Posterior of one position's conditional acceptance."""

    mean: float
    low: float
    high: float
    trials: float
    """Effective (decayed) trials behind it, excluding the prior."""
    prior_mean: float


class _ModeStats:
    __slots__ = ("succ", "trials", "last_idx", "recent")

    def __init__(self, n: int, recent: int) -> None:
        self.succ = [0.0] * n
        self.trials = [0.0] * n
        self.last_idx = 0
        # per request: (drafts, accepted tokens, pos-1 successes, pos-1 trials)
        self.recent: deque[tuple[int, int, float, float]] = deque(maxlen=recent)


@dataclass(frozen=True)
class AcceptanceShift:
    mode: Mode
    recent_rate: float
    long_rate: float
    recent_trials: float


class AcceptanceModel:
    """Cheap to update (O(positions) per request); estimates are computed on demand."""

    def __init__(self, settings: AcceptanceSettings) -> None:
        self.s = settings
        n = settings.max_positions
        self._stats = {m: _ModeStats(n, settings.recent_requests) for m in SPEC_MODES}
        self._idx = 0  # requests seen, the forgetting clock
        self._gamma = 0.5 ** (1.0 / settings.half_life_requests)
        self._cache: dict[Mode, list[PositionEstimate]] = {}

    # -- updates ----------------------------------------------------------------
    def observe(self, obs: Observation) -> None:
        self._idx += 1
        mode = obs.config.mode
        if mode not in self._stats:
            return
        drafts = obs.drafts
        acc = obs.accepted_prefix_counts()
        if drafts <= 0 or not acc:
            return
        st = self._sync(mode)
        trials = _trials_per_position(obs, drafts, acc)
        n = min(len(trials), self.s.max_positions)
        for i in range(n):
            t = trials[i]
            if t <= 0:
                break
            st.succ[i] += min(acc[i], t)
            st.trials[i] += t
        st.recent.append((drafts, sum(acc), float(min(acc[0], trials[0])) if trials else 0.0,
                          float(trials[0]) if trials else 0.0))
        self._cache.clear()

    def _sync(self, mode: Mode) -> _ModeStats:
        """Apply the forgetting owed since this mode was last touched."""
        st = self._stats[mode]
        lag = self._idx - st.last_idx
        if lag > 0:
            f = self._gamma ** lag
            st.succ = [v * f for v in st.succ]
            st.trials = [v * f for v in st.trials]
            st.last_idx = self._idx
        return st

    def forget(self, keep: float, *, modes: tuple[Mode, ...] = SPEC_MODES, clear_recent: bool = True) -> None:
        """Scale the evidence of ``modes`` by ``keep`` (regime change: trust recent data)."""
        for m in modes:
            st = self._sync(m)
            st.succ = [v * keep for v in st.succ]
            st.trials = [v * keep for v in st.trials]
            if clear_recent:
                st.recent.clear()
        self._cache.clear()

    def clear_recent(self) -> None:
        for st in self._stats.values():
            st.recent.clear()

    # -- estimates ----------------------------------------------------------------
    def positions(self, mode: Mode) -> list[PositionEstimate]:
        """Posterior per position 1..max_positions (index 0 = position 1)."""
        if mode not in self._stats:
            return []
        if mode in self._cache:
            return self._cache[mode]
        s = self.s
        other = PARALLEL if mode == AUTOREGRESSIVE else AUTOREGRESSIVE
        st = self._sync(mode)
        ot = self._sync(other)
        # the other mode's raw rates, for transfer into this mode's prior
        ratio = s.parallel_vs_autoregressive if mode == PARALLEL else 1.0 / s.parallel_vs_autoregressive
        base0 = s.prior_first_parallel if mode == PARALLEL else s.prior_first_autoregressive
        z = s.credible_z
        out: list[PositionEstimate] = []
        prev_mean = None
        for i in range(s.max_positions):
            if ot.trials[i] >= s.transfer_min_trials:
                prior = (ot.succ[i] + 1.0) / (ot.trials[i] + 2.0) * ratio
            elif prev_mean is None:
                prior = base0
            else:
                prior = prev_mean * s.extrapolation_decay
            prior = min(0.99, max(0.01, prior))
            a = prior * s.prior_strength + st.succ[i]
            b = (1.0 - prior) * s.prior_strength + (st.trials[i] - st.succ[i])
            mean = a / (a + b)
            sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
            out.append(PositionEstimate(mean, max(0.0, mean - z * sd), min(1.0, mean + z * sd),
                                        st.trials[i], prior))
            prev_mean = mean
        self._cache[mode] = out
        return out

    def expected_length(self, mode: Mode, k: int, bound: str = "mean") -> float:
        """E[L](K): tokens per verification step, bonus token included.
        ``bound`` = "mean", "low" or "high" (the credible band, all positions
        at their bound: L is monotone in every a_i)."""
        if mode not in self._stats or k <= 0:
            return 1.0
        pos = self.positions(mode)
        total, prod = 1.0, 1.0
        for i in range(min(k, len(pos))):
            p = pos[i]
            prod *= p.mean if bound == "mean" else (p.low if bound == "low" else p.high)
            total += prod
        return total

    def marginal(self, mode: Mode, k: int | None = None) -> list[float]:
        """P(position i accepted), comparable to vLLM's accepted_per_pos / drafts."""
        pos = self.positions(mode)
        k = len(pos) if k is None else min(k, len(pos))
        out, prod = [], 1.0
        for p in pos[:k]:
            prod *= p.mean
            out.append(prod)
        return out

    def trials(self, mode: Mode) -> float:
        """Effective position-1 trials (verification steps) behind a mode's estimate."""
        if mode not in self._stats:
            return 0.0
        return self._sync(mode).trials[0]

    # -- windows ------------------------------------------------------------------
    def recent_acceptance_length(self, mode: Mode) -> tuple[float, int, int]:
        """(mean tokens per step, drafts, requests) over the recent window."""
        if mode not in self._stats:
            return 1.0, 0, 0
        rec = self._stats[mode].recent
        drafts = sum(r[0] for r in rec)
        acc = sum(r[1] for r in rec)
        return (1.0 + acc / drafts if drafts else 1.0), drafts, len(rec)

    def detect_shift(self, mode: Mode) -> AcceptanceShift | None:
        """Position-1 acceptance in the recent window vs the long-run estimate."""
        if mode not in self._stats:
            return None
        st = self._sync(mode)
        rs = sum(r[2] for r in st.recent)
        rt = sum(r[3] for r in st.recent)
        if rt < self.s.shift_min_trials:
            return None
        # the long-run rate without the recent window, so the window does not mask itself
        lt = st.trials[0] - rt
        if lt < self.s.shift_min_trials:
            return None
        lr = max(0.0, st.succ[0] - rs) / lt
        rr = rs / rt
        sd = math.sqrt(max(lr * (1 - lr), 0.01) / rt)
        if abs(rr - lr) > self.s.shift_threshold and abs(rr - lr) > 4.0 * sd:
            return AcceptanceShift(mode, rr, lr, rt)
        return None

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {}
        for m in SPEC_MODES:
            st = self._sync(m)
            out[m] = {"succ": [round(v, 4) for v in st.succ], "trials": [round(v, 4) for v in st.trials]}
        return out

    def load_dict(self, d: dict) -> None:
        n = self.s.max_positions
        for m in SPEC_MODES:
            if m not in d:
                continue
            succ = [float(v) for v in d[m]["succ"]][:n]
            trials = [float(v) for v in d[m]["trials"]][:n]
            if len(succ) != len(trials) or any(t < 0 or s < 0 or s > t + 1e-6 for s, t in zip(succ, trials)):
                raise ValueError(f"acceptance counts for {m} are inconsistent")
            st = self._sync(m)
            st.succ = succ + [0.0] * (n - len(succ))
            st.trials = trials + [0.0] * (n - len(trials))
        self._cache.clear()


def _trials_per_position(obs: Observation, drafts: int, acc: list[int]) -> list[float]:
    """Steps in which position i was drafted with every earlier position accepted."""
    dpp = [int(v) for v in obs.draft_tokens_per_position]
    if dpp and dpp[0] > 0:
        out = [float(dpp[0])]
        for i in range(1, min(len(dpp), len(acc))):
            # a step reaching position i drafted it with probability dpp[i]/dpp[i-1]
            # (K chosen by batch size, independent of acceptance)
            frac = dpp[i] / dpp[i - 1] if dpp[i - 1] else 0.0
            out.append(acc[i - 1] * min(1.0, frac))
        return out
    k = obs.config.k
    if obs.num_draft_tokens and drafts:
        # K varied (a schedule) without per-position draft counts: keep only
        # positions every step drafted
        k = min(k, obs.num_draft_tokens // drafts) if k else obs.num_draft_tokens // drafts
    k = min(k, len(acc))
    if k <= 0:
        return []
    return [float(drafts)] + [float(acc[i - 1]) for i in range(1, k)]
