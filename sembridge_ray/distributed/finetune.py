"""Ray side of fine-tuning: training stream (Parquet) -> Ray Data -> TorchTrainer (DDP) ->
SparseEncoder directory.

Resume semantics. The Ray Train run is named by a digest of the settings that shape the trajectory
(``sparse.config.run_name``) and stored under ``storage`` (default ``<output>/checkpoints``).
Rerunning the same command after the driver died finds that run, logs ``resumed from step N``, and
every worker restores the model, AdamW, the schedule, its RNG and the data position (step N of the
stream) from the latest checkpoint. Lost workers are restarted from it by
``FailureConfig(max_failures)`` within one run.

Integrity. A restart restores the newest checkpoint that verifies
(``sparse.checkpoints.restore_point``, the same rule in the driver and in every worker); a damaged
one is first taken out of Ray Train's registered list and set aside (``set_aside_damaged``). A
non-finite loss stops the run at that step (one line, exit 2, not retried) before any non-finite
weights are checkpointed, and the exported model is checked finite before ``_SUCCESS``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import psutil
import pyarrow.parquet as pq
import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train.torch import TorchTrainer

from sembridge_ray.atomic import atomic_new_path
from sembridge_ray.bundled import resolve
from sembridge_ray.config import write_config
from sembridge_ray.data.registry import dataset_identity
from sembridge_ray.data.stream import StreamInfo, materialise_stream
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.udfs import actor_threads
from sembridge_ray.errors import InputError, environment_errno, find_user_error
from sembridge_ray.identity import RunIdentity, model_identity, require_unchanged
from sembridge_ray.jobs.dev import DevSet, Rows, evaluate_dev, load_dev
from sembridge_ray.jobs.export import ExportConfig, ExportResult
from sembridge_ray.jobs.finetune import FinetuneConfig, FinetuneResult
from sembridge_ray.json_types import JSONObject
from sembridge_ray.logs import setup_logging
from sembridge_ray.model_card import dev_scores, unchecked, write_card
from sembridge_ray.outputs import (
    atomic_path,
    atomic_write_json,
    atomic_write_text,
    claim_output,
    preflight,
)
from sembridge_ray.placement import Placement, local_precision
from sembridge_ray.progress import EVERY_S, duration
from sembridge_ray.provenance import (
    FinetuneFacts,
    InitFacts,
    InputLicence,
    Provenance,
    base_model,
    dataset_ref,
    display_name,
    input_licences,
    language_of,
    read_provenance,
    read_scores,
    under,
)
from sembridge_ray.sparse import loop
from sembridge_ray.sparse.checkpoints import (
    RUN_CONFIG,
    TRAIN_METRICS,
    BestState,
    checkpoint_name,
    checkpoint_problem,
    is_local,
    load_best,
    load_part,
    restore_point,
    set_aside_damaged,
    write_part,
)
from sembridge_ray.sparse.collective import LocalCollective, TorchCollective
from sembridge_ray.sparse.convergence import (
    DEV_DIMS_D,
    DEV_DIMS_Q,
    DEV_PRIMARY,
    Convergence,
    collapse,
    read_evaluations,
)
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import (
    Serving,
    SpladeEncoder,
    check_mlm,
    check_push,
    load_mlm,
    load_sparse_encoder,
    publish,
    read_pooling,
    save_sparse_encoder,
)

if TYPE_CHECKING:
    from sentence_transformers import SparseEncoder
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)
SUMMARY, DATA_DIR, CHECKPOINT_DIR, MODEL_DIR = "finetune.json", "data", "checkpoints", "model"
TENSORBOARD_DIR = "tensorboard"


def input_identities(cfg: FinetuneConfig) -> dict[str, str]:
    """Check the model and the training data exist (before anything is written) and identify
    them."""
    cfg.require_inputs()
    inputs = {"model": model_identity(cfg.model), "train": dataset_identity(cfg.train)}
    check_mlm(cfg.model, cfg.trust_remote_code)
    return with_eval_identity(cfg, inputs)


def with_eval_identity(cfg: FinetuneConfig, inputs: dict[str, str]) -> dict[str, str]:
    """``inputs`` with the development set's identity (by content, as the training data's) when
    there is one."""
    if not cfg.eval or "eval" in inputs:
        return inputs
    return {**inputs, "eval": dataset_identity(cfg.eval)}


def run_finetune(cfg: FinetuneConfig, inputs: dict[str, str] | None = None) -> FinetuneResult:
    """Fine-tune ``cfg.model`` on ``cfg.train`` into ``cfg.output``; skip a finished output, resume
    a broken one; then push the model when ``push_to_hub`` is set (a finished output's too: a rerun
    publishes without training).

    ``inputs`` (identities of the model and the training data) may come from a caller that planned
    them."""
    if cfg.push_to_hub:
        check_push(cfg.push_to_hub)  # before any work: a push that cannot happen fails in a second
    result = _run_finetune(cfg, inputs)
    if not cfg.push_to_hub:
        return result
    return replace(result, pushed=publish(Path(result.output), MODEL_DIR, cfg.push_to_hub))


def _run_finetune(cfg: FinetuneConfig, inputs: dict[str, str] | None) -> FinetuneResult:
    """:func:`run_finetune` without the push: everything checked before the output is claimed, then
    the training."""
    named = cfg  # as the user named the inputs: what the model card shows
    # bundled names: paths for the workers
    cfg = replace(
        cfg,
        model=resolve(cfg.model),
        train=resolve(cfg.train),
        eval=resolve(cfg.eval) if cfg.eval else "",
    )
    cluster.require_reachable()
    cfg = replace(
        cfg, precision=cluster.resolve_precision(cfg.precision, cfg.resources, reserve=False)
    )
    identity = cfg.identity(
        "finetune", with_eval_identity(cfg, inputs) if inputs else input_identities(cfg)
    )
    # before any output
    dev = load_dev(cfg.eval, cfg.eval_split, cfg.eval_max_queries) if cfg.eval else None
    if cfg.tensorboard:
        Tracker.require()
    out = Path(cfg.output)
    # the output's checks (path, lock, settings) before Ray starts
    if preflight(out, identity, cfg.overwrite):
        return _finished(out)
    # Train workers hold back no CPU for Ray Data
    _require_fit(cfg, cluster.expected_placement(cfg.resources, reserve=False))
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:
            return _finished(out)
        # claim.path: the output, or its staging directory under --overwrite
        summary = _train(claim.path, cfg, named, identity, dev)
        # the card: evaluations of the finished model add their scores
        # (model_card.record_evaluation)
        claim.finish(exclude=(CHECKPOINT_DIR, DATA_DIR, TENSORBOARD_DIR, *unchecked(MODEL_DIR)))
    return summary


def _finished(out: Path) -> FinetuneResult:
    """A finished output's result (skipped), from its summary."""
    return FinetuneResult.from_summary(
        json.loads((out / SUMMARY).read_text(encoding="utf-8")), skipped=True
    )


