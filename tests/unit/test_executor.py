"""The in-process executor: a pool's worker reused by the next call of the same settings and freed
by another's, torch's thread count set for the work and put back, shared objects handed to the
worker, every block counted into the progress; a training's body handed the stream's global batches
in order, its checkpoints laid out whole under the run, resumed from the newest."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sembridge_ray.runtime.executor import LocalExecutor, Pool, Tasks, TrainContext, Training
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


def _body(config: Mapping[str, object], ctx: TrainContext) -> None:
    """A worker that keeps each global batch's ids and checkpoints after each, with the thread
    count it ran with."""
    out = Path(str(config["out"]))
    seen = [list(b["id"]) for b in ctx.batches(int(str(config["size"])))]
    with ctx.registered() as registered:
        assert registered is None  # nothing registers a checkpoint in this process
    for step, ids in enumerate(seen, start=1):
        with ctx.checkpoint({"step": step}, f"step_{step}") as part:
            assert not any(part.iterdir()) and part.parent == out / "run"
            (part / "ids.json").write_text(json.dumps(ids))
    (out / "threads").write_text(str(torch.get_num_threads()))


def _training(tmp_path: Path, workers: int = 1, storage: str = "") -> tuple[Training, list[str]]:
    stream = tmp_path / "stream.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(7)]}), stream, row_group_size=3)
    calls: list[str] = []
    training = Training(
        body=_body,
        config={"out": str(tmp_path), "size": 3},
        stream=stream,
        plan=Placement(workers=workers, cpus_per_worker=1.0, gpus_per_worker=0.0),
        storage=storage or str(tmp_path),
        name="run",
        keep=2,
        max_failures=0,
        set_aside=calls.append,
        newest=lambda run_dir: (2, Path(run_dir) / "step_2") if calls else None,
    )
    return training, calls


def test_a_training_reads_every_global_batch_in_order_and_checkpoints_under_its_run(
    tmp_path: Path,
) -> None:
    training, calls = _training(tmp_path)
    executor, before = LocalExecutor(), torch.get_num_threads()
    assert executor.resume_step(training) is None
    with executor.train(training) as final:
        assert final is None  # read from <run_dir>/<name>
    assert calls == [str(tmp_path / "run")]  # damaged checkpoints set aside first
    rows = pq.read_table(training.stream)["id"].to_pylist()
    # the last, partial batch is dropped, as Ray Train's drop_last does
    written = [
        json.loads((tmp_path / "run" / f"step_{s}" / "ids.json").read_text()) for s in (1, 2)
    ]
    assert written == [rows[0:3], rows[3:6]]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["step_1", "step_2"]
    assert (tmp_path / "threads").read_text() == "1"  # the worker's CPU share
    assert torch.get_num_threads() == before
    assert executor.resume_step(training) == 2


@pytest.mark.parametrize(("workers", "storage"), [(2, ""), (1, "s3://bucket/ckpt")])
def test_a_training_in_process_is_one_worker_with_checkpoints_on_a_path(
    tmp_path: Path, workers: int, storage: str
) -> None:
    training, _ = _training(tmp_path, workers, storage)
    with pytest.raises(ValueError, match="one worker and checkpoints on a path"):
        LocalExecutor().train(training)
