"""Orthogonal matching pursuit (OMP), batched over rows: each target vector as a k-sparse
least-squares combination of atoms. The ``omp`` initialisation (Goddard & Fernandes Neto, arXiv
2506.06607, written from the paper) codes each new token's bridge vector over the anchors' bridge
vectors and applies the coefficients to the anchors' source rows.

For one target y (D,) and atoms a_1..a_K (D,), with unit atoms u_j = a_j / |a_j|:

1. r = y, S = {}.
2. j = argmax |<u_j, r>| (the first on ties). Stop if <u_j, r>^2 < eps (the residual is zero to
   float64 rounding), if j is in S already, or if u_j is in the span of S (its squared distance to
   it <= eps).
3. S += {j}; γ = argmin |y - Σ_{i∈S} γ_i u_i|, solved with the Cholesky factor of the Gram matrix
   [<u_i, u_l>] of S (one row longer each step); r = y - Σ_{i∈S} γ_i u_i.
4. Repeat from 2 until |S| = min(k, K).

The coefficient of a_j is γ_j / |a_j|: the choice is scale-free, the fit is the least-squares fit of
y by the raw atoms (no intercept; signed, and not summing to 1). This is scikit-learn's
``OrthogonalMatchingPursuit( n_nonzero_coefs=k, fit_intercept=False)`` fitted per row on the unit
atoms (``X = U.T``), its coefficients divided by the atoms' norms (what its ``normalize=True``, the
default before 1.2, did); on unit atoms, it is that estimator as it is (the tests hold both). Rows
advance together: one GEMM (rows, D) x (D, K) per step; the Python loops run over the k steps and
over chunks of rows, never over rows."""

from __future__ import annotations

import torch

from sembridge_ray.sparse.csr import csr_from_entries

_CHUNK_BYTES = 64 << 20
"""Float64 bytes per chunk of rows, for the (rows, K) correlations and the (rows, k, D) chosen atoms
alike."""
_EPS = torch.finfo(torch.float64).eps
"""scikit-learn's threshold for a zero correlation and for a dependent atom (squared)."""


def omp_weights(targets: torch.Tensor, atoms: torch.Tensor, k: int) -> torch.Tensor:
    """Sparse CSR (n, K) float64: row i holds the OMP coefficients of ``targets[i]`` over ``atoms``
    (module docstring), at most ``min(k, K)`` entries, columns ascending. ``targets`` (n, D),
    ``atoms`` (K, D), any float dtype and device (the result is on theirs); a zero atom is never
    chosen, a zero target gets an empty row. Non-finite input or ``k < 1`` raises ``ValueError``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if targets.dim() != 2 or atoms.dim() != 2 or targets.shape[1] != atoms.shape[1]:
        raise ValueError(
            f"need targets (n, D) and atoms (K, D), got {tuple(targets.shape)} and {tuple(atoms.shape)}"
        )
    y, a = targets.detach().double(), atoms.detach().to(targets.device, torch.float64)
    if not (bool(torch.isfinite(y).all()) and bool(torch.isfinite(a).all())):
        raise ValueError("targets or atoms contain non-finite values (NaN or inf)")
    norms = torch.linalg.vector_norm(a, dim=1)
    unit = a / torch.where(norms > 0, norms, 1.0).unsqueeze(1)
    (n, dim), m = y.shape, len(a)
    steps = min(k, m)
    chunk = max(1, _CHUNK_BYTES // (8 * max(m, steps * dim, 1)))
    none = torch.zeros(0, dtype=torch.int64, device=y.device)
    parts = [(none, none, y.new_zeros(0))]
    for start in range(0, n if steps else 0, chunk):
        chosen, gamma, size = _pursuit(y[start : start + chunk], unit, steps)
        keep = torch.arange(steps, device=y.device) < size.unsqueeze(1)
        parts.append(
            (keep.nonzero()[:, 0] + start, chosen[keep], gamma[keep] / norms[chosen[keep]])
        )
    rows, cols, vals = (torch.cat(col) for col in zip(*parts, strict=True))
    return csr_from_entries(rows, cols, vals, n, m)


def _pursuit(
    y: torch.Tensor, unit: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OMP of every row of ``y`` (b, D) over the unit atoms ``unit`` (K, D), ``steps`` <= K at most:
    (atom ids (b, steps), coefficients of the unit atoms (b, steps), atoms chosen per row (b,));
    entries past a row's count are 0. Rows that stop drop out of the later steps."""
    b, dim = y.shape
    ids = torch.zeros(b, steps, dtype=torch.int64, device=y.device)
    gamma, size = y.new_zeros(b, steps), torch.zeros(b, dtype=torch.int64, device=y.device)
    # the live rows' state, compacted only when rows stop (a zero residual is rare): each step works
    # on whole tensors
    live, target, residual = torch.arange(b, device=y.device), y, y
    atoms = y.new_zeros(b, steps, dim)  # the chosen unit atoms, U_S
    factor = y.new_zeros(b, steps, steps)  # lower L with U_S U_S^T = L L^T
    rhs = y.new_zeros(b, steps)  # U_S y
    for s in range(steps):
        # (r, K) correlations -> the best atom per row
        pick = torch.matmul(residual, unit.T).abs_().argmax(1)
        atom = unit[pick]  # (r, D)
        # its correlation again, row by row: the GEMM's last bits may depend on how many rows share
        # it, and the stop below must not (the Ray stage cuts rows into batches, the in-process path
        # does not)
        best = (atom * residual).sum(1)
        row = y.new_zeros(len(live), s)
        if s:  # the new atom's row of the factor: L_S row = U_S u_j
            cross = torch.einsum("rsd,rd->rs", atoms[:, :s], atom)
            row = torch.linalg.solve_triangular(
                factor[:, :s, :s], cross.unsqueeze(2), upper=False
            ).squeeze(2)
        # squared distance of u_j to the span of U_S
        diag = (atom * atom).sum(1) - (row * row).sum(1)
        again = (ids[live, :s] == pick.unsqueeze(1)).any(1)
        go = (best * best >= _EPS) & (diag > _EPS) & ~again
        if not bool(go.all()):
            live, target, atoms, factor, rhs = live[go], target[go], atoms[go], factor[go], rhs[go]
            pick, atom, row, diag = pick[go], atom[go], row[go], diag[go]
            if not len(live):
                break
        atoms[:, s], factor[:, s, :s], factor[:, s, s] = atom, row, diag.sqrt()
        rhs[:, s] = (atom * target).sum(1)
        solved = torch.cholesky_solve(
            rhs[:, : s + 1].unsqueeze(2), factor[:, : s + 1, : s + 1]
        ).squeeze(2)
        ids[live, s], gamma[live, : s + 1], size[live] = pick, solved, s + 1
        residual = target - torch.einsum("rs,rsd->rd", solved, atoms[:, : s + 1])
    return ids, gamma, size