def _require_fit(cfg: FinetuneConfig, plan: Placement) -> None:
    """An :class:`InputError` unless the cluster fits every worker asked for and the batch splits
    over them."""
    # the worker count shapes the weights: never fewer than recorded
    if plan.workers != cfg.resources.workers:
        raise InputError(
            f"fine-tuning asks for {cfg.resources.workers} workers but the cluster fits {plan.workers} "
            f"({cfg.resources.cpus_per_worker:g} CPUs{' and a GPU' if plan.use_gpu else ''} each); the weights "
            f"depend on the number, so run with --workers {plan.workers} (another run) or on a larger cluster"
        )
    if cfg.optim.batch_size % plan.workers:
        raise InputError(
            f"batch size {cfg.optim.batch_size} does not split over {plan.workers} workers"
        )


def _train(
    work: Path,
    cfg: FinetuneConfig,
    named: FinetuneConfig,
    identity: RunIdentity,
    dev: DevSet | None,
) -> FinetuneResult:
    """Train into ``work`` (the claimed output or its staging directory), export the model, write
    the summary."""
    stream, info = materialise_stream(stream_info(cfg), work / DATA_DIR)
    write_config(cfg, work / "config.yaml")
    plan = cluster.placement(cfg.resources, reserve=False)
    if plan.workers != cfg.resources.workers:  # a joined cluster that shrank since the check above
        raise InputError(
            f"the cluster now fits {plan.workers} of the {cfg.resources.workers} workers asked for"
        )
    storage, name, resumed = _run_storage(cfg, work, identity)
    start = time.perf_counter()
    ev = Evaluation(dev=dev, every=eval_steps(cfg, info.total_steps), work=work)
    run_dir = f"{storage.rstrip('/')}/{name}"
    if is_local(run_dir) and cluster.driver_is_the_worker(plan):
        _fit_here(cfg, stream, info.total_steps, plan, run_dir, ev)
        checkpoint = None
    else:
        checkpoint = _fit(cfg, stream, info.total_steps, plan, storage, name, ev).checkpoint
    exported = export_checkpoint(checkpoint, cfg, work, info.total_steps, run_dir, named)
    # every worker (and the export) loaded the model, the stream was read: still the inputs the
    # identity names?
    require_unchanged(identity.inputs, {"model": cfg.model, "train": cfg.train, "eval": cfg.eval})
    summary = _summary(
        cfg, info.total_steps, name, resumed, plan.workers, start, exported, dev is not None
    )
    atomic_write_json(work / SUMMARY, {**asdict(summary), "stream": asdict(info)})
    return summary


def _summary(
    cfg: FinetuneConfig,
    steps: int,
    name: str,
    resumed: int | None,
    workers: int,
    start: float,
    exported: Exported,
    with_dev: bool,
) -> FinetuneResult:
    """What ``finetune.json`` says of the run (its seconds since ``start``, a ``perf_counter``
    reading)."""
    out = Path(cfg.output)
    return FinetuneResult(
        output=str(out),
        model=str(out / MODEL_DIR),
        steps=steps,
        run_name=name,
        # where they are once complete
        storage=cfg.storage or str((out / CHECKPOINT_DIR).resolve()),
        resumed_from=resumed,
        workers=workers,
        seconds=round(time.perf_counter() - start, 2),
        final=exported.final,
        select=cfg.select,
        best=exported.best,
        collapsed=exported.collapsed,
        convergence=dict(exported.convergence) if with_dev else {},
        eval_seconds=exported.eval_seconds,
    )


def _run_storage(
    cfg: FinetuneConfig, work: Path, identity: RunIdentity
) -> tuple[str, str, int | None]:
    """(where the run's checkpoints go, the Ray Train run name, the step it resumes from: None for a
    new run)."""
    storage, name = cfg.storage or str((work / CHECKPOINT_DIR).resolve()), run_name(identity)
    resumed = latest_step(storage, name)
    if resumed is not None:
        log.info("resumed from step %d (run %s in %s)", resumed, name, storage)
    storage_note(storage, cfg.storage)
    return storage, name, resumed


