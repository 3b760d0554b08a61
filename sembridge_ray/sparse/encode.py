"""Dense or torch-sparse (B, V) activations -> Arrow rows of (indices, values)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import torch

from sembridge_ray.data.schema import ID, INDICES, SPARSE_SCHEMA, VALUES


def sparse_rows(emb: torch.Tensor, top_k: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """emb (B, V), dense or sparse -> per row: indices (int32, ascending) and values (float32, > 0).

    ``top_k`` keeps each row's k largest values (ties broken by lower index), for ``--doc-top-k`` pruning.
    """
    dense = (emb.to_dense() if emb.is_sparse else emb).detach().float().cpu()
    indices, values = [], []
    for row in dense:
        nz = torch.nonzero(row > 0).squeeze(1)
        vals = row[nz]
        if top_k is not None and nz.numel() > top_k:
            # stable sort of -value keeps the lower index first among equal values
            keep = torch.sort(torch.argsort(-vals, stable=True)[:top_k]).values
            nz, vals = nz[keep], vals[keep]
        indices.append(nz.numpy().astype(np.int32))
        values.append(vals.numpy().astype(np.float32))
    return indices, values


def sparse_table(ids: Sequence[str], indices: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> pa.Table:
    """Rows -> a table with ``id`` string, ``indices`` list<int32>, ``values`` list<float32>."""

    def lists(arrays: Sequence[np.ndarray], dtype: pa.DataType) -> pa.Array:
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=dtype))

    return pa.Table.from_arrays(
        [pa.array(list(ids), pa.string()), lists(indices, pa.int32()), lists(values, pa.float32())],
        schema=SPARSE_SCHEMA,
    )


def table_rows(table: pa.Table) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """The inverse of :func:`sparse_table`."""
    ids = table.column(ID).to_pylist()
    idx = [np.asarray(v, dtype=np.int32) for v in table.column(INDICES).to_pylist()]
    val = [np.asarray(v, dtype=np.float32) for v in table.column(VALUES).to_pylist()]
    return ids, idx, val
