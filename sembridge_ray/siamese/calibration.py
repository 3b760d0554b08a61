"""Calibration of raw MaLSTM scores: statsmodels' local-linear kernel regression (Gaussian kernel)
fitted on the validation predictions, applied to test predictions, clipped to [1, 5].

statsmodels chooses the bandwidth with ``bw='cv_ls'``: Nelder-Mead over its leave-one-out objective
``cv_loo``, which loops over the n points in Python (O(n²) per evaluation, ~40 evaluations).
:func:`search_bandwidth` minimises the same objective, evaluated exactly but vectorised
(:func:`loo_mse`), and hands the bandwidth to ``KernelReg`` as ``bw=[h]``, so the fitted curve is
statsmodels' own."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from statsmodels.nonparametric.kernel_regression import KernelReg

_SQRT_2PI = math.sqrt(2 * math.pi)
_CANCELLATION = 1e6
"""Rows whose expanded Σwd² is a difference of terms this much larger than itself are redone
directly ..."""
_DEGENERATE = 1e3
"""... and so are rows whose weighted spread var_w(d)/E_w(d²) is below 1/this (practically a
one-point fit)."""


class LooObjective:
    """statsmodels' ``cv_loo`` for local-linear regression with a Gaussian kernel, exact and
    vectorised.

    For x (n,), y (n,) and a bandwidth h, :meth:`predictions` gives the leave-one-out estimates
    ĝ₋ᵢ(xᵢ) (n,) term for term as statsmodels does: weights wᵢⱼ = φ((xⱼ − xᵢ)/h)/((n−1)h) for j ≠ i,
    the 2×2 normal matrix [[Σw, Σwd], [Σwd, Σwd²]] and right-hand side [Σwy, Σwdy] with d = xᵢ − xⱼ
    (statsmodels negates exog), solved with ``np.linalg.pinv``.

    How it is fast: x is sorted and cut into blocks; each block pair (I ≤ J) costs one exp over its
    squared distances (precomputed once, n²/2 floats) and two small matrix products, K_IJ @ basis
    and K_IJᵀ @ basis, with basis = [1, u, u², y, uy] and u = x − (the centre of the receiving
    block). Centring per block keeps the expanded second moment Σw(u_j − u_i)² as precise as the
    direct sum, since only nearby points carry weight."""

    def __init__(self, x: np.ndarray, y: np.ndarray, block: int = 256) -> None:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1 or len(x) < 3:
            raise ValueError(f"need x (n,), y (n,) with n >= 3; got {x.shape}, {y.shape}")
        self.n = len(x)
        self.order = np.argsort(x, kind="stable")
        self.rank = np.argsort(self.order)
        self.x, self.y = x[self.order], y[self.order]
        self.blocks = [slice(s, min(self.n, s + block)) for s in range(0, self.n, block)]
        self.centres = [float(self.x[b].mean()) for b in self.blocks]
        pairs = [(i, j) for i in range(len(self.blocks)) for j in range(i, len(self.blocks))]
        self.d2 = {
            (i, j): np.square(self.x[self.blocks[i], None] - self.x[None, self.blocks[j]])
            for i, j in pairs
        }
        # bases[(i, j)]: block j's points seen from block i's centre (none of it depends on h)
        self.bases = {
            (i, j): self._basis(self.blocks[j], self.centres[i])
            for a, b in pairs
            for i, j in ((a, b), (b, a))
        }

    def _basis(self, rows: slice, centre: float) -> np.ndarray:
        """(b, 5) = [1, u, u², y, uy] for the points in ``rows``, u = x − centre."""
        u = self.x[rows] - centre
        y = self.y[rows]
        return np.stack([np.ones_like(u), u, u * u, y, u * y], axis=1)

    def predictions(self, h: float) -> np.ndarray:
        """ĝ₋ᵢ(xᵢ) (n,), in the caller's order."""
        h = abs(float(h))
        moments = np.zeros((self.n, 5))
        for (i, j), d2 in self.d2.items():
            bi, bj = self.blocks[i], self.blocks[j]
            k = np.exp(d2 * (-0.5 / (h * h)))  # (b_i, b_j)
            if i == j:
                np.fill_diagonal(k, 0.0)  # leave i out
            moments[bi] += k @ self.bases[(i, j)]
            if i != j:
                moments[bj] += k.T @ self.bases[(j, i)]
        moments *= 1.0 / (_SQRT_2PI * (self.n - 1) * h)
        u = self.x - np.repeat(self.centres, [b.stop - b.start for b in self.blocks])
        a0, a1, a2, y0, y1 = moments.T
        s0, s1, s2 = a0, u * a0 - a1, u * u * a0 - 2 * u * a1 + a2  # Σw, Σwd, Σwd²
        t0, t1 = y0, u * y0 - y1  # Σwy, Σwdy
        # Rows where the expansion cancels, or whose normal matrix is near singular (a bandwidth far
        # below the spacing of the points: pinv then amplifies rounding), are summed term by term
        # instead.
        size = u * u * a0 + 2 * np.abs(u * a1) + a2
        redo = np.flatnonzero(
            ~((size <= _CANCELLATION * s2) & (s0 * s2 - s1 * s1 > s0 * s2 / _DEGENERATE))
        )
        normal = np.stack([np.stack([s0, s1], -1), np.stack([s1, s2], -1)], -2)  # (n, 2, 2)
        # a huge h makes the normal matrix singular; pinv copes, as in statsmodels
        with np.errstate(all="ignore"):
            est = (np.linalg.pinv(normal) @ np.stack([t0, t1], -1)[..., None])[:, 0, 0]
        est[redo] = self._direct(redo, h)
        out = np.empty(self.n)
        out[self.order] = est
        return out

    def _direct(self, rows: np.ndarray, h: float) -> np.ndarray:
        """ĝ₋ᵢ(xᵢ) for ``rows`` (sorted positions), with statsmodels' own operations in its own
        order, so that even a near-singular fit (pinv amplifying rounding) comes out the same."""
        x, y = self.x[self.rank], self.y[self.rank]  # the caller's order
        out = np.empty(len(rows))
        for r, i in enumerate(self.order[rows]):
            exog, endog, at = -np.delete(x, i)[:, None], np.delete(y, i)[:, None], -x[i : i + 1]
            ker = (1.0 / np.sqrt(2 * np.pi)) * np.exp(-((exog[:, 0] - at[0]) ** 2) / (h**2 * 2.0))
            ker = (ker / h / float(len(exog)))[:, np.newaxis]
            dx = exog - at
            normal = np.array(
                [[ker.sum(), (dx * ker).sum()], [(dx * ker).sum(), np.dot(dx.T, dx * ker)[0, 0]]]
            )
            rhs = np.array([[(ker * endog).sum()], [(dx * ker * endog).sum(axis=0)[0]]])
            out[r] = np.dot(np.linalg.pinv(normal), rhs)[0, 0]
        return out

    def __call__(self, h: float) -> float:
        """Mean of (yᵢ − ĝ₋ᵢ(xᵢ))², statsmodels' ``cv_loo`` value."""
        return float(np.mean((self.y[self.rank] - self.predictions(h)) ** 2))