def stream_info(cfg: FinetuneConfig) -> StreamInfo:
    """What the training stream is made from (``data.stream``: its order fixes every step's
    batch)."""
    return StreamInfo(
        spec=cfg.train,
        split=cfg.split,
        hard_negatives=cfg.hard_negatives,
        batch_size=cfg.optim.batch_size,
        epochs=cfg.optim.epochs,
        max_steps=cfg.optim.max_steps,
        seed=cfg.seed,
        batch_sampler=cfg.batch_sampler,
    )


def run_local(cfg: FinetuneConfig, work: Path) -> Path:
    """The fine-tuning job's computation in this process, one worker, no Ray, into ``work``: the
    same training stream, the same worker body (:func:`worker_body`), the same checkpoints and the
    same export of the published weights (``select``) as :func:`run_finetune` with one worker;
    ``work/model`` and ``work/metrics.jsonl`` as the job writes them (no claim, identity or
    ``_SUCCESS``: not an output of the job). For tests and studies that train many tiny variants
    (``tests/unit/test_dead_settings.py``)."""
    cfg.require_inputs()
    named = cfg
    cfg = replace(
        cfg,
        model=resolve(cfg.model),
        train=resolve(cfg.train),
        eval=resolve(cfg.eval) if cfg.eval else "",
    )
    cfg = replace(cfg, precision=local_precision(cfg.precision, use_gpu=False))
    if cfg.resources.workers != 1:
        raise InputError(f"run_local trains one worker, not {cfg.resources.workers}")
    dev = load_dev(cfg.eval, cfg.eval_split, cfg.eval_max_queries) if cfg.eval else None
    stream, info = materialise_stream(stream_info(cfg), work / DATA_DIR)
    run_dir = work / CHECKPOINT_DIR / "local"
    config: LoopConfig = {
        "cfg": cfg.to_dict(),
        "total_steps": info.total_steps,
        "run_dir": str(run_dir),
        "dev": dev,
        "eval_every": eval_steps(cfg, info.total_steps),
        "tensorboard": "",
    }
    worker_body(config, LocalRuntime(stream, run_dir))
    export_checkpoint(None, cfg, work, info.total_steps, str(run_dir), named)
    return work / MODEL_DIR


def evaluated(step: int, total: int, at: tuple[int, ...], every: int) -> bool:
    """Whether step ``step`` of ``total`` is evaluated: one of ``at`` when given, else every
    ``every``-th; the last step always (step 0 is evaluated before training starts)."""
    return step == total or (step in at if at else step % every == 0)


