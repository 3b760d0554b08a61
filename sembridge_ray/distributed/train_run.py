"""Ray Train behind the Ray executor (:meth:`RayExecutor.train`): a
:class:`~sembridge_ray.runtime.executor.Training` as a TorchTrainer (the stream as a Ray dataset,
the workers, storage, checkpoints kept), its restarts after a failure, the worker's
:class:`RayContext`, and what its storage holds."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import psutil
import pyarrow.fs
import pyarrow.parquet as pq
import ray
import ray.train
import ray.train.torch
import torch
from ray.train.torch import TorchTrainer

from sembridge_ray.runtime.errors import environment_errno, find_user_error
from sembridge_ray.runtime.executor import TrainContext, Training, is_local

log = logging.getLogger(__name__)
M = TypeVar("M")


class RayContext:
    """A Ray Train worker (:class:`~sembridge_ray.runtime.executor.TrainContext`): its rank, the
    dataset shard, Ray Train's checkpoints and reports."""

    def __init__(self) -> None:
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self.node = ray.util.get_node_ip_address()

    def prepare(self, model: M) -> M:
        return cast(M, ray.train.torch.prepare_model(cast(torch.nn.Module, model)))

    def batches(self, size: int) -> Iterator[Mapping[str, Sequence[object]]]:
        shard = ray.train.get_dataset_shard("train")
        return cast(
            Iterator[Mapping[str, Sequence[object]]],
            shard.iter_batches(batch_size=size, batch_format="numpy", drop_last=True),
        )

    def registered(self) -> contextlib.AbstractContextManager[Path | None]:
        return _as_directory(ray.train.get_checkpoint())

    @contextlib.contextmanager
    def checkpoint(self, metrics: Mapping[str, float], name: str) -> Iterator[Path]:
        """Every rank's part in a directory of its own; Ray merges them into one."""
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
            ray.train.report(
                dict(metrics),
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=name,
            )

    def report(self, metrics: Mapping[str, float]) -> None:
        ray.train.report(dict(metrics))


@contextlib.contextmanager
def _as_directory(checkpoint: ray.train.Checkpoint | None) -> Iterator[Path | None]:
    """A checkpoint as a local directory: its own path on this machine's filesystems (never copied;
    it may not exist on this node), else downloaded for the context."""
    if checkpoint is None:
        yield None
    elif isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        yield Path(checkpoint.path)
    else:
        with checkpoint.as_directory() as local:
            yield Path(local)


def _run_body(
    body: Callable[[Mapping[str, object], TrainContext], None], config: Mapping[str, object]
) -> None:
    """A Ray Train worker's loop: the training's body with this worker's :class:`RayContext`."""
    body(config, RayContext())


def fit(training: Training) -> contextlib.AbstractContextManager[Path | None]:
    """Train, restarting the worker group from the newest complete checkpoint after a failure, at
    most ``max_failures`` times; the final checkpoint Ray Train reported. An error of the input or
    the environment (disk full, read-only, permission, a loss that diverged) is not retried: it
    would fail the same way, so it ends the run at once, its checkpoints kept for a later resume.
    Before every attempt, checkpoints that no longer verify are set aside (here only: the driver is
    the one process that renames them, and no worker is running)."""
    log.info(
        "%s on %d Ray Train worker(s) (%s); starting them",
        training.label,
        training.plan.workers,
        "GPU" if training.plan.use_gpu else "CPU",
    )
    # This loop, not FailureConfig(max_failures): probed on Ray 2.60 (a worker raising InputError,
    # max_failures=2), Ray Train's policy retries every worker error (3 attempts) and has no
    # setting to exempt one; a UserCallback that raises in after_exception stops the retries, but
    # fit() then raises a ControllerError in which find_user_error no longer finds the InputError
    # (the one-line error and exit 2 are lost) after a controller traceback; and Ray's restarts
    # happen in its controller actor, so the driver could log no "training failed ... restarting
    # from step N" line (tests/ray/test_faults.py reads it from the driver's log).
    for attempt in range(training.max_failures + 1):
        training.set_aside(training.run_dir)
        try:
            return _as_directory(trainer(training).fit().checkpoint)
        except ray.train.TrainingFailedError as err:
            _raise_unless_retried(err, training.storage, last=attempt == training.max_failures)
            resume = latest_step(training)
            log.warning(
                "training failed (attempt %d of %d): %s; restarting from %s",
                attempt + 1,
                training.max_failures + 1,
                str(err).strip().splitlines()[0],
                f"step {resume}" if resume is not None else "the start",
            )
    raise AssertionError("unreachable")


