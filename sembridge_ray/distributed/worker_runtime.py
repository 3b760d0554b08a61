"""Where a fine-tuning worker's body runs (:class:`Runtime`): a Ray Train worker
(:class:`RayRuntime`: its rank, dataset shard, checkpoints and reports) or this process
(:class:`LocalRuntime`: one worker, the stream read in order, checkpoints laid out as Ray
Train's)."""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from sembridge_ray.jobs.finetune import FinetuneConfig
from sembridge_ray.json_types import JSONObject
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.outputs import atomic_path
from sembridge_ray.sparse import loop
from sembridge_ray.sparse.checkpoints import (
    BestState,
    checkpoint_name,
    is_local,
    restore_point,
    write_part,
)


class Runtime:
    """Where a worker's body runs: under Ray Train (:class:`RayRuntime`, in ``train_func``) or in
    one process (:class:`LocalRuntime`, one worker: what the dead-setting tests run). The body,
    :func:`worker_body`, is the same code either way; this says which rank it is, where its batches
    come from, and where checkpoints go."""

    rank = 0
    world = 1
    device: torch.device = torch.device("cpu")

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def restore(self, run_dir: str) -> contextlib.AbstractContextManager[Path | None]:
        return contextlib.nullcontext()

    def batches(
        self, cfg: FinetuneConfig, tokenizer: loop.Tokenize, start: int
    ) -> Iterator[loop.PairBatch]:
        raise NotImplementedError

    def checkpoint(self, metrics: dict[str, float], parts: CheckpointParts) -> None:
        raise NotImplementedError

    def report(self, metrics: dict[str, float]) -> None:
        """Metrics between checkpoints (nothing where no one collects them)."""

    def due(self, since: float, every_s: float) -> bool:
        return False


@dataclass(frozen=True, kw_only=True)
class CheckpointParts:
    """What a checkpoint holds (``write_part`` on each rank: rank 0's state, metrics so far and best
    weights)."""

    state: loop.TrainState
    history: list[dict[str, float]]
    best: BestState | None
    run_config: JSONObject


class RayRuntime(Runtime):
    """A Ray Train worker: its rank, the dataset shard, Ray Train's checkpoints and reports."""

    def __init__(self) -> None:
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return ray.train.torch.prepare_model(model)

    def restore(self, run_dir: str) -> contextlib.AbstractContextManager[Path | None]:
        return _restore_dir(run_dir)

    def batches(
        self, cfg: FinetuneConfig, tokenizer: loop.Tokenize, start: int
    ) -> Iterator[loop.PairBatch]:
        return step_batches(cfg, tokenizer, self.rank, self.world, start, self.device)

    def checkpoint(self, metrics: dict[str, float], parts: CheckpointParts) -> None:
        _report_checkpoint(
            metrics, parts.state, parts.history, self.rank, self.world, parts.best, parts.run_config
        )

    def report(self, metrics: dict[str, float]) -> None:
        ray.train.report(metrics)

    def due(self, since: float, every_s: float) -> bool:
        return _due(since, every_s, self.world, self.device)


class LocalRuntime(Runtime):
    """One worker in this process: the materialised stream read in order, checkpoints written as Ray
    Train lays out a one-worker run's (``<run_dir>/step_<n>``, so :func:`export_checkpoint` reads
    them as the job's), the newest that verifies restored."""

    def __init__(self, stream: Path, run_dir: Path) -> None:
        self.stream, self.run_dir = stream, run_dir

    @contextlib.contextmanager
    def restore(self, run_dir: str) -> Iterator[Path | None]:
        point = restore_point(run_dir)
        yield point[1] if point is not None else None

    def batches(
        self, cfg: FinetuneConfig, tokenizer: loop.Tokenize, start: int
    ) -> Iterator[loop.PairBatch]:
        table = pq.read_table(self.stream)
        size = cfg.optim.batch_size
        raw = (table.slice(i, size).to_pydict() for i in range(0, table.num_rows - size + 1, size))
        return loop.pair_batches(
            raw, tokenizer, cfg.max_query_length, cfg.max_doc_length, skip=start
        )

    def checkpoint(self, metrics: dict[str, float], parts: CheckpointParts) -> None:
        with atomic_path(self.run_dir / checkpoint_name(parts.state["step"])) as tmp:
            tmp.mkdir(parents=True)
            history = "".join(json.dumps(m) + "\n" for m in parts.history)
            write_part(
                tmp,
                0,
                1,
                loop.rng_state(),
                parts.state,
                history,
                parts.best,
                json.dumps(parts.run_config),
            )


def step_batches(
    cfg: FinetuneConfig,
    tokenizer: loop.Tokenize,
    rank: int,
    world: int,
    start: int,
    device: str | torch.device,
) -> Iterator[loop.PairBatch]:
    """This worker's tokenised share of every global batch from step ``start + 1``: the stream's
    rows in order (the Ray dataset keeps them so, one global batch of rows per step, whatever the
    number of workers)."""
    raw = ray.train.get_dataset_shard("train").iter_batches(
        batch_size=cfg.optim.batch_size, batch_format="numpy", drop_last=True
    )
    return loop.pair_batches(
        raw,
        tokenizer,
        cfg.max_query_length,
        cfg.max_doc_length,
        rank=rank,
        world=world,
        skip=start,
        device=device,
    )


def _due(since: float, every_s: float, world: int, device: torch.device) -> bool:
    """Whether rank 0's clock says a report is due; every rank follows it (reports are a barrier in
    Ray Train)."""
    flag = torch.tensor([float(time.monotonic() - since >= every_s)], device=device)
    if world > 1:
        dist.broadcast(flag, src=0)
    return bool(flag.item())


@contextlib.contextmanager
def _restore_dir(run_dir: str) -> Iterator[Path | None]:
    """The checkpoint this worker restores; None for a fresh run. On a path, the newest that
    verifies (``restore_point``, the driver's rule too), whether or not Ray Train registered it; a
    registered checkpoint is never restored unverified. On object storage, which is not verified (it
    would download every checkpoint), the one Ray Train registered."""
    registered = ray.train.get_checkpoint()
    if is_local(run_dir):
        point = restore_point(run_dir)
        if point is None and registered is not None:
            raise InputError(
                f"{registered.path}: Ray Train registered this checkpoint but no checkpoint under {run_dir} verifies "
                f"on node {ray.util.get_node_ip_address()}; set storage= to storage every node sees"
            )
        yield point[1] if point is not None else None
    elif registered is not None:
        with registered.as_directory() as local:
            yield Path(local)
    else:
        yield None


def _report_checkpoint(
    metrics: dict[str, float],
    state: loop.TrainState,
    history: list[dict[str, float]],
    rank: int,
    world: int,
    best: BestState | None = None,
    run_config: JSONObject | None = None,
) -> None:
    """Every rank saves its part (rank 0 the state, the metrics so far and the best evaluated
    weights); Ray merges them into one directory."""
    with tempfile.TemporaryDirectory() as tmp:
        write_part(
            Path(tmp),
            rank,
            world,
            loop.rng_state(),
            state if rank == 0 else None,
            "".join(json.dumps(m) + "\n" for m in history) if rank == 0 else None,
            best if rank == 0 else None,
            json.dumps(run_config) if rank == 0 and run_config is not None else None,
        )
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=checkpoint_name(state["step"]),
        )
