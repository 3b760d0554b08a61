"""SemBridge+'s options on top of the released rule (docs/sembridge-plus.md has the ablation and the
recipe kept).

- **Bridge-space post-processing** (``bridge_space``). Single-token embeddings of a sentence encoder
  are anisotropic: their cosines crowd together, and α=4's narrow supports then hang on tiny gaps.
  One transform is fit on the union of the bridge candidates' vectors and the vectors of the target
  tokens to initialise, and applied to both before the weights are solved: ``center`` subtracts the
  mean; ``abtt`` ("all but the top", Mu & Viswanath, ICLR 2018) also removes the top
  ``bridge_components`` principal directions; ``whiten`` maps the centred vectors to unit variance
  along every principal direction (ZCA); ``relative`` compares tokens by their cosines to the
  anchors (TokAlign, Li et al., ACL 2025: the source tokens some target token matches exactly).
  Closed form: numpy's eigendecomposition is the oracle.

Why ``relative`` is a D x D map and not the anchor-cosine vectors themselves: with the unit anchors
A (K, D), ``cos(x A^T, y A^T) = x M y / (|x|_M |y|_M)`` for ``M = A^T A``, so ``x -> x M^(1/2)``
gives the same cosines with D columns instead of K (thousands of anchors against a few hundred
dimensions); the test checks it against the K-column vectors.
- **A compositional prior** (``fvt_weight``, FVT: Gee et al., 2022). The target piece's canonical
  form (its word position kept: ``▁play`` word-initial, ``ing`` a continuation) is cut greedily,
  longest first, into canonical forms of the source vocabulary (falling back to lower case for an
  uncased source); the uniform mix of those source rows is blended with the bridge weights, ``(1 -
  λ) w_bridge + λ w_fvt``, so the row stays a convex mix. Characters no source form covers are
  dropped (FVT's UNK); a piece with no cover keeps its bridge weights. The ``fvt`` baseline method
  is this decomposition alone (the mean source row for a piece it cannot cover).

- **Least-squares weights** (``lsq_ridge``, after SALT, ACL Findings 2025: keep entmax to choose the
  support, then fit the weights). Each row's weights are refit over its support as the affine mix of
  the support's unit bridge vectors closest to the token's own, with a ridge towards the entmax (and
  FVT) weights: the larger ``lsq_ridge``, the closer to the released weights. Closed form
  (Lagrange); the test solves the KKT system with numpy.

- **Adaptive sparsity** (``adaptive_support``): α and the temperature are global in the released
  rule, so every token gets whatever support its cosines give. Here each row gets its own
  temperature so that its support has a target size: the number of source forms its FVT
  decomposition has (``fvt``; ``support_size`` where it has none) or ``support_size`` for all
  (``fixed``). The temperature is closed-form (``weighting.support_temperature``), and the rows stay
  exact α-entmax of their full rows at that temperature.
- **A decoder-bias prior** (``bias: frequency``): the bridged rows' MLM decoder bias from how often
  the target tokenizer produces each token on target-language text (``bias_text``): log(1 + count),
  standardised over the bridged tokens, then shifted and scaled to the source bias' mean and spread
  (a masked LM's bias is a unigram log-prior: frequent tokens higher). Copied rows keep their own
  bias.
- **A random component** (``random_blend``): each bridged row blended with the ``random`` baseline's
  row for the same token, ``(1 - β) E_bridge + β E_random`` (input and untied output rows; the bias
  keeps the bridge's). It tests one reading of the ``random`` baseline's zero-shot score on
  vocabularies that cut words into fragments: distinct rows keep unrelated fragments apart, where
  bridged mixes of them are near-identical.

Why the decomposition is not the source tokenizer's own ``tokenize``: a continuation piece (``ing``
inside a word) has no text of its own that every source tokenizer splits as a continuation; cutting
canonical forms keeps the word position for any pair of vocabulary families (``embed_init.vocab``).
"""

from __future__ import annotations

import itertools
import typing
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from sembridge_ray.embed_init.config import BridgeSpace
from sembridge_ray.embed_init.vocab import VocabIndex, canonical, tokenizer_family
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.sparse.csr import csr_from_sorted

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BRIDGE_SPACES: tuple[str, ...] = typing.get_args(BridgeSpace)
_WHITEN_FLOOR = 1e-6
"""Eigenvalues below this share of the largest are floored there when whitening (rank-deficient
unions)."""