def eval_steps(cfg: FinetuneConfig, total_steps: int) -> int:
    """Steps between evaluations: ``eval_every``, or a tenth of the run (0 = no development set)."""
    if not cfg.eval:
        return 0
    return cfg.eval_every or max(1, -(-total_steps // 10))


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What the workers evaluate and where the tracker writes (from the driver)."""

    dev: DevSet | None
    every: int
    work: Path


def run_name(identity: RunIdentity) -> str:
    """The Ray Train run name: the run's fingerprint, so the same settings and inputs resume the
    same run."""
    return f"finetune-{identity.fingerprint[:16]}"


def _fit(
    cfg: FinetuneConfig,
    stream: Path,
    total_steps: int,
    plan: Placement,
    storage: str,
    name: str,
    ev: Evaluation,
) -> ray.train.Result:
    """Train, restarting the worker group from the newest complete checkpoint after a failure, at
    most ``max_failures`` times. An error of the input or the environment (disk full, read-only,
    permission, a loss that diverged) is not retried: it would fail the same way, so it ends the run
    at once, its checkpoints kept for a later resume. Before every attempt, registered checkpoints
    that no longer verify are set aside (here only: the driver is the one process that renames them,
    and no worker is running)."""
    log.info(
        "fine-tuning: %d steps on %d Ray Train worker(s) (%s); starting them",
        total_steps,
        plan.workers,
        "GPU" if plan.use_gpu else "CPU",
    )
    for attempt in range(cfg.max_failures + 1):
        set_aside_damaged(f"{storage.rstrip('/')}/{name}")
        try:
            return _trainer(cfg, stream, total_steps, plan, storage, name, ev).fit()
        except ray.train.TrainingFailedError as err:
            cause = find_user_error(err)
            code = environment_errno(cause) if cause is not None else None
            if code is not None and not getattr(cause, "filename", None):
                raise OSError(
                    code, f"cannot write checkpoints: {os.strerror(code)}", storage
                ) from err
            if cause is not None or attempt == cfg.max_failures:
                raise
            resume = latest_step(storage, name)
            log.warning(
                "training failed (attempt %d of %d): %s; restarting from %s",
                attempt + 1,
                cfg.max_failures + 1,
                str(err).strip().splitlines()[0],
                f"step {resume}" if resume is not None else "the start",
            )
    raise AssertionError("unreachable")


def _fit_here(
    cfg: FinetuneConfig,
    stream: Path,
    total_steps: int,
    plan: Placement,
    run_dir: str,
    ev: Evaluation,
) -> None:
    """The one worker's body in this process (``cluster.driver_is_the_worker``): the same stream,
    batches, checkpoints and torch thread count as a Ray Train worker, without the 20-25 s it takes
    to start one (measured on 2 CPUs: a 12-step fine-tuning of SPLADE-tiny took 33 s with Ray Train,
    8 s of it training). It resumes from the newest checkpoint that verifies; a failure is not
    retried here (a rerun resumes)."""
    set_aside_damaged(run_dir)
    log.info("fine-tuning: %d steps in this process (one CPU worker)", total_steps)
    config: LoopConfig = {
        "cfg": cfg.to_dict(),
        "total_steps": total_steps,
        "run_dir": run_dir,
        "dev": ev.dev,
        "eval_every": ev.every,
        "tensorboard": str((ev.work / TENSORBOARD_DIR).resolve()) if cfg.tensorboard else "",
    }
    with actor_threads(plan, 0):
        worker_body(config, LocalRuntime(stream, Path(run_dir)))


def _train_logging() -> dict[str, Any]:
    """Ray Train's console at WARNING (DEBUG when this job logs at DEBUG): its INFO lines (resources
    requested, worker group started, model moved to the device, checkpoint created) say what this
    job's own lines say. Ray Train v2's ``RunConfig(logging_config=...)``; nothing where the Ray
    Train in use has none."""
    if not hasattr(ray.train, "LoggingConfig"):
        return {}
    level = "DEBUG" if logging.getLogger().getEffectiveLevel() <= logging.DEBUG else "WARNING"
    return {"logging_config": ray.train.LoggingConfig(log_level=level)}


def _trainer(
    cfg: FinetuneConfig,
    stream: Path,
    total_steps: int,
    plan: Placement,
    storage: str,
    name: str,
    ev: Evaluation,
    func: Callable[[Mapping[str, object]], None] | None = None,
) -> TorchTrainer:
    """The TorchTrainer of a run; ``func`` replaces :func:`train_func` (tests record what the
    workers read)."""
    dataset = _stream_dataset(stream)
    resources = {
        "CPU": plan.cpus_per_worker,
        **({"GPU": plan.gpus_per_worker} if plan.use_gpu else {}),
    }
    run_dir = f"{storage.rstrip('/')}/{name}"
    loop_config: LoopConfig = {
        "cfg": cfg.to_dict(),
        "total_steps": total_steps,
        "run_dir": run_dir,
        "dev": ev.dev,
        "eval_every": ev.every,
        "tensorboard": str((ev.work / TENSORBOARD_DIR).resolve()) if cfg.tensorboard else "",
    }
    return TorchTrainer(
        func or train_func,
        train_loop_config=dict(loop_config),
        scaling_config=ray.train.ScalingConfig(
            num_workers=plan.workers, use_gpu=plan.use_gpu, resources_per_worker=resources
        ),
        run_config=_run_config(cfg, storage, name),
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
    """Ray Train's run: its name and storage, the checkpoints kept, no restarts of its own (see
    ``_fit``)."""
    return ray.train.RunConfig(
        name=name,
        storage_path=storage,
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
        failure_config=ray.train.FailureConfig(max_failures=0),
        **_train_logging(),
    )  # restarts: see _fit


# Filesystems every node of a cluster sees; checkpoints anywhere else exist only on the node that
# wrote them.
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
    ``_fit``."""
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


class LoopConfig(TypedDict):
    """What every Ray Train worker receives (``train_loop_config``)."""

    cfg: JSONObject
    """``FinetuneConfig.to_dict()``, rebuilt with ``from_dict``."""
    total_steps: int
    run_dir: str
    """The run's checkpoints: ``<storage>/<run name>``."""
    dev: DevSet | None
    eval_every: int
    tensorboard: str
    """Rank 0's TensorBoard log directory; "" = none."""


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
        return cast(torch.nn.Module, ray.train.torch.prepare_model(model))

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


def train_func(loop_config: Mapping[str, object]) -> None:
    """Ray Train worker: glue between Ray (checkpoints, dataset shard, reporting) and
    ``sparse.loop``. The config is the :class:`LoopConfig` that ``_trainer`` hands Ray."""
    worker_body(cast(LoopConfig, loop_config), RayRuntime())


def worker_body(config: LoopConfig, rt: Runtime) -> None:
    """One worker's whole run: the model, AdamW and its RNG restored or seeded, the steps of
    ``sparse.loop.train`` on this worker's share of every global batch, evaluations of the
    development set, logs, checkpoints."""
    setup_logging("INFO", force=False)
    cfg, total = FinetuneConfig.from_dict(config["cfg"]), int(config["total_steps"])
    rank, world, device = rt.rank, rt.world, rt.device
    mlm, tokenizer = load_mlm(cfg.model, cfg.trust_remote_code)
    model = rt.prepare(SpladeEncoder(mlm, chunk=cfg.pool_chunk))
    encoder = cast(SpladeEncoder, getattr(model, "module", model))
    optimizer, scheduler = loop.build_optimizer(model, cfg.optim, total)
    torch.manual_seed(cfg.seed * 1_000_003 + rank)
    start, history, best = _restore(rt, config["run_dir"], encoder, optimizer, scheduler)
    if start and rank == 0:
        log.info("resumed from step %d of %d", start, total)
    if rank == 0:
        log.info("%d worker(s) ready on %s: steps %d to %d", world, device, start + 1, total)
    batches = rt.batches(cfg, tokenizer, start)
    plan = _loop_plan(cfg, total)
    comm = TorchCollective() if world > 1 else LocalCollective()
    steps = _Steps.open(
        config, cfg, rt, (encoder, optimizer, scheduler), tokenizer, start, history, best
    )
    for step, metrics in loop.train(
        model, batches, optimizer, scheduler, plan, start=start, comm=comm
    ):
        steps.after(step, metrics)
    steps.close()


