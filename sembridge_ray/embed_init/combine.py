"""Composition: new rows E_t[i] = Σ_j w_ij E_s[j] (sparse CSR x dense), the decoder bias by policy,
and the provenance of every target row."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from sembridge_ray.data.schema import KIND, PROVENANCE_SCHEMA, SOURCE_IDS, TARGET_ID, TOKEN, WEIGHTS
from sembridge_ray.embed_init.vocab import Partition


@dataclass(frozen=True, kw_only=True)
class NewRows:
    """The bridged target ids (in ``target_ids`` order) with their rows. ``weights`` (CSR over
    source ids) is None for rules without token-level evidence (mean, random); ``outputs``/``bias``
    only when the source has an untied output matrix / a decoder bias."""

    target_ids: np.ndarray
    inputs: torch.Tensor
    weights: torch.Tensor | None = None
    outputs: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def csr_lists(weights: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per row of a CSR matrix: (source ids int32, weights float32)."""
    crow = weights.crow_indices().numpy()
    cols = weights.col_indices().numpy().astype(np.int32)
    vals = weights.values().numpy().astype(np.float32)
    spans = list(itertools.pairwise(crow))
    return [cols[a:b] for a, b in spans], [vals[a:b] for a, b in spans]


def weighted_rows(weights: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """CSR (n, M) x (M, d) -> (n, d), accumulated in float64 in CSR order.

    Not ``torch.sparse.mm``: each row's result must not depend on which other rows share its batch,
    so that the Ray pipeline (batches) and the in-process path (one call) agree bit for bit."""
    crow = weights.crow_indices()
    rows = torch.repeat_interleave(torch.arange(len(crow) - 1), crow[1:] - crow[:-1])
    terms = source[weights.col_indices()].double() * weights.values().double().unsqueeze(-1)
    out = torch.zeros((len(crow) - 1, *source.shape[1:]), dtype=torch.float64).index_add_(
        0, rows, terms
    )
    return out.to(source.dtype)


def compose(
    part: Partition,
    source: torch.Tensor,
    new_rows: torch.Tensor,
    target_ids: np.ndarray,
    fill: torch.Tensor,
) -> torch.Tensor:
    """Target matrix (|Vt|, ...) from a source one (|Vs|, ...): copies for specials and overlap,
    ``new_rows`` at ``target_ids``, ``fill`` elsewhere (unused ids)."""
    out = fill.to(source.dtype).expand(part.size, *source.shape[1:]).clone()
    copies = {**part.overlap, **part.specials}
    if copies:
        out[torch.tensor(list(copies), dtype=torch.long)] = source[
            torch.tensor([s for s, _ in copies.values()], dtype=torch.long)
        ]
    if len(target_ids):
        out[torch.as_tensor(target_ids, dtype=torch.long)] = new_rows.to(source.dtype)
    return out


def compose_bias(part: Partition, new: NewRows, bias: torch.Tensor, policy: str) -> torch.Tensor:
    """The target decoder bias: ``remap`` composes it like the rows (copies, Σ w b_s, the mean for
    rows without weights), ``index`` keeps position i's bias (zero past the source size: HF
    ``resize_token_embeddings``), ``zero`` zeros it; ``frequency`` composes like ``remap``
    (``new.bias`` holds the frequency prior)."""
    if policy == "zero":
        return torch.zeros(part.size, dtype=bias.dtype)
    if policy == "index":
        out = torch.zeros(part.size, dtype=bias.dtype)
        out[: len(bias)] = bias[: part.size]
        return out
    if policy not in ("remap", "frequency"):
        raise ValueError(f"unknown bias policy {policy!r}")
    new_bias = new.bias if new.bias is not None else bias.mean().expand(len(new.target_ids))
    return compose(part, bias, new_bias, new.target_ids, bias.mean())


def provenance(part: Partition, new: NewRows, tokens: dict[int, str]) -> pa.Table:
    """One row per target id: kind in {overlap, special, bridge, random}, source ids and weights."""
    kinds = ["random"] * part.size
    ids: list[np.ndarray] = [np.zeros(0, np.int32)] * part.size
    ws: list[np.ndarray] = [np.zeros(0, np.float32)] * part.size
    one = np.array([1.0], np.float32)  # read only: shared by every copied row
    for kind, table in (("overlap", part.overlap), ("special", part.specials)):
        for tid, (sid, _) in table.items():
            kinds[tid], ids[tid], ws[tid] = kind, np.array([sid], np.int32), one
    if new.weights is not None:
        cols, vals = csr_lists(new.weights)
        for tid, c, v in zip(new.target_ids.tolist(), cols, vals, strict=True):
            kinds[tid], ids[tid], ws[tid] = "bridge", c, v
    return pa.table(
        {
            TARGET_ID: pa.array(np.arange(part.size, dtype=np.int32)),
            TOKEN: pa.array([tokens.get(i, "") for i in range(part.size)], pa.string()),
            KIND: pa.array(kinds, pa.string()),
            SOURCE_IDS: pa.array([a.tolist() for a in ids], pa.list_(pa.int32())),
            WEIGHTS: pa.array([a.tolist() for a in ws], pa.list_(pa.float32())),
        },
        schema=PROVENANCE_SCHEMA,
    )
