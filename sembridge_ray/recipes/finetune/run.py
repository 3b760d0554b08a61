"""The fine-tuning job: training stream (Parquet) -> the executor's training (Ray: TorchTrainer,
DDP; or this process) -> SparseEncoder directory. Written against the executor; no Ray here.

Resume semantics. The training run is named by a digest of the settings that shape the trajectory
(:func:`run_name`) and stored under ``storage`` (default ``<output>/checkpoints``). Rerunning the
same command after the driver died finds that run, logs ``resumed from step N``, and every worker
restores the model, AdamW, the schedule, its RNG and the data position (step N of the stream) from
the latest checkpoint. Lost workers are restarted from it within one run, at most ``max_failures``
times (the executor's ``train``).

Integrity. A restart restores the newest checkpoint that verifies
(``sparse.checkpoints.restore_point``, the same rule in the driver and in every worker); a damaged
one is first taken out of Ray Train's registered list and set aside (``set_aside_damaged``). A
non-finite loss stops the run at that step (one line, exit 2, not retried) before any non-finite
weights are checkpointed, and the exported model is checked finite before ``_SUCCESS``."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

from sembridge_ray.data.registry import dataset_identity
from sembridge_ray.data.stream import StreamInfo, materialise_stream
from sembridge_ray.publish import check_scores, publish
from sembridge_ray.recipes.finetune.config import FinetuneConfig, FinetuneResult
from sembridge_ray.recipes.finetune.final_model import MODEL_DIR, export_checkpoint
from sembridge_ray.recipes.finetune.worker import TENSORBOARD_DIR, Evaluation, fine_tuning
from sembridge_ray.retrieval.dev import DevSet, load_dev
from sembridge_ray.runtime.config import write_config
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import Executor
from sembridge_ray.runtime.identity import RunIdentity, model_identity, require_unchanged
from sembridge_ray.runtime.outputs import atomic_write_json, claim_output, preflight
from sembridge_ray.runtime.placement import Placement
from sembridge_ray.sparse.model import check_mlm, check_push
from sembridge_ray.sparse.tracker import Tracker

log = logging.getLogger(__name__)
SUMMARY, DATA_DIR, CHECKPOINT_DIR = "finetune.json", "data", "checkpoints"


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


def run_finetune(
    cfg: FinetuneConfig, inputs: dict[str, str] | None = None, *, executor: Executor
) -> FinetuneResult:
    """Fine-tune ``cfg.model`` on ``cfg.train`` into ``cfg.output``; skip a finished output, resume
    a broken one; then push the model when ``push_to_hub`` is set (a finished output's too: a rerun
    publishes without training).

    ``inputs`` (identities of the model and the training data) may come from a caller that planned
    them; ``executor`` runs the training (the command line's: Ray's)."""
    if cfg.push_to_hub:
        check_push(cfg.push_to_hub)  # before any work: a push that cannot happen fails in a second
    result = _run_finetune(cfg, inputs, executor)
    if not cfg.push_to_hub:
        return result
    url = publish(Path(result.output), MODEL_DIR, cfg.push_to_hub, cfg.scores)
    return replace(result, pushed=url)


def _run_finetune(
    cfg: FinetuneConfig, inputs: dict[str, str] | None, executor: Executor
) -> FinetuneResult:
    """:func:`run_finetune` without the push: everything checked before the output is claimed, then
    the training."""
    named = cfg  # as the user named the inputs: what the model card shows
    cfg = cfg.resolved()
    executor.start()
    cfg = replace(cfg, precision=executor.precision(cfg.precision, cfg.resources, reserve=False))
    identity = cfg.identity(
        "finetune", with_eval_identity(cfg, inputs) if inputs else input_identities(cfg)
    )
    if cfg.push_to_hub:
        check_scores(identity, MODEL_DIR, cfg.scores)
    # before any output
    dev = load_dev(cfg.eval, cfg.eval_split, cfg.eval_max_queries) if cfg.eval else None
    if cfg.tensorboard:
        Tracker.require()
    out = Path(cfg.output)
    # the output's checks (path, lock, settings) before Ray starts
    if preflight(out, identity, cfg.overwrite):
        return _finished(out)
    # Train workers hold back no CPU for Ray Data
    _require_fit(cfg, executor.planned(cfg.resources, reserve=False))
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:
            return _finished(out)
        # claim.path: the output, or its staging directory under --overwrite
        summary = _train(claim.path, cfg, named, identity, dev, executor)
        claim.finish(exclude=(CHECKPOINT_DIR, DATA_DIR, TENSORBOARD_DIR))
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
    executor: Executor,
) -> FinetuneResult:
    """Train into ``work`` (the claimed output or its staging directory), export the model, write
    the summary."""
    stream, info = materialise_stream(stream_info(cfg), work / DATA_DIR)
    write_config(cfg, work / "config.yaml")
    plan = executor.placement(cfg.resources, reserve=False)
    if plan.workers != cfg.resources.workers:  # a joined cluster that shrank since the check above
        raise InputError(
            f"the cluster now fits {plan.workers} of the {cfg.resources.workers} workers asked for"
        )
    storage = cfg.storage or str((work / CHECKPOINT_DIR).resolve())
    ev = Evaluation(dev=dev, every=eval_steps(cfg, info.total_steps), work=work)
    training = fine_tuning(cfg, stream, info.total_steps, plan, storage, run_name(identity), ev)
    resumed = executor.resume_step(training)
    if resumed is not None:
        log.info("resumed from step %d (run %s in %s)", resumed, training.name, storage)
    start = time.perf_counter()
    with executor.train(training) as final:
        exported = export_checkpoint(final, cfg, work, info.total_steps, training.run_dir, named)
    # every worker (and the export) loaded the model, the stream was read: still the inputs the
    # identity names?
    require_unchanged(identity.inputs, {"model": cfg.model, "train": cfg.train, "eval": cfg.eval})
    out = Path(cfg.output)
    summary = FinetuneResult(
        output=str(out),
        model=str(out / MODEL_DIR),
        steps=info.total_steps,
        run_name=training.name,
        # where they are once complete
        storage=cfg.storage or str((out / CHECKPOINT_DIR).resolve()),
        resumed_from=resumed,
        workers=plan.workers,
        seconds=round(time.perf_counter() - start, 2),
        final=exported.final,
        select=cfg.select,
        best=exported.best,
        collapsed=exported.collapsed,
        convergence=dict(exported.convergence) if dev is not None else {},
        eval_seconds=exported.eval_seconds,
    )
    atomic_write_json(work / SUMMARY, {**asdict(summary), "stream": asdict(info)})
    return summary


def run_name(identity: RunIdentity) -> str:
    """The training's run name: the run's fingerprint, so the same settings and inputs resume the
    same run."""
    return f"finetune-{identity.fingerprint[:16]}"


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


def eval_steps(cfg: FinetuneConfig, total_steps: int) -> int:
    """Steps between evaluations: ``eval_every``, or a tenth of the run (0 = no development set)."""
    if not cfg.eval:
        return 0
    return cfg.eval_every or max(1, -(-total_steps // 10))