def _restore(
    rt: Runtime,
    run_dir: str,
    encoder: SpladeEncoder,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, list[dict[str, float]], BestState | None]:
    """(the step, the metrics so far, rank 0's best weights) of the checkpoint this worker restores,
    its state and RNG loaded into the live objects; (0, [], None) for a fresh run."""
    start, history, best = 0, list[dict[str, float]](), None
    with rt.restore(run_dir) as ckpt:
        if ckpt is not None:
            state, rng, history = load_part(ckpt, rt.rank)
            start = loop.restore_state(state, encoder, optimizer, scheduler)
            best = load_best(ckpt) if rt.rank == 0 else None
            if rng is not None:
                loop.set_rng_state(rng)
    return start, history, best


def _loop_plan(cfg: FinetuneConfig, total: int) -> loop.LoopPlan:
    """What ``sparse.loop.train`` runs: the steps, the global batch, the loss, clipping, precision
    and logging."""
    bf16 = cfg.precision == "bf16"  # resolved by the driver (run_finetune), never per worker
    return loop.LoopPlan(
        total_steps=total,
        global_batch=cfg.optim.batch_size,
        loss=cfg.loss,
        clip_norm=cfg.optim.clip_norm,
        bf16=bf16,
        log_every=cfg.log_every,
    )


@dataclass(kw_only=True)
class _Steps:
    """What a worker does after each training step: evaluations, the metrics kept (history,
    TensorBoard), rank 0's log lines, checkpoints and reports."""

    cfg: FinetuneConfig
    config: LoopConfig
    rt: Runtime
    training: tuple[SpladeEncoder, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]
    history: list[dict[str, float]]
    dev: _DevRun | None
    tracker: Tracker | None
    start: int
    total: int
    began: float = field(init=False)
    last_line: float = field(init=False)
    last_report: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_report = self.began = self.last_line = time.monotonic()

    @classmethod
    def open(
        cls,
        config: LoopConfig,
        cfg: FinetuneConfig,
        rt: Runtime,
        training: tuple[SpladeEncoder, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler],
        tokenizer: PreTrainedTokenizerBase,
        start: int,
        history: list[dict[str, float]],
        best: BestState | None,
    ) -> _Steps:
        """The development evaluation and rank 0's tracker started, and step 0 evaluated in a fresh
        run."""
        encoder, rank, world, device = training[0], rt.rank, rt.world, rt.device
        dev = (
            _DevRun.start(config, cfg, encoder, tokenizer, rank, world, str(device), best)
            if config["dev"]
            else None
        )
        tracker = (
            Tracker.open(config["tensorboard"], start)
            if rank == 0 and config["tensorboard"]
            else None
        )
        if dev is not None and start == 0:
            history.append({"step": 0, **dev.evaluate(0)})
            if tracker is not None:
                tracker.write(history[-1])
        total = int(config["total_steps"])
        return cls(
            cfg=cfg,
            config=config,
            rt=rt,
            training=training,
            history=history,
            dev=dev,
            tracker=tracker,
            start=start,
            total=total,
        )

    def close(self) -> None:
        """The run's end: rank 0's TensorBoard events closed."""
        if self.tracker is not None:
            self.tracker.close()

    def after(self, step: int, metrics: dict[str, float] | None) -> None:
        """Step ``step`` done (``metrics``: None between two ``log_every`` steps): evaluate, log,
        checkpoint, report."""
        if self.dev is not None and evaluated(
            step, self.total, self.cfg.eval_at, int(self.config["eval_every"])
        ):
            metrics = {**(metrics or {"step": step}), **self.dev.evaluate(step)}
        if metrics is not None:
            self._record(step, metrics)
        if self.rt.rank == 0 and step < self.total and time.monotonic() - self.last_line >= EVERY_S:
            # between two log_every steps: where it is, by time (log_every is part of the run's
            # identity)
            per_step = self._per_step(step)
            log.info(
                "step %d/%d, %.2f s/step, ETA %s",
                step,
                self.total,
                per_step,
                self._eta(per_step, step),
            )
            self.last_line = time.monotonic()
        if step % self.cfg.checkpoint_every == 0 or step == self.total:
            self._checkpoint(step, metrics)
        elif metrics is not None and self.rt.due(self.last_report, self.cfg.report_every_s):
            self.rt.report(metrics)
            self.last_report = time.monotonic()

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        """Keep a step's metrics (history, TensorBoard); rank 0 logs a training step's line."""
        self.history.append(metrics)
        if self.tracker is not None:
            self.tracker.write(metrics)
        if self.rt.rank == 0 and "loss" in metrics:
            per_step = self._per_step(step)
            log.info(
                "step %d/%d loss %.4f (%s %.4f) dims q %.0f d %.0f lr %.2e %.1f ex/s ETA %s",
                step,
                self.total,
                metrics["loss"],
                self.cfg.loss.ranking,
                metrics[self.cfg.loss.ranking],
                metrics["active_dims_q"],
                metrics["active_dims_d"],
                metrics["lr"],
                metrics["examples_per_s"],
                self._eta(per_step, step),
            )
            self.last_line = time.monotonic()

    def _per_step(self, step: int) -> float:
        """Seconds per step since this worker began, at step ``step``."""
        return (time.monotonic() - self.began) / max(1, step - self.start)

    def _eta(self, per_step: float, step: int) -> str:
        """The time left after step ``step`` at ``per_step`` seconds a step."""
        return duration(per_step * (self.total - step))

    def _checkpoint(self, step: int, metrics: dict[str, float] | None) -> None:
        """Every rank's checkpoint part of step ``step`` (its weights checked finite first)."""
        encoder, optimizer, scheduler = self.training
        # Never a checkpoint of weights that diverged: the newest finite one stays the one a rerun
        # resumes from. Every worker holds the same weights (DDP), so every worker stops here
        # together.
        require_finite(
            encoder.state_dict(), f"training diverged at step {step}", loop.DIVERGED_HINT
        )
        state = loop.capture_state(encoder, optimizer, scheduler, step)
        kept = self.dev.best if self.dev is not None else None
        parts = CheckpointParts(
            state=state, history=self.history, best=kept, run_config=self.config["cfg"]
        )
        self.rt.checkpoint(metrics or {"step": step}, parts)
        self.last_report = time.monotonic()


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


