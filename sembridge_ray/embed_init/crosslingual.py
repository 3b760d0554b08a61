"""The cross-lingual recipe's options (``sembridge_x``; docs/xling.md has the diagnosis behind them):

- **row norms** (``norm_scale``): a bridged row is a convex mix of source rows, shorter than its
  parts (in Russian from SPLADE-tiny: median 0.449 against the source rows' 0.677), and with a tied
  output layer a short row is a term that rarely fires, itself included. :func:`rescale_to_sources`
  gives each bridged row ``norm_scale`` times the weighted mean norm of the rows it mixes.
- **the bridge's confidence** (``confidence``): per bridged token, how sure the bridge is of its
  nearest source tokens (:func:`bridge_confidence`): CSLS (Conneau et al. 2018: twice the best
  cosine minus the mean cosines of both tokens' 10 nearest neighbours in the other vocabulary, which
  discounts hubs), the ratio margin (the best cosine over the mean of the 10 best), or the best
  cosine itself.
- **the gate** (``confidence_gate``): the share of bridged tokens the bridge is least sure of keep a
  distinct row of their own, the random method's (and the source's mean bias, as random init gives
  them) instead of a mix of the source rows (:func:`least_confident`).

Plain functions on tensors; shapes in the docstrings."""

from __future__ import annotations

import torch

from sembridge_ray.sparse.csr import csr_from_sorted

NEIGHBOURS = 10
"""The neighbourhood of CSLS and of the ratio margin (Conneau et al. 2018 use 10)."""


def _entries(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, column, value) of every stored entry of a CSR (or dense) weight matrix."""
    csr = weights if weights.layout == torch.sparse_csr else weights.to_sparse_csr()
    crow = csr.crow_indices()
    rows = torch.repeat_interleave(torch.arange(len(crow) - 1), crow[1:] - crow[:-1])
    return rows, csr.col_indices(), csr.values()


def rescale_to_sources(
    rows: torch.Tensor, weights: torch.Tensor, source_norms: torch.Tensor, scale: float
) -> torch.Tensor:
    """rows (n, H) bridged rows, weights (n, S) their weights over the source rows (CSR or dense,
    non-negative), source_norms (S,) -> (n, H): each row in its own direction at ``scale`` times
    the weighted mean norm of its sources (a row without weights, or of norm 0, is left as it is).
    Computed in float64, returned in ``rows``' dtype."""
    at, cols, vals = _entries(weights)
    vals = vals.double().clamp(min=0)
    total = torch.zeros(len(rows), dtype=torch.float64).index_add_(0, at, vals)
    mixed = torch.zeros(len(rows), dtype=torch.float64).index_add_(
        0, at, vals * source_norms.double()[cols]
    )
    norms = rows.double().norm(dim=1)
    keep = (total <= 0) | (norms <= 0)
    target = mixed / total.clamp(min=torch.finfo(torch.float64).tiny)
    factor = torch.where(keep, torch.ones_like(norms), scale * target / norms.clamp(min=1e-300))
    return (rows.double() * factor[:, None]).to(rows.dtype)


def drop_rows(weights: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """weights (n, S) CSR, dropped (n,) bool -> the CSR with the ``dropped`` rows emptied."""
    at, cols, vals = _entries(weights)
    kept = ~dropped[at]
    return csr_from_sorted(at[kept], cols[kept], vals[kept], weights.shape[0], weights.shape[1])


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.double(), dim=1)


def mean_top_cosines(
    queries: torch.Tensor, keys: torch.Tensor, k: int = NEIGHBOURS, block: int = 4096
) -> torch.Tensor:
    """queries (n, D), keys (m, D) -> (n,): each query's mean cosine to its ``k`` nearest keys (in
    blocks of ``block`` queries)."""
    q, kk = _unit(queries), _unit(keys)
    k = min(k, len(kk))
    return torch.cat(
        [
            (q[i : i + block] @ kk.T).topk(k, dim=1).values.mean(dim=1)
            for i in range(0, len(q), block)
        ]
        or [q.new_zeros(0)]
    )


def bridge_confidence(
    new: torch.Tensor,
    sources: torch.Tensor,
    targets: torch.Tensor,
    kind: str,
    k: int = NEIGHBOURS,
    block: int = 4096,
) -> torch.Tensor:
    """new (n, D) the bridge vectors of the tokens to initialise, sources (S, D) the candidate
    source tokens', targets (T, D) every target token's -> (n,) float64 confidence: ``csls``
    max_s [2 cos(t, s) - r_S(t) - r_T(s)] (r_S(t): t's mean cosine to its ``k`` nearest sources,
    r_T(s): s's to its ``k`` nearest targets), ``margin`` the best cosine over the mean of the
    ``k`` best, ``cosine`` the best cosine."""
    if kind not in ("csls", "margin", "cosine"):
        raise ValueError(f"unknown bridge confidence {kind!r}")
    n, s = _unit(new), _unit(sources)
    k = min(k, len(s))
    hub = mean_top_cosines(sources, targets, k, block) if kind == "csls" else None
    found = []
    for i in range(0, len(n), block):
        cos = n[i : i + block] @ s.T
        top = cos.topk(k, dim=1).values
        if kind == "cosine":
            found.append(top[:, 0])
        elif kind == "margin":
            found.append(top[:, 0] / top.mean(dim=1))
        else:
            assert hub is not None
            found.append((2 * cos - top.mean(dim=1, keepdim=True) - hub[None, :]).max(dim=1).values)
    return torch.cat(found) if found else n.new_zeros(0)


def least_confident(confidence: torch.Tensor, share: float) -> torch.Tensor:
    """confidence (n,) -> (n,) bool: the ``round(share * n)`` least confident (ties to the lower
    index, so the choice is deterministic)."""
    count = round(share * len(confidence))
    chosen = torch.zeros(len(confidence), dtype=torch.bool)
    chosen[torch.sort(confidence, stable=True).indices[:count]] = True
    return chosen