def loo_predictions(x: np.ndarray, y: np.ndarray, h: float) -> np.ndarray:
    """Leave-one-out local-linear estimates (n,) at bandwidth h (see :class:`LooObjective`)."""
    return LooObjective(x, y).predictions(h)


def loo_mse(x: np.ndarray, y: np.ndarray, h: float) -> float:
    """statsmodels' ``cv_loo`` objective: mean of (yᵢ − ĝ₋ᵢ(xᵢ))²."""
    return LooObjective(x, y)(h)


def reference_bandwidth(x: np.ndarray) -> float:
    """statsmodels' starting point, the normal-reference rule 1.06·σ·n^(−1/5)."""
    return float(1.06 * np.std(x) * len(x) ** (-1.0 / 5))


@dataclass(frozen=True, kw_only=True)
class Bandwidth:
    h: float
    loo_mse: float
    evaluations: int


def search_bandwidth(x: np.ndarray, y: np.ndarray, xtol: float = 1e-6) -> Bandwidth:
    """Minimise :func:`loo_mse` over h, in log h, within [h0·2⁻¹⁶, h0·2⁴⁰] (at the top the weights
    are equal to float precision: the global linear fit, which the objective approaches from above
    as h grows).

    1. Downhill from statsmodels' own start h0 (the normal-reference rule) to the local minimum
       there, as its Nelder-Mead does: bracket from (h0, 1.05·h0), then Brent's method to ``xtol``.
    2. A log₂ grid h0·2ᵏ, k = −4..4, to find other basins (widened while its best point sits on an
       edge and beats step 1); when a grid point beats step 1, Brent's method refines that grid cell
       too.
    The result is the best point evaluated, so it is never worse than any point either step saw.
    """
    objective = LooObjective(x, y)
    seen: dict[float, float] = {}

    def f(log_h: float) -> float:
        if log_h not in seen:
            value = objective(math.exp(log_h))
            seen[log_h] = value if math.isfinite(value) else math.inf
        return seen[log_h]

    h0 = reference_bandwidth(x)
    if not h0 > 0:
        raise ValueError("calibration needs at least two distinct predictions")
    start, step = math.log(h0), math.log(2)
    bounds = (start - 16 * step, start + 40 * step)
    _refine(f, _downhill(f, start, start + math.log(1.05), bounds), xtol)
    local = min(seen, key=seen.__getitem__)
    grid = [start + k * step for k in range(-4, 5)]
    for _ in range(12):
        best = min(range(len(grid)), key=lambda i: f(grid[i]))
        if 0 < best < len(grid) - 1 or f(grid[best]) >= f(local):
            break
        grid = [grid[0] - step, *grid] if best == 0 else [*grid, grid[-1] + step]
    best = min(range(len(grid)), key=lambda i: f(grid[i]))
    if f(grid[best]) < f(local):
        _refine(f, (grid[max(0, best - 1)], grid[best], grid[min(len(grid) - 1, best + 1)]), xtol)
    log_h = min(seen, key=seen.__getitem__)
    return Bandwidth(h=math.exp(log_h), loo_mse=seen[log_h], evaluations=len(seen))