@dataclass(kw_only=True)
class _DevRun:
    """A worker's development evaluation: a SparseEncoder written and loaded as the final model is
    (so its vectors are the evaluate job's), given the trained weights before each evaluation; rank
    0 also keeps the best weights that are not collapsed."""

    dev: DevSet
    encoder: SpladeEncoder
    model: SparseEncoder
    lengths: tuple[int, int]
    precision: str
    rank: int
    world: int
    vocab_size: int
    best: BestState | None = None

    @classmethod
    def start(
        cls,
        config: LoopConfig,
        cfg: FinetuneConfig,
        encoder: SpladeEncoder,
        tokenizer: PreTrainedTokenizerBase,
        rank: int,
        world: int,
        device: str,
        best: BestState | None,
    ) -> _DevRun:
        # Rank 0 writes the directory (transformers saves on rank 0 only in a process group) and
        # sends its files to the other ranks, which may be on other nodes.
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "model"
            files: dict[str, bytes] | None = None
            if rank == 0:
                save_sparse_encoder(encoder.mlm, tokenizer, root, serving(cfg))
                files = {
                    str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()
                }
            if world > 1:
                box = [files]
                dist.broadcast_object_list(box, src=0)
                for name, data in (box[0] or {}).items() if rank != 0 else ():
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    (root / name).write_bytes(data)
            model = load_sparse_encoder(
                str(root), device=device, trust_remote_code=cfg.trust_remote_code
            )
        assert config["dev"] is not None
        return cls(
            dev=config["dev"],
            encoder=encoder,
            model=model,
            # the lengths the written model is scored with
            lengths=(cfg.query_length, cfg.document_length),
            precision=cfg.precision,
            rank=rank,
            world=world,
            vocab_size=int(encoder.mlm.config.vocab_size),
            best=best,
        )

    def evaluate(self, step: int) -> dict[str, float]:
        """The dev figures of the current weights (every rank gets rank 0's), and the best kept on
        rank 0."""
        began = time.perf_counter()
        transformer = next(m for m in self.model if hasattr(m, "auto_model"))
        cast(torch.nn.Module, transformer.auto_model).load_state_dict(self.encoder.mlm.state_dict())
        found = evaluate_dev(
            self.model, self.dev, self.lengths, self.precision, self.rank, self.world, self._gather
        )
        figures = self._broadcast(found)
        figures["dev_seconds"] = round(time.perf_counter() - began, 3)
        if self.rank == 0:
            self._keep(step, figures)
        return figures

    def _keep(self, step: int, figures: dict[str, float]) -> None:
        problem = collapse(figures[DEV_DIMS_Q], figures[DEV_DIMS_D], self.vocab_size)
        score = figures[DEV_PRIMARY]
        if problem is not None:
            log.warning(
                "step %d: the model collapsed (%s); never selected as the best", step, problem
            )
        elif self.best is None or score > self.best["score"]:
            weights = {
                k: v.detach().to("cpu", copy=True) for k, v in self.encoder.state_dict().items()
            }
            self.best = {"step": step, "score": score, "model": weights}
        log.info(
            "step %d: dev nDCG@10 %.4f, dims q %.1f d %.1f (best %.4f at step %s) in %s",
            step,
            score,
            figures[DEV_DIMS_Q],
            figures[DEV_DIMS_D],
            self.best["score"] if self.best else float("nan"),
            self.best["step"] if self.best else "-",
            duration(figures["dev_seconds"]),
        )

    def _gather(self, mine: dict[int, Rows]) -> list[dict[int, Rows]]:
        if self.world == 1:
            return [mine]
        parts: list[dict[int, Rows]] | None = (
            [{} for _ in range(self.world)] if self.rank == 0 else None
        )
        dist.gather_object(mine, parts, dst=0)
        return parts or []

    def _broadcast(self, figures: dict[str, float] | None) -> dict[str, float]:
        if self.world == 1:
            assert figures is not None
            return figures
        box = [figures]
        dist.broadcast_object_list(box, src=0)
        assert box[0] is not None
        return dict(box[0])


