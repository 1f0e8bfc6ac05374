"""Small dense least squares in pure Python (a handful of parameters; no numpy
dependency for the server's hot path)."""

from __future__ import annotations

from typing import Sequence


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve a x = b by Gaussian elimination with partial pivoting."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise ZeroDivisionError("singular system")
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        for r in range(col + 1, n):
            f = m[r][col] / p
            if f:
                row_r, row_c = m[r], m[col]
                for c in range(col, n + 1):
                    row_r[c] -= f * row_c[c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))
        x[r] = s / m[r][r]
    return x


def weighted_lstsq(
    rows: Sequence[Sequence[float]],
    targets: Sequence[float],
    weights: Sequence[float],
    *,
    fixed: dict[int, float] | None = None,
    ridge: float = 1e-9,
) -> list[float]:
    """argmin_x sum_i w_i (y_i - r_i . x)^2 (+ tiny ridge), with some
    coordinates held at given values."""
    p = len(rows[0])
    fixed = fixed or {}
    free = [j for j in range(p) if j not in fixed]
    if not free:
        return [fixed[j] for j in range(p)]
    nf = len(free)
    ata = [[0.0] * nf for _ in free]
    atb = [0.0] * nf
    fixed_items = [(j, v) for j, v in fixed.items() if v]
    for r, y, w in zip(rows, targets, weights):
        if w <= 0:
            continue
        if fixed_items:
            y = y - sum(r[j] * v for j, v in fixed_items)
        fr = [r[j] for j in free]
        nz = [(i, ri) for i, ri in enumerate(fr) if ri != 0.0]
        for a, (i, ri) in enumerate(nz):
            wri = w * ri
            atb[i] += wri * y
            row = ata[i]
            for k, rk in nz[a:]:  # upper triangle; mirrored below
                row[k] += wri * rk
    for i in range(nf):
        for k in range(i):
            ata[i][k] = ata[k][i]
    scale = max((ata[i][i] for i in range(len(free))), default=1.0) or 1.0
    for i in range(len(free)):
        ata[i][i] += ridge * scale
    sol = solve(ata, atb)
    out = [0.0] * p
    for j, v in fixed.items():
        out[j] = v
    for i, j in enumerate(free):
        out[j] = sol[i]
    return out


def nonneg_lstsq(rows, targets, weights, *, ridge: float = 1e-9) -> list[float]:
    """Weighted least squares with every coefficient >= 0 (costs cannot be
    negative): clamp the most negative to zero and refit, until none is."""
    fixed: dict[int, float] = {}
    p = len(rows[0])
    for _ in range(p):
        x = weighted_lstsq(rows, targets, weights, fixed=fixed, ridge=ridge)
        neg = [j for j in range(p) if j not in fixed and x[j] < 0]
        if not neg:
            return x
        fixed[min(neg, key=lambda j: x[j])] = 0.0
    return [max(0.0, v) for v in x]


def quantile(values: Sequence[float], q: float) -> float:
    """Plain empirical quantile (linear interpolation)."""
    v = sorted(values)
    if not v:
        raise ValueError("quantile of nothing")
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)