def space_transform(
    vectors: torch.Tensor, mode: str, components: int, anchors: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The affine map ``x -> (x - mean) @ matrix`` of ``mode`` fit on ``vectors`` (n, D) in float64:
    (mean (D,), matrix (D, D)); None for ``raw``. ``abtt`` removes the top ``components`` principal
    directions; ``relative`` needs ``anchors`` (K, D), the anchor tokens' vectors."""
    if mode == "raw":
        return None
    if mode not in BRIDGE_SPACES:
        raise ValueError(f"unknown bridge_space {mode!r} (known: {', '.join(BRIDGE_SPACES)})")
    if mode == "relative":
        if anchors is None or not len(anchors):
            raise InputError(
                "bridge_space=relative: no source token matches a target token exactly (no anchors to compare by); "
                "use bridge_space whiten or another method"
            )
        unit = torch.nn.functional.normalize(anchors.double(), dim=1)
        values, vecs = torch.linalg.eigh(unit.T @ unit)
        root = vecs @ torch.diag(values.clamp_min(0).sqrt()) @ vecs.T
        return torch.zeros(vectors.shape[1], dtype=torch.float64), root
    x = vectors.double()
    mean = x.mean(0)
    dim = x.shape[1]
    if mode == "center":
        return mean, torch.eye(dim, dtype=torch.float64)
    centred = x - mean
    values, vecs = torch.linalg.eigh(centred.T @ centred / max(len(x), 1))  # ascending eigenvalues
    if mode == "abtt":
        # removing every direction maps every token to the mean: no bridge left
        if components >= dim:
            raise InputError(
                f"bridge_components={components}: must be below the bridge's dimension {dim} (abtt removes that many "
                "principal directions)"
            )
        top = vecs[:, dim - components :]
        return mean, torch.eye(dim, dtype=torch.float64) - top @ top.T
    floor = _WHITEN_FLOOR * float(values.max().clamp_min(1e-300))
    return mean, vecs @ torch.diag(values.clamp_min(floor).rsqrt()) @ vecs.T


def apply_transform(
    x: torch.Tensor, fitted: tuple[torch.Tensor, torch.Tensor] | None
) -> torch.Tensor:
    """``x`` (n, D) mapped by :func:`space_transform`'s result, in float64, returned as float32."""
    if fitted is None:
        return x
    mean, matrix = fitted
    return ((x.double() - mean) @ matrix).float()


def decompose(canon: str, index: VocabIndex, folded: dict[str, int], longest: int) -> list[int]:
    """Source ids covering canonical form ``canon``: greedy longest match left to right over source
    canonical forms (exact, then lower-cased); an uncovered character is skipped."""
    out: list[int] = []
    i, n = 0, len(canon)
    while i < n:
        for j in range(min(n, i + longest), i, -1):
            piece = canon[i:j]
            hit = index.exact.get(piece)
            if hit is None:  # the case-folded lookup only on a miss
                hit = folded.get(piece.lower())
            if hit is not None:
                out.append(hit)
                i = j
                break
        else:
            i += 1
    return out


def folded_index(index: VocabIndex) -> dict[str, int]:
    """Lower-cased canonical form -> source id: an already lower-case form first, then the lowest
    id."""
    folded: dict[str, int] = {}
    for canon, sid in sorted(index.exact.items(), key=lambda kv: (kv[0] != kv[0].lower(), kv[1])):
        folded.setdefault(canon.lower(), sid)
    return folded


def fvt_weights(
    source: PreTrainedTokenizerBase,
    target: PreTrainedTokenizerBase,
    target_ids: Iterable[int],
    m: int,
) -> torch.Tensor:
    """CSR (n, m) float32: each target id's uniform mix over its decomposition (:func:`decompose`; a
    repeated piece counts as often as it occurs), rows in ``target_ids`` order; an empty row where
    nothing covers it."""
    index = VocabIndex.build(
        source.get_vocab(), tokenizer_family(source), exclude=source.all_special_ids
    )
    folded = folded_index(index)
    longest = max((len(c) for c in index.exact), default=1)
    family = tokenizer_family(target)
    tokens = {i: t for t, i in target.get_vocab().items()}
    ids = [int(t) for t in target_ids]
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for row, tid in enumerate(ids):
        form = canonical(tokens[tid], family) if tid in tokens else ""
        pieces = decompose(form, index, folded, longest)
        for sid, count in sorted(Counter(pieces).items()):
            rows.append(row)
            cols.append(sid)
            vals.append(count / len(pieces))
    return _csr(np.array(rows), np.array(cols), np.array(vals), len(ids), m)


def select_rows(weights: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (r,) of a CSR matrix, in that order, as a CSR (r, m)."""
    crow = weights.crow_indices()
    starts, lengths = crow[rows], crow[rows + 1] - crow[rows]
    new_crow = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    offsets = torch.arange(int(new_crow[-1])) - torch.repeat_interleave(new_crow[:-1], lengths)
    take = torch.repeat_interleave(starts, lengths) + offsets
    return torch.sparse_csr_tensor(
        new_crow,
        weights.col_indices()[take],
        weights.values()[take],
        size=(len(rows), weights.shape[1]),
        check_invariants=False,
    )


def blend(bridge: torch.Tensor, prior: torch.Tensor, weight: float) -> torch.Tensor:
    """CSR ``(1 - weight) bridge + weight prior`` row by row (float64 sums, float32 out),
    renormalised to sum to 1; a row whose prior is empty keeps its bridge weights. Both (n, m), rows
    summing to 1."""
    n, m = bridge.shape
    has = (prior.crow_indices()[1:] - prior.crow_indices()[:-1]) > 0
    parts = []
    for w, scale in (
        (bridge, torch.where(has, 1.0 - weight, 1.0)),
        (prior, torch.full((n,), weight)),
    ):
        crow = w.crow_indices()
        row = torch.repeat_interleave(torch.arange(n), crow[1:] - crow[:-1])
        parts.append((row, w.col_indices(), w.values().double() * scale.double()[row]))
    row, col, val = (torch.cat(x) for x in zip(*parts, strict=True))
    coo = torch.sparse_coo_tensor(
        torch.stack([row, col]), val, (n, m), check_invariants=False
    ).coalesce()
    (r, c), v = coo.indices(), coo.values()
    keep = v > 0
    r, c, v = r[keep], c[keep], v[keep]
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, r, v)
    return csr_from_sorted(r, c, (v / sums[r]).float(), n, m)


def least_squares(
    weights: torch.Tensor, new_vecs: torch.Tensor, source_vecs: torch.Tensor, ridge: float
) -> torch.Tensor:
    """Each row's weights refit over its support J (SALT's least-squares step): with the unit bridge
    vectors B_J and b of the token, ``argmin |B_J^T w - b|^2 + ridge |w - w0|^2`` subject to ``sum w
    = 1`` (Lagrange, closed form), ``w0`` the row's weights. Rows of one entry stay 1; weights may
    turn negative (an affine mix). CSR (n, m) float32 in, the same sparsity out."""
    n, m = weights.shape
    crow = weights.crow_indices().numpy()
    cols = weights.col_indices().numpy()
    vals = weights.values().double().numpy().copy()
    unit = torch.nn.functional.normalize(
        source_vecs[torch.from_numpy(cols)].double(), dim=1
    ).numpy()  # (nnz, D)
    target = torch.nn.functional.normalize(new_vecs.double(), dim=1).numpy()
    for r in range(n):  # supports are a handful of entries: one tiny solve per row
        lo, hi = crow[r], crow[r + 1]
        if hi - lo < 2:
            continue
        basis = unit[lo:hi]  # (|J|, D)
        system = basis @ basis.T + ridge * np.eye(hi - lo)
        free = np.linalg.solve(system, basis @ target[r] + ridge * vals[lo:hi])
        ones = np.linalg.solve(system, np.ones(hi - lo))
        vals[lo:hi] = free - ones * (free.sum() - 1.0) / ones.sum()
    return _csr(np.repeat(np.arange(n), np.diff(crow)), cols, vals, n, m)


def support_sizes(prior: torch.Tensor | None, n: int, mode: str, size: int) -> torch.Tensor | None:
    """(n,) support targets of the bridged rows for ``adaptive_support`` ``mode`` (None for
    ``off``): ``fixed`` gives ``size`` to every row; ``fvt`` the number of source forms in each
    row's decomposition (CSR ``prior`` (n, m)), ``size`` where the piece has none."""
    if mode == "off":
        return None
    sizes = torch.full((n,), size, dtype=torch.int64)
    if mode == "fvt":
        if prior is None:
            raise ValueError("adaptive_support=fvt needs the decomposition weights")
        counts = prior.crow_indices()[1:] - prior.crow_indices()[:-1]
        sizes = torch.where(counts > 0, counts, sizes)
    return sizes


def token_counts(tokenizer: PreTrainedTokenizerBase, texts: Iterable[str]) -> dict[int, int]:
    """How often ``tokenizer`` produces each id on ``texts`` (no specials)."""
    counts: Counter[int] = Counter()
    stream = iter(texts)
    while batch := list(itertools.islice(stream, 1024)):  # tokenized 1024 texts at a time
        for row in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            counts.update(row)
    return dict(counts)


def log_frequencies(counts: Mapping[int, int], ids: np.ndarray) -> np.ndarray:
    """(len(ids),) float64: log(1 + the count of each of ``ids``) in ``counts``
    (:func:`token_counts`)."""
    return np.log1p(np.array([counts.get(int(i), 0) for i in ids], dtype=np.float64))


def frequency_bias(log_freq: np.ndarray, source_bias: torch.Tensor) -> torch.Tensor:
    """The bridged rows' decoder bias (n,) from their log-frequencies (n,): standardised over them,
    then at the mean and spread (population std, float64) of ``source_bias``; all at the mean where
    the frequencies do not vary. Returned in ``source_bias``'s dtype."""
    src = source_bias.double()
    spread = float(log_freq.std()) if len(log_freq) else 0.0
    z = (log_freq - log_freq.mean()) / spread if spread > 0 else np.zeros_like(log_freq)
    return (src.mean() + src.std(unbiased=False) * torch.from_numpy(z)).to(source_bias.dtype)


def _csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int, m: int) -> torch.Tensor:
    """Entries sorted row-major without duplicates -> CSR float32."""
    row_ids, col_ids = (torch.from_numpy(a.astype(np.int64)) for a in (rows, cols))
    return csr_from_sorted(row_ids, col_ids, torch.from_numpy(vals.astype(np.float32)), n, m)