class Tracker:
    """Rank 0's TensorBoard event files (``tensorboard``, an optional dependency): every metric of
    every logged or evaluated step, as a scalar named by its key. A resumed run drops the events
    after its restore step (``purge_step``), so the curves have no doubled segment."""

    def __init__(self, writer: object) -> None:
        self.writer = writer

    @staticmethod
    def require() -> None:
        """An :class:`InputError` when the writer cannot be imported (checked by the driver before
        training; a worker without it says the same)."""
        try:
            import tensorboard  # noqa: F401
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise InputError(
                "--tensorboard needs the tensorboard package: pip install 'sembridge-ray[tensorboard]'"
            ) from None

    @classmethod
    def open(cls, log_dir: str, start: int) -> Tracker:
        cls.require()
        from torch.utils.tensorboard import SummaryWriter

        return cls(SummaryWriter(log_dir=log_dir, purge_step=start + 1 if start else None))

    def write(self, metrics: Mapping[str, float]) -> None:
        step = int(metrics["step"])
        for key, value in metrics.items():
            if key != "step":
                self.writer.add_scalar(key.replace("@", "_at_"), float(value), step)  # type: ignore[attr-defined]
        self.writer.flush()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.writer.close()  # type: ignore[attr-defined]


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


@dataclass(frozen=True, kw_only=True)
class Exported:
    """What :func:`export_checkpoint` published, read from the final checkpoint's metrics."""

    final: dict[str, float]
    best: dict[str, object] = field(default_factory=dict)
    collapsed: list[dict[str, object]] = field(default_factory=list)
    convergence: Convergence | dict[str, object] = field(default_factory=dict)
    eval_seconds: float = 0.0


def serving(cfg: FinetuneConfig) -> Serving:
    """What the written model encodes with (its lengths and the input model's pooling)."""
    return Serving(
        query_length=cfg.query_length,
        document_length=cfg.document_length,
        pooling=read_pooling(cfg.model),
    )


def export_checkpoint(
    checkpoint: ray.train.Checkpoint | None,
    cfg: FinetuneConfig,
    out: Path,
    total_steps: int,
    run_dir: str,
    named: FinetuneConfig | None = None,
) -> Exported:
    """Write the final checkpoint's model (``select=last``) or the best evaluated weights it carries
    (``select=best``) into ``out/model`` as a SparseEncoder directory, and its metrics.jsonl; the
    final checkpoint must verify (on a path) and the weights be finite, or nothing is written."""
    state, history, kept = _final_checkpoint(checkpoint, total_steps, run_dir)
    mlm, tokenizer = load_mlm(cfg.model, cfg.trust_remote_code)
    exported = Exported(**read_evaluations(history, int(mlm.config.vocab_size), cfg.select))
    weights = _published_weights(cfg, state, kept, exported)
    require_finite(
        weights, f"the {'best' if cfg.select == 'best' else 'final'} weights of {run_dir}"
    )
    write_model(
        out / MODEL_DIR,
        weights,
        mlm,
        tokenizer,
        cfg,
        card_provenance(
            named or cfg,
            total_steps,
            exported.final,
            history,
            int(cast(int, exported.best["step"])) if cfg.select == "best" else total_steps,
        ),
    )
    atomic_write_text(out / TRAIN_METRICS, "".join(json.dumps(m) + "\n" for m in history))
    return exported


def _final_checkpoint(
    checkpoint: ray.train.Checkpoint | None, total_steps: int, run_dir: str
) -> tuple[loop.TrainState, list[dict[str, float]], BestState | None]:
    """(rank 0's state, the metrics, the best weights kept) of the run's final checkpoint: on a
    path, the one of step ``total_steps``, which must verify; on object storage, the one Ray Train
    reported."""
    final_dir = Path(run_dir) / checkpoint_name(total_steps)
    if is_local(run_dir):
        if (problem := checkpoint_problem(final_dir)) is not None:
            raise RuntimeError(f"the final checkpoint {final_dir} does not verify ({problem})")
        state, _, history = load_part(final_dir, 0)
        kept = load_best(final_dir)
    elif checkpoint is not None:
        with checkpoint.as_directory() as ckpt:
            state, _, history = load_part(Path(ckpt), 0)
            kept = load_best(Path(ckpt))
    else:
        raise RuntimeError("the training run reported no checkpoint")
    if state["step"] != total_steps:
        raise RuntimeError(
            f"the latest checkpoint is at step {state['step']}, not the last step {total_steps}"
        )
    return state, history, kept


def _published_weights(
    cfg: FinetuneConfig, state: loop.TrainState, kept: BestState | None, exported: Exported
) -> dict[str, torch.Tensor]:
    """The weights ``cfg.select`` publishes: the final state's, or the best kept (which the metrics
    must name)."""
    weights = state["model"]
    if cfg.select == "best":
        if kept is None or not exported.best:
            raise InputError(
                f"select=best: every evaluation on {cfg.eval!r} collapsed ({len(exported.collapsed)} steps), so "
                "there is no model to publish; see metrics.jsonl"
            )
        if kept["step"] != exported.best["step"]:
            raise RuntimeError(
                f"the best weights kept are of step {kept['step']}, the metrics say {exported.best}"
            )
        weights = kept["model"]
    return weights


def write_model(
    out: Path,
    weights: Mapping[str, torch.Tensor],
    mlm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: FinetuneConfig,
    provenance: Provenance,
    new: bool = False,
) -> None:
    """``weights`` (a SpladeEncoder state) as the SparseEncoder directory ``out`` (atomically), with
    its card: the one writer of the run's ``model/`` and of an exported checkpoint. ``new``: ``out``
    must not exist, also not when the directory is complete
    (:func:`~sembridge_ray.atomic.atomic_new_path`: an export never replaces one)."""
    encoder = SpladeEncoder(mlm)
    encoder.load_state_dict(weights)
    # the init job's layout: <output>/model
    with (atomic_new_path if new else atomic_path)(out) as tmp:
        save_sparse_encoder(encoder.mlm, tokenizer, tmp, serving(cfg))
        write_card(tmp, provenance)


