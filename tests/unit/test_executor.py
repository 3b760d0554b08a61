"""The in-process executor: a pool's worker reused by the next call of the same settings and freed
by another's, torch's thread count set for the work and put back, shared objects handed to the
worker, and every block counted into the progress."""

from __future__ import annotations

import logging

import pyarrow as pa
import torch

from sembridge_ray.runtime.executor import LocalExecutor, Pool, Tasks
from sembridge_ray.runtime.placement import Placement, ResourceConfig
from sembridge_ray.runtime.progress import Progress

PLAN = Placement(workers=1, cpus_per_worker=1.0, gpus_per_worker=0.0)
built: list[dict[str, object]] = []


class Scale:
    """Multiplies column x by ``factor`` (plus ``offset``, a shared object); records its build and
    the thread count it ran with."""

    def __init__(self, factor: int, device: str, offset: object = 0) -> None:
        built.append({"factor": factor, "device": device, "offset": offset})
        self.factor, self.offset = factor, offset

    def __call__(self, batch: pa.Table) -> pa.Table:
        xs = [x * self.factor + int(str(self.offset)) for x in batch["x"].to_pylist()]
        return pa.table({"x": xs, "threads": [torch.get_num_threads()] * len(xs)})


def _progress(total: int) -> Progress:
    return Progress(logging.getLogger("test"), "scaling", total, "rows")


def test_map_blocks_builds_a_worker_once_and_restores_threads() -> None:
    built.clear()
    executor, before = LocalExecutor(), torch.get_num_threads()
    blocks = [pa.table({"x": [1, 2]}), pa.table({"x": [3]})]
    pool = Pool(udf=Scale, kwargs={"factor": 10}, plan=PLAN, threads=1)
    first = _progress(3)
    out = executor.map_blocks(pool, blocks, 3, first)
    again = executor.map_blocks(pool, blocks, 3, _progress(3))
    assert (
        [t["x"].to_pylist() for t in out] == [[10, 20], [30]] == [t["x"].to_pylist() for t in again]
    )
    assert {n for t in out for n in t["threads"].to_pylist()} == {1}
    assert torch.get_num_threads() == before
    assert built == [{"factor": 10, "device": "cpu", "offset": 0}]  # once, on the CPU
    assert first.done == 3
    executor.map_blocks(Pool(udf=Scale, kwargs={"factor": 3}, plan=PLAN), blocks, 3, _progress(3))
    executor.map_blocks(pool, blocks, 3, _progress(3))
    assert [b["factor"] for b in built] == [10, 3, 10]  # the last worker only is kept


def test_shared_objects_reach_the_worker_and_are_never_reused() -> None:
    built.clear()
    executor = LocalExecutor()
    pool = Pool(udf=Scale, kwargs={"factor": 2}, plan=PLAN, shared={"offset": "5"})
    for _ in range(2):
        out = executor.map_blocks(pool, [pa.table({"x": [1]})], 1, _progress(1))
        assert out[0]["x"].to_pylist() == [7]
    assert len(built) == 2 and built[0]["offset"] == "5"


def test_tasks_run_in_order_with_shared_arguments_and_no_gpu() -> None:
    executor = LocalExecutor()
    got = list(
        executor.map_tasks(lambda a, b: a - b, [(1,), (2,)], Tasks(cpus=1, width=1, shared=(10,)))
    )
    assert got == [9, 8]
    assert not executor.placement(ResourceConfig(gpus_per_worker=1.0)).use_gpu
    assert executor.precision("auto", ResourceConfig()) == "fp32"