def _raise_unless_retried(err: Exception, storage: str, last: bool) -> None:
    """Raise ``err`` unless a restart may cure it: not after the ``last`` attempt, nor for an error
    of the input or the environment (one about the storage, which names no file, as an
    :class:`OSError` on ``storage``)."""
    cause = find_user_error(err)
    code = environment_errno(cause) if cause is not None else None
    if code is not None and not getattr(cause, "filename", None):
        raise OSError(code, f"cannot write checkpoints: {os.strerror(code)}", storage) from err
    if cause is not None or last:
        raise err


def _train_logging() -> dict[str, Any]:
    """Ray Train's console at WARNING (DEBUG when this job logs at DEBUG): its INFO lines (resources
    requested, worker group started, model moved to the device, checkpoint created) say what this
    job's own lines say. Ray Train v2's ``RunConfig(logging_config=...)``; nothing where the Ray
    Train in use has none."""
    if not hasattr(ray.train, "LoggingConfig"):
        return {}
    level = "DEBUG" if logging.getLogger().getEffectiveLevel() <= logging.DEBUG else "WARNING"
    return {"logging_config": ray.train.LoggingConfig(log_level=level)}


def trainer(training: Training) -> TorchTrainer:
    """The TorchTrainer of a training."""
    plan = training.plan
    resources = {
        "CPU": plan.cpus_per_worker,
        **({"GPU": plan.gpus_per_worker} if plan.use_gpu else {}),
    }
    return TorchTrainer(
        functools.partial(_run_body, training.body),
        train_loop_config=dict(training.config),
        scaling_config=ray.train.ScalingConfig(
            num_workers=plan.workers, use_gpu=plan.use_gpu, resources_per_worker=resources
        ),
        run_config=ray.train.RunConfig(
            name=training.name,
            storage_path=training.storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=training.keep),
            # restarts: see fit (preemptions keep Ray's own budget, max_preemption_failures)
            failure_config=ray.train.FailureConfig(max_failures=0),
            **_train_logging(),
        ),
        datasets={"train": _stream_dataset(training.stream)},
        dataset_config=ray.train.DataConfig(
            datasets_to_split=[], execution_options=ray.data.ExecutionOptions(preserve_order=True)
        ),
    )


def _stream_dataset(stream: Path) -> ray.data.Dataset:
    """The training stream as a Ray dataset of its row groups, in order (Ray Data's progress bars
    off)."""
    ray.data.DataContext.get_current().enable_progress_bars = False
    # One block per row group, kept in order: every worker reads the same global batches (see
    # data/stream.py). from_arrow needs no read tasks, which could not be scheduled when the workers
    # hold every CPU.
    parquet = pq.ParquetFile(stream)
    return ray.data.from_arrow([parquet.read_row_group(i) for i in range(parquet.num_row_groups)])


# Filesystems every node of a cluster sees; checkpoints anywhere else exist only on the node that
# wrote them. Kept: Ray checks this only when a worker on another node persists its first
# checkpoint (StorageContext._check_validation_file, an error then); this warns before training.
SHARED_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "ceph",
    "cephfs",
    "beegfs",
    "glusterfs",
    "fuse.juicefs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "9p",
    "virtiofs",
)


def storage_note(storage: str) -> None:
    """One warning line when a multi-node cluster would keep checkpoints on a node-local disk."""
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if nodes <= 1 or not is_local(storage) or filesystem_type(Path(storage)) in SHARED_FILESYSTEMS:
        return
    log.warning(
        "%d-node cluster: checkpoints go to %s on a %s filesystem, which other nodes may not see; put "
        "them on storage every node sees (NFS, Lustre, …) or object storage (s3://, gs://) to resume on any node",
        nodes,
        storage,
        filesystem_type(Path(storage)) or "local",
    )


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` ("" where unknown)."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    mounts = [m for m in psutil.disk_partitions(all=True) if path.is_relative_to(m.mountpoint)]
    return max(mounts, key=lambda m: len(m.mountpoint)).fstype if mounts else ""


def latest_step(training: Training) -> int | None:
    """The step a restart would resume from: on a path, the newest checkpoint that verifies
    (``training.newest``, the workers' rule too); on object storage, which is not verified, the
    newest one Ray Train registered; None for a new run. Reads only: damaged checkpoints are set
    aside by :func:`fit`."""
    run_dir = training.run_dir
    if is_local(run_dir):
        point = training.newest(run_dir)
        return point[0] if point is not None else None
    try:
        result = ray.train.Result.from_path(run_dir)
    except (RuntimeError, OSError, ValueError):
        return None
    if result.checkpoint is None or not result.metrics:
        return None
    return int(result.metrics["step"])