def _downhill(
    f: Callable[[float], float], a: float, b: float, bounds: tuple[float, float]
) -> tuple[float, float, float]:
    """(a, b, c) with f(b) <= f(a), f(c), walking downhill from a past b with golden-ratio steps;
    stops at a bound."""
    if f(b) > f(a):
        a, b = b, a
    while True:
        c = min(max(b + 1.618 * (b - a), bounds[0]), bounds[1])
        if f(c) >= f(b) or c in bounds:
            return a, b, c
        a, b = b, c


def _refine(f: Callable[[float], float], triple: tuple[float, float, float], xtol: float) -> None:
    """Brent's method (bounded) inside the outer points of ``triple``; every point it tries lands in
    f's cache."""
    lo, hi = min(triple[0], triple[2]), max(triple[0], triple[2])
    if hi > lo:
        optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": xtol})


def fit_calibrator(pred: np.ndarray, gold: np.ndarray, h: float | None = None) -> KernelReg:
    """statsmodels ``KernelReg(gold ~ pred, var_type='c', reg_type='ll')``, with bandwidth ``h``
    (``None``: its own cv_ls search)."""
    return KernelReg(
        endog=np.asarray(gold, float),
        exog=np.asarray(pred, float),
        var_type="c",
        reg_type="ll",
        bw="cv_ls" if h is None else [h],
        rng=0,
    )


def calibrate(model: KernelReg, pred: np.ndarray) -> np.ndarray:
    """(n,) raw scores -> (n,) calibrated scores in [1, 5]."""
    fitted: np.ndarray = model.fit(np.asarray(pred, float))[0]
    return np.clip(fitted, 1.0, 5.0)
