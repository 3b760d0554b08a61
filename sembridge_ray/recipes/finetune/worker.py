"""The fine-tuning as an executor runs it (:func:`fine_tuning`), and a worker's whole run in it
(:func:`worker_body`), the same code on a Ray Train worker and in one process (the executor's
:class:`~sembridge_ray.runtime.executor.TrainContext` says which): the model, AdamW and RNG
restored or seeded, the steps of ``sparse.loop.train``, development evaluations, logs,
TensorBoard, checkpoints and reports."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, cast

import torch
import torch.distributed as dist

from sembridge_ray.json_types import JSONObject
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.finetune.dev_run import DevRun
from sembridge_ray.retrieval.dev import DevSet
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import TrainContext, Training, is_local, run_dir
from sembridge_ray.runtime.logs import setup_logging
from sembridge_ray.runtime.placement import Placement
from sembridge_ray.runtime.progress import EVERY_S, duration
from sembridge_ray.sparse import loop
from sembridge_ray.sparse.checkpoints import (
    BestState,
    checkpoint_name,
    load_best,
    load_part,
    restore_point,
    set_aside_damaged,
    write_part,
)
from sembridge_ray.sparse.collective import LocalCollective, TorchCollective
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import SpladeEncoder, load_mlm
from sembridge_ray.sparse.tracker import Tracker

# the job's logger, whichever module of it logs
log = logging.getLogger("sembridge_ray.recipes.finetune.run")
TENSORBOARD_DIR = "tensorboard"


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


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What the workers evaluate and where the tracker writes (from the driver)."""

    dev: DevSet | None
    every: int
    work: Path


def fine_tuning(
    cfg: FinetuneConfig,
    stream: Path,
    total_steps: int,
    plan: Placement,
    storage: str,
    name: str,
    ev: Evaluation,
) -> Training:
    """The fine-tuning as its executor runs it: every worker's :func:`worker_body`, checkpoints by
    ``sparse.checkpoints``' rules, ``plan``'s workers, the checkpoints under ``storage/name``."""
    tensorboard = str((ev.work / TENSORBOARD_DIR).resolve()) if cfg.tensorboard else ""
    config: LoopConfig = {
        "cfg": cfg.to_dict(),
        "total_steps": total_steps,
        "run_dir": run_dir(storage, name),
        "dev": ev.dev,
        "eval_every": ev.every,
        "tensorboard": tensorboard,
    }
    return Training(
        body=worker_body,
        config=config,
        stream=stream,
        plan=plan,
        storage=storage,
        name=name,
        keep=cfg.keep_checkpoints,
        max_failures=cfg.max_failures,
        set_aside=set_aside_damaged,
        newest=restore_point,
        label=f"fine-tuning: {total_steps} steps",
    )


def evaluated(step: int, total: int, at: tuple[int, ...], every: int) -> bool:
    """Whether step ``step`` of ``total`` is evaluated: one of ``at`` when given, else every
    ``every``-th; the last step always (step 0 is evaluated before training starts)."""
    return step == total or (step in at if at else step % every == 0)


def worker_body(config: Mapping[str, object], ctx: TrainContext) -> None:
    """One worker's whole run (``config``: a :class:`LoopConfig`): the model, AdamW and its RNG
    restored or seeded, the steps of ``sparse.loop.train`` on this worker's share of every global
    batch, evaluations of the development set, logs, checkpoints."""
    setup_logging("INFO", force=False)
    loop_cfg = cast(LoopConfig, config)
    cfg, total = FinetuneConfig.from_dict(loop_cfg["cfg"]), int(loop_cfg["total_steps"])
    rank, world, device = ctx.rank, ctx.world, ctx.device
    mlm, tokenizer = load_mlm(cfg.model, cfg.trust_remote_code)
    model = ctx.prepare(SpladeEncoder(mlm, chunk=cfg.pool_chunk))
    encoder = cast(SpladeEncoder, getattr(model, "module", model))
    optimizer, scheduler = loop.build_optimizer(model, cfg.optim, total)
    torch.manual_seed(cfg.seed * 1_000_003 + rank)
    start, history, best = _restore(ctx, loop_cfg["run_dir"], encoder, optimizer, scheduler)
    if rank == 0:
        if start:
            log.info("resumed from step %d of %d", start, total)
        log.info("%d worker(s) ready on %s: steps %d to %d", world, device, start + 1, total)
    batches = step_batches(ctx, cfg, tokenizer, start)
    plan = _loop_plan(cfg, total)
    comm = TorchCollective() if world > 1 else LocalCollective()
    dev_set, tensorboard = loop_cfg["dev"], loop_cfg["tensorboard"]
    dev = None
    if dev_set:
        dev = DevRun.start(dev_set, cfg, encoder, tokenizer, rank, world, str(device), best)
    steps = _Steps(
        cfg=cfg,
        config=loop_cfg,
        ctx=ctx,
        training=(encoder, optimizer, scheduler),
        history=history,
        dev=dev,
        tracker=Tracker.open(tensorboard, start) if rank == 0 and tensorboard else None,
        start=start,
        total=total,
    )
    for step, metrics in loop.train(
        model, batches, optimizer, scheduler, plan, start=start, comm=comm
    ):
        steps.after(step, metrics)
    if steps.tracker is not None:  # rank 0's TensorBoard events closed
        steps.tracker.close()


def step_batches(
    ctx: TrainContext, cfg: FinetuneConfig, tokenizer: loop.Tokenize, start: int
) -> Iterator[loop.PairBatch]:
    """This worker's tokenised share of every global batch from step ``start + 1``: the stream's
    rows in order (one global batch of rows per step, whatever the number of workers)."""
    return loop.pair_batches(
        ctx.batches(cfg.optim.batch_size),
        tokenizer,
        cfg.max_query_length,
        cfg.max_doc_length,
        rank=ctx.rank,
        world=ctx.world,
        skip=start,
        device=ctx.device,
    )


