"""The Ray executor's actor pool writes sparse Parquet files with list columns, equal to in-process
encoding, and its tasks equal the in-process executor's."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sembridge_ray.data.schema import ID, SPARSE_SCHEMA, TEXT
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.retrieval.store import stage_corpus
from sembridge_ray.runtime.executor import Held, LocalExecutor, Pool, Tasks
from sembridge_ray.runtime.placement import ResourceConfig
from sembridge_ray.runtime.progress import Progress
from sembridge_ray.sparse.encode import sparse_rows, table_rows
from sembridge_ray.sparse.encode_files import PATH, ROWS, SparseEncodeUDF
from sembridge_ray.sparse.model import load_sparse_encoder
from sembridge_ray.testing import source_text


def test_actor_pool_writes_list_columns_equal_to_in_process(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    texts = source_text()[:40]
    model = str(fixtures_root / "bert-mlm")
    executor = RayExecutor()
    plan = executor.placement(ResourceConfig(workers=2))
    assert plan.workers == 1 and not plan.use_gpu  # 2 CPUs: one held back for Ray Data's own tasks
    monkeypatch.setattr(cluster, "in_driver", lambda plan, rows: False)  # an actor pool, not here
    table = pa.table({ID: [f"t{i}" for i in range(len(texts))], TEXT: texts})
    files = stage_corpus(
        (table.slice(i, 15) for i in range(0, len(texts), 15)), tmp_path / "staged"
    )
    enc = tmp_path / "enc"
    enc.mkdir()
    kwargs = {"model_dir": model, "max_length": 32, "batch_size": 16, "out_dir": str(enc)}
    blocks = [pa.table({PATH: [str(f)]}) for f in files]
    progress = Progress(logging.getLogger("test"), "encoding", len(texts), "texts")
    out = executor.map_blocks(
        Pool(udf=SparseEncodeUDF, kwargs=kwargs, plan=plan),
        blocks,
        len(texts),
        progress,
        lambda t: t[ROWS][0].as_py(),
    )
    assert progress.done == len(texts)
    out = pa.concat_tables(out).to_pylist()

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


def _square_plus(shared: int, x: int) -> int:
    return shared + x * x


def test_tasks_equal_in_process_tasks(ray_cluster: cluster.ClusterInfo) -> None:
    """Ray tasks, two at a time with a shared leading argument, return what the in-process executor
    returns for the same calls (in the order they finish)."""
    calls = [(x,) for x in range(7)]
    spec = Tasks(cpus=0.5, width=2, shared=(100,))
    on_ray = sorted(RayExecutor().map_tasks(_square_plus, calls, spec))
    assert on_ray == list(LocalExecutor().map_tasks(_square_plus, calls, spec))
    assert on_ray == [100 + x * x for x in range(7)]


def _handle(executor: RayExecutor) -> tuple[str, object]:
    return type(executor).__name__, executor.local._last


def test_an_executor_sent_to_a_task_is_a_fresh_handle(ray_cluster: cluster.ClusterInfo) -> None:
    """A reproduction's cells get its executor as a task argument: they get a handle on the same
    cluster, never the in-process worker (a loaded bridge model) the driver's handle holds."""
    weights = np.zeros(1 << 20)  # 8 MiB the task must not get

    def worker(batch: pa.Table) -> pa.Table:  # a pool's worker, holding its model
        assert weights.size
        return batch

    executor = RayExecutor()
    executor.local._last = ("a pool's settings", worker)
    got = list(executor.map_tasks(_handle, [(executor,)], Tasks(cpus=0.5, width=2)))
    assert got == [("RayExecutor", None)]


class _Counter:
    """A held object: its start and what it was asked, and the process that holds it."""

    def __init__(self, start: int) -> None:
        self.start = start

    def plus(self, x: int) -> tuple[int, int]:
        import os

        return self.start + x, os.getpid()


def _answers(held: Held, x: int) -> list[tuple[int, int]]:
    return cast(list[tuple[int, int]], held.answers(held.ask("plus", x)))


def test_held_objects_on_actors_answer_as_in_process(
    ray_cluster: cluster.ClusterInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each object held by an actor of its own (not this process), asked at once, the answers in
    the objects' order, as the in-process executor answers; a small input stays in this process."""
    import os

    here = LocalExecutor().hold(_Counter, [10, 20, 30], size=3, cpus=0.5)
    monkeypatch.setattr(cluster, "IN_DRIVER_ROWS", 0)
    held = RayExecutor().hold(_Counter, [10, 20, 30], size=3, cpus=0.5)
    try:
        asked = [held.ask("plus", x) for x in (1, 2)]  # both in flight
        answers = [cast(list[tuple[int, int]], held.answers(a)) for a in asked]
        assert [[v for v, _ in a] for a in answers] == [
            [v for v, _ in _answers(here, x)] for x in (1, 2)
        ]
        assert [v for v, _ in answers[0]] == [11, 21, 31]
        pids = {pid for a in answers for _, pid in a}
        assert len(pids) == 3 and os.getpid() not in pids
    finally:
        held.shutdown()
    monkeypatch.setattr(cluster, "IN_DRIVER_ROWS", 100)
    small = RayExecutor().hold(_Counter, [1], size=3, cpus=0.5)
    assert [pid for _, pid in _answers(small, 0)] == [os.getpid()]
