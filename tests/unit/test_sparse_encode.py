from __future__ import annotations

import numpy as np
import torch

from sembridge_ray.sparse.encode import sparse_rows, sparse_table, table_rows


def test_rows_round_trip_through_arrow() -> None:
    dense = torch.tensor([[0.0, 1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]])
    idx, val = sparse_rows(dense.to_sparse())
    table = sparse_table(["a", "b", "c"], idx, val)
    assert str(table.schema.field("indices").type) == "list<item: int32>"
    ids, idx2, val2 = table_rows(table)
    assert ids == ["a", "b", "c"]
    rebuilt = np.zeros((3, 4), dtype=np.float32)
    for r, (i, v) in enumerate(zip(idx2, val2, strict=True)):
        rebuilt[r, i] = v
    np.testing.assert_array_equal(rebuilt, dense.numpy())


def test_top_k_keeps_largest_and_breaks_ties_by_lower_index() -> None:
    idx, val = sparse_rows(torch.tensor([[1.0, 2.0, 2.0, 0.5, 2.0]]), top_k=2)
    assert idx[0].tolist() == [1, 2] and val[0].tolist() == [2.0, 2.0]
