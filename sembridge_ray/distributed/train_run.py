"""A fine-tuning run on Ray Train: its TorchTrainer (the training stream as a Ray dataset, the
workers, storage, checkpoints kept), restarts after a failure, and what its storage holds."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import ray
import ray.train
from ray.train.torch import TorchTrainer

from sembridge_ray.distributed.train_worker import Evaluation, LoopConfig, loop_config, train_func
from sembridge_ray.jobs.finetune import FinetuneConfig
from sembridge_ray.runtime.errors import environment_errno, find_user_error
from sembridge_ray.runtime.identity import RunIdentity
from sembridge_ray.runtime.placement import Placement
from sembridge_ray.sparse.checkpoints import is_local, restore_point, set_aside_damaged

# the job's logger, whichever module of it logs
log = logging.getLogger("sembridge_ray.distributed.finetune")


def run_name(identity: RunIdentity) -> str:
    """The Ray Train run name: the run's fingerprint, so the same settings and inputs resume the
    same run."""
    return f"finetune-{identity.fingerprint[:16]}"


@dataclass(frozen=True, kw_only=True)
class TrainRun:
    """One fine-tuning run as its trainers take it: the job's config, the training stream and its
    step count, the workers, where its checkpoints go (``storage``/``name``) and its development
    scoring."""

    cfg: FinetuneConfig
    stream: Path
    total_steps: int
    plan: Placement
    storage: str
    name: str
    ev: Evaluation

    @property
    def run_dir(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"

    def loop_config(self) -> LoopConfig:
        return loop_config(self.cfg, self.total_steps, self.run_dir, self.ev)


def fit(run: TrainRun) -> ray.train.Result:
    """Train, restarting the worker group from the newest complete checkpoint after a failure, at
    most ``max_failures`` times. An error of the input or the environment (disk full, read-only,
    permission, a loss that diverged) is not retried: it would fail the same way, so it ends the run
    at once, its checkpoints kept for a later resume. Before every attempt, registered checkpoints
    that no longer verify are set aside (here only: the driver is the one process that renames them,
    and no worker is running)."""
    cfg, plan = run.cfg, run.plan
    log.info(
        "fine-tuning: %d steps on %d Ray Train worker(s) (%s); starting them",
        run.total_steps,
        plan.workers,
        "GPU" if plan.use_gpu else "CPU",
    )
    # This loop, not FailureConfig(max_failures): probed on Ray 2.60 (a worker raising InputError,
    # max_failures=2), Ray Train's policy retries every worker error (3 attempts) and has no
    # setting to exempt one; a UserCallback that raises in after_exception stops the retries, but
    # fit() then raises a ControllerError in which find_user_error no longer finds the InputError
    # (the one-line error and exit 2 are lost) after a controller traceback; and Ray's restarts
    # happen in its controller actor, so the driver could log no "training failed ... restarting
    # from step N" line (tests/ray/test_faults.py reads it from the driver's log).
    for attempt in range(cfg.max_failures + 1):
        set_aside_damaged(run.run_dir)
        try:
            return trainer(run).fit()
        except ray.train.TrainingFailedError as err:
            _raise_unless_retried(err, run.storage, last=attempt == cfg.max_failures)
            resume = latest_step(run.storage, run.name)
            log.warning(
                "training failed (attempt %d of %d): %s; restarting from %s",
                attempt + 1,
                cfg.max_failures + 1,
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


def trainer(
    run: TrainRun, func: Callable[[Mapping[str, object]], None] | None = None
) -> TorchTrainer:
    """The TorchTrainer of a run; ``func`` replaces :func:`train_func` (tests record what the
    workers read)."""
    plan = run.plan
    dataset = _stream_dataset(run.stream)
    resources = {
        "CPU": plan.cpus_per_worker,
        **({"GPU": plan.gpus_per_worker} if plan.use_gpu else {}),
    }
    return TorchTrainer(
        func or train_func,
        train_loop_config=dict(run.loop_config()),
        scaling_config=ray.train.ScalingConfig(
            num_workers=plan.workers, use_gpu=plan.use_gpu, resources_per_worker=resources
        ),
        run_config=_run_config(run.cfg, run.storage, run.name),
        datasets={"train": dataset},
        dataset_config=ray.train.DataConfig(
            datasets_to_split=[], execution_options=ray.data.ExecutionOptions(preserve_order=True)
        ),
    )


def _stream_dataset(stream: Path) -> ray.data.Dataset:
    """The training stream as a Ray dataset of its row groups, in order (Ray Data's progress bars
    off)."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # One block per row group, kept in order: every worker reads the same global batches (see
    # data/stream.py). from_arrow needs no read tasks, which could not be scheduled when the workers
    # hold every CPU.
    parquet = pq.ParquetFile(stream)
    return ray.data.from_arrow([parquet.read_row_group(i) for i in range(parquet.num_row_groups)])


def _run_config(cfg: FinetuneConfig, storage: str, name: str) -> ray.train.RunConfig:
    """Ray Train's run: its name and storage, the checkpoints kept, no restarts of its own (they
    are :func:`fit`'s; preemptions keep Ray's own budget, ``max_preemption_failures``)."""
    return ray.train.RunConfig(
        name=name,
        storage_path=storage,
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
        failure_config=ray.train.FailureConfig(max_failures=0),
        **_train_logging(),
    )  # restarts: see fit


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


def storage_note(storage: str, configured: str) -> None:
    """One warning line when a multi-node cluster would keep checkpoints on a node-local disk."""
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if nodes <= 1 or "://" in storage or filesystem_type(Path(storage)) in SHARED_FILESYSTEMS:
        return
    where = "storage=" + configured if configured else "the default <output>/checkpoints"
    log.warning(
        "%d-node cluster: checkpoints go to %s on a %s filesystem, which other nodes may not see; set "
        "storage= to shared storage (NFS, Lustre, …) or object storage (s3://, gs://) to resume on any node",
        nodes,
        where,
        filesystem_type(Path(storage)) or "local",
    )


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` ("" where unknown)."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    mounts = [m for m in psutil.disk_partitions(all=True) if path.is_relative_to(m.mountpoint)]
    return max(mounts, key=lambda m: len(m.mountpoint)).fstype if mounts else ""


def latest_step(storage: str, name: str) -> int | None:
    """The step a restart would resume from: on a path, the newest checkpoint that verifies
    (``restore_point``, the workers' rule too); on object storage, which is not verified, the newest
    one Ray Train registered; None for a new run. Reads only: damaged checkpoints are set aside by
    :func:`fit`."""
    run_dir = f"{storage.rstrip('/')}/{name}"
    if is_local(run_dir):
        point = restore_point(run_dir)
        return point[0] if point is not None else None
    try:
        result = ray.train.Result.from_path(run_dir)
    except (RuntimeError, OSError, ValueError):
        return None
    if result.checkpoint is None or not result.metrics:
        return None
    return int(result.metrics["step"])
