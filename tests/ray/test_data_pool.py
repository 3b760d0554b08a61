"""A Ray Data actor pool writes sparse Parquet files with list columns, equal to in-process
encoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from sembridge_ray.data.schema import ID, SPARSE_SCHEMA, TEXT
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.udfs import PATH, ROWS, SparseEncodeUDF, actor_pool_args
from sembridge_ray.placement import ResourceConfig
from sembridge_ray.retrieval.store import stage_corpus
from sembridge_ray.sparse.encode import sparse_rows, table_rows
from sembridge_ray.sparse.model import load_sparse_encoder
from sembridge_ray.testing import source_text


def test_actor_pool_writes_list_columns_equal_to_in_process(
    ray_cluster: cluster.ClusterInfo, fixtures_root: Path, tmp_path: Path
) -> None:
    texts = source_text()[:40]
    model = str(fixtures_root / "bert-mlm")
    plan = cluster.placement(ResourceConfig(workers=2))
    assert plan.workers == 1 and not plan.use_gpu  # 2 CPUs: one held back for Ray Data's own tasks
    table = pa.table({ID: [f"t{i}" for i in range(len(texts))], TEXT: texts})
    files = stage_corpus(
        (table.slice(i, 15) for i in range(0, len(texts), 15)), tmp_path / "staged"
    )
    ds = ray.data.from_items([{PATH: str(f)} for f in files], override_num_blocks=len(files))
    enc = tmp_path / "enc"
    enc.mkdir()
    out = ds.map_batches(
        SparseEncodeUDF,
        fn_constructor_kwargs={
            "model_dir": model,
            "max_length": 32,
            "batch_size": 16,
            "out_dir": str(enc),
        },
        batch_format="pyarrow",
        **actor_pool_args(plan, 1),
    ).take_all()

    # one row per staged file: the file the actor wrote (same name, in out_dir) and its row count
    assert sorted(r[PATH] for r in out) == sorted(str(enc / f.name) for f in files)
    assert sum(r[ROWS] for r in out) == len(texts)
    table = pq.read_table(enc)
    assert table.schema.equals(SPARSE_SCHEMA, check_metadata=False)
    ids, idx, val = table_rows(table)
    expected_idx, expected_val = sparse_rows(
        load_sparse_encoder(model, max_length=32).encode(texts, convert_to_tensor=True)
    )
    order = {i: n for n, i in enumerate(ids)}
    assert sorted(order) == sorted(f"t{i}" for i in range(len(texts)))
    for n in range(len(texts)):
        got = order[f"t{n}"]
        np.testing.assert_array_equal(idx[got], expected_idx[n])
        np.testing.assert_allclose(val[got], expected_val[n], rtol=1e-5, atol=1e-6)