def _restore(
    ctx: TrainContext,
    run_dir: str,
    encoder: SpladeEncoder,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, list[dict[str, float]], BestState | None]:
    """(the step, the metrics so far, rank 0's best weights) of the checkpoint this worker restores,
    its state and RNG loaded into the live objects; (0, [], None) for a fresh run. On a path, the
    newest that verifies (``restore_point``, the driver's rule too), whether or not the executor
    registered it; a registered checkpoint is never restored unverified. On object storage, which is
    not verified (it would download every checkpoint), the one the executor registered."""
    start, history, best = 0, list[dict[str, float]](), None
    with ctx.registered() as ckpt:
        if is_local(run_dir):
            point = restore_point(run_dir)
            if point is None and ckpt is not None:
                raise InputError(
                    f"{ckpt}: Ray Train registered this checkpoint but no checkpoint under {run_dir} verifies "
                    f"on node {ctx.node}; set storage= to storage every node sees"
                )
            ckpt = point[1] if point is not None else None
        if ckpt is not None:
            state, rng, history = load_part(ckpt, ctx.rank)
            start = loop.restore_state(state, encoder, optimizer, scheduler)
            best = load_best(ckpt) if ctx.rank == 0 else None
            if rng is not None:
                loop.set_rng_state(rng)
    return start, history, best


def _loop_plan(cfg: FinetuneConfig, total: int) -> loop.LoopPlan:
    """What ``sparse.loop.train`` runs: the steps, the global batch, the loss, clipping, precision
    and logging."""
    return loop.LoopPlan(
        total_steps=total,
        global_batch=cfg.optim.batch_size,
        loss=cfg.loss,
        clip_norm=cfg.optim.clip_norm,
        bf16=cfg.precision == "bf16",  # resolved by the driver (run_finetune), never per worker
        log_every=cfg.log_every,
    )


@dataclass(kw_only=True)
class _Steps:
    """What a worker does after each training step: evaluations, the metrics kept (history,
    TensorBoard), rank 0's log lines, checkpoints and reports."""

    cfg: FinetuneConfig
    config: LoopConfig
    ctx: TrainContext
    training: tuple[SpladeEncoder, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]
    history: list[dict[str, float]]
    dev: DevRun | None
    tracker: Tracker | None
    start: int
    total: int
    began: float = field(init=False)
    last_line: float = field(init=False)
    last_report: float = field(init=False)

    def __post_init__(self) -> None:
        """Step 0 evaluated in a fresh run (its figures kept as a step's), then the clocks start."""
        if self.dev is not None and self.start == 0:
            self.history.append({"step": 0, **self.dev.evaluate(0)})
            if self.tracker is not None:
                self.tracker.write(self.history[-1])
        self.last_report = self.began = self.last_line = time.monotonic()

    def after(self, step: int, metrics: dict[str, float] | None) -> None:
        """Step ``step`` done (``metrics``: None between two ``log_every`` steps): evaluate, log,
        checkpoint, report."""
        if self.dev is not None and evaluated(
            step, self.total, self.cfg.eval_at, int(self.config["eval_every"])
        ):
            metrics = {**(metrics or {"step": step}), **self.dev.evaluate(step)}
        if metrics is not None:
            self._record(step, metrics)
        if (
            self.ctx.rank == 0
            and step < self.total
            and time.monotonic() - self.last_line >= EVERY_S
        ):
            # between two log_every steps: where it is, by time (log_every is part of the run's
            # identity)
            per_step = self._per_step(step)
            eta = self._eta(per_step, step)
            log.info("step %d/%d, %.2f s/step, ETA %s", step, self.total, per_step, eta)
            self.last_line = time.monotonic()
        if step % self.cfg.checkpoint_every == 0 or step == self.total:
            self._checkpoint(step, metrics)
        elif metrics is not None and _due(self.ctx, self.last_report, self.cfg.report_every_s):
            self.ctx.report(metrics)
            self.last_report = time.monotonic()

    def _record(self, step: int, metrics: dict[str, float]) -> None:
        """Keep a step's metrics (history, TensorBoard); rank 0 logs a training step's line."""
        self.history.append(metrics)
        if self.tracker is not None:
            self.tracker.write(metrics)
        if self.ctx.rank == 0 and "loss" in metrics:
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
        # never a checkpoint of diverged weights (the newest finite one stays the one a rerun
        # resumes from); every worker holds the same weights (DDP), so all stop here together
        require_finite(
            encoder.state_dict(), f"training diverged at step {step}", loop.DIVERGED_HINT
        )
        state = loop.capture_state(encoder, optimizer, scheduler, step)
        kept = self.dev.best if self.dev is not None else None
        rank0 = self.ctx.rank == 0
        with self.ctx.checkpoint(metrics or {"step": step}, checkpoint_name(step)) as part:
            # every rank its part (rank 0 also the state, the metrics so far, the best weights)
            write_part(
                part,
                self.ctx.rank,
                self.ctx.world,
                loop.rng_state(),
                state if rank0 else None,
                "".join(json.dumps(m) + "\n" for m in self.history) if rank0 else None,
                kept if rank0 else None,
                json.dumps(self.config["cfg"]) if rank0 else None,
            )
        self.last_report = time.monotonic()


def _due(ctx: TrainContext, since: float, every_s: float) -> bool:
    """Whether rank 0's clock says a report is due; every rank follows it (reports are a barrier in
    Ray Train)."""
    flag = torch.tensor([float(time.monotonic() - since >= every_s)], device=ctx.device)
    if ctx.world > 1:
        dist.broadcast(flag, src=0)
    return bool(flag.item())
