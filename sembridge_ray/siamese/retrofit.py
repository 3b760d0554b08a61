"""Retrofitting word vectors to a lexicon (Faruqui et al., NAACL 2015).

Minimises Σ_i [α‖q_i − q̂_i‖² + Σ_{j∈N(i)} β_ij ‖q_i − q_j‖²] with α = 1 and β_ij = 1/deg(i), by the
paper's closed-form coordinate update

    q_i ← (α q̂_i + Σ_j β_ij q_j) / (α + Σ_j β_ij) = (q̂_i + mean_{j∈N(i)} q_j) / 2,

applied to every word at once (Jacobi; the released code updates in place, word by word, and
converges to the same minimum). Words without neighbours keep their vectors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy import sparse


def retrofit(
    vectors: np.ndarray, neighbours: Sequence[Sequence[int]], iterations: int, alpha: float = 1.0
) -> np.ndarray:
    """vectors (N, D), neighbours[i] = row ids of N(i) -> retrofitted (N, D) float32 after
    ``iterations`` updates."""
    rows = [i for i, nbrs in enumerate(neighbours) for _ in nbrs]
    cols = [j for nbrs in neighbours for j in nbrs]
    deg = np.array([len(n) for n in neighbours], dtype=np.float64)
    # β_ij = 1/deg(i): each row of the adjacency averages its neighbours
    weights = [1.0 / deg[i] for i in rows]
    mean_of_neighbours = sparse.csr_matrix((weights, (rows, cols)), shape=(len(neighbours),) * 2)
    has = (deg > 0)[:, None]
    original = vectors.astype(np.float64)
    q = original.copy()
    for _ in range(iterations):
        q = np.where(has, (alpha * original + mean_of_neighbours @ q) / (alpha + 1.0), original)
    return q.astype(np.float32)


def thesaurus_neighbours(
    words: Sequence[str], thesaurus: Mapping[str, Sequence[str]]
) -> list[list[int]]:
    """neighbours[i] for ``words``: the other words whose lower-cased forms the thesaurus links to
    words[i]'s in either direction (the lexicon is made symmetric, as the paper's WordNet graph is),
    self-links dropped."""
    rows: dict[str, list[int]] = {}
    for i, word in enumerate(words):
        rows.setdefault(word.lower(), []).append(i)
    links: dict[str, set[str]] = {}
    for head, candidates in thesaurus.items():
        for cand in candidates:
            if head in rows and cand in rows and cand != head:
                links.setdefault(head, set()).add(cand)
                links.setdefault(cand, set()).add(head)
    return [sorted(j for other in links.get(w.lower(), ()) for j in rows[other]) for w in words]