def run_export(cfg: ExportConfig) -> ExportResult:
    """Write checkpoint ``cfg.checkpoint`` as a SparseEncoder directory (see
    :mod:`sembridge_ray.jobs.export`)."""
    cfg.require_inputs()
    out = Path(cfg.output)
    return checkpoint_model(cfg, new_output=out)(out)


def checkpoint_model(
    cfg: ExportConfig, new_output: Path | None = None
) -> Callable[[Path], ExportResult]:
    """Check and read checkpoint ``cfg.checkpoint`` (each refusal one line, before anything is
    written; ``new_output``, when given, must not exist); returns what writes it, as the
    SparseEncoder directory ``jobs.finetune`` would have published from those weights, at a path
    that must not exist."""
    ckpt = Path(cfg.checkpoint)
    if (problem := checkpoint_problem(ckpt)) is not None:
        raise InputError(f"checkpoint {str(ckpt)!r} does not verify: {problem}")
    if not (ckpt / RUN_CONFIG).is_file():
        raise InputError(
            f"checkpoint {str(ckpt)!r} has no {RUN_CONFIG} (written by an older version): rerun to export"
        )
    if new_output is not None and (new_output.exists() or new_output.is_symlink()):
        raise InputError(f"output {str(new_output)!r} exists: choose a new directory")
    run_cfg = FinetuneConfig.from_dict(json.loads((ckpt / RUN_CONFIG).read_text(encoding="utf-8")))
    state, _, history = load_part(ckpt, 0)
    weights, step = state["model"], int(state["step"])
    if cfg.select == "best":
        kept = load_best(ckpt)
        if kept is None:
            raise InputError(
                f"checkpoint {str(ckpt)!r} carries no best weights (no development set, or all collapsed)"
            )
        weights, step = kept["model"], int(kept["step"])
    require_finite(weights, f"the weights of step {step} in {ckpt}")
    mlm, tokenizer = load_mlm(run_cfg.model, run_cfg.trust_remote_code)
    final = next((m for m in reversed(history) if int(m["step"]) <= step and "loss" in m), {})
    card = card_provenance(run_cfg, step, final, history, step)

    def write(out: Path) -> ExportResult:
        try:
            write_model(out, weights, mlm, tokenizer, run_cfg, card, new=True)
        except FileExistsError:
            raise InputError(
                f"output {str(out)!r} was written meanwhile by another export: choose a new one"
            ) from None
        return ExportResult(output=str(out), step=step, checkpoint=str(ckpt))

    return write


def card_provenance(
    cfg: FinetuneConfig,
    steps: int,
    final: dict[str, float],
    history: Sequence[Mapping[str, float]] = (),
    published: int | None = None,
) -> Provenance:
    """The input model's provenance (its init, when this project wrote it) extended by this
    fine-tuning (``cfg`` with the inputs as the user named them): names without absolute paths, the
    licences of the training and development data, the input model's recorded scores (zero-shot) and
    the development set's nDCG@10 before the first step and at the ``published`` one (default: the
    last)."""
    model, train = resolve(cfg.model), resolve(cfg.train)
    prov = read_provenance(model)
    earlier = prov.get("finetune", {})
    if "init" not in prov:  # a model this project did not make: what the card can say about it
        prov["init"] = _foreign_init(cfg.model, model)
    licences = under("earlier fine-tuning", earlier.get("licences", []))
    licences += input_licences("training data", cfg.train, train)
    train_name, train_id = dataset_ref(cfg.train, train)
    facts: FinetuneFacts = {
        "model": display_name(cfg.model),
        "train": train_name,
        "steps": steps,
        "batch_size": cfg.optim.batch_size,
        "lr": cfg.optim.lr,
        "ranking": cfg.loss.ranking,
        "lambda_q": cfg.loss.lambda_q,
        "lambda_d": cfg.loss.lambda_d,
        "final_loss": round(final["loss"], 4) if "loss" in final else None,
        "select": cfg.select,
        "query_length": cfg.query_length,
        "document_length": cfg.document_length,
        "zero_shot": read_scores(model),
    }
    if train_id:
        facts["train_id"] = train_id
    if cfg.eval:
        licences += _record_dev(facts, cfg, history, steps if published is None else published)
    facts["licences"] = licences
    prov["finetune"] = facts
    return prov


def _foreign_init(named: str, path: str) -> InitFacts:
    """What the card can say about a starting model this project did not make (``named`` as the user
    gave it)."""
    return {
        "source_model": display_name(named),
        "base_model": base_model(named, path),
        "language": language_of(named, path),
        "licences": input_licences("starting model", named, path),
    }


def _record_dev(
    facts: FinetuneFacts, cfg: FinetuneConfig, history: Sequence[Mapping[str, float]], step: int
) -> list[InputLicence]:
    """Name the development set in ``facts``, with its nDCG@10 before the first step and at
    ``step``; its licences."""
    dev = resolve(cfg.eval)
    licences = input_licences("development data", cfg.eval, dev)
    facts["eval"] = dataset_ref(cfg.eval, dev)[0]
    if scores := dev_scores(history, step, dataset_ref(cfg.eval, dev), cfg.eval_split):
        facts["dev"] = scores
    return licences
