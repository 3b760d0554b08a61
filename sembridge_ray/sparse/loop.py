"""The SPLADE fine-tuning loop: framework-free (no Ray, no DDP inside); tests feed it a list of tiny
batches.

``train`` yields ``(step, metrics)`` after every optimiser step (``metrics`` on logged steps, else
None). The caller owns checkpointing: ``capture_state`` / ``restore_state`` round-trip the model,
AdamW, the schedule and the step; ``pair_batches(..., skip=step)`` puts the data stream at the same
position, so a resumed run takes exactly the steps an uninterrupted one would have taken."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, TypeVar, cast

import torch

from sembridge_ray.data.schema import NEGATIVE_PREFIX, POSITIVE, QUERY
from sembridge_ray.sparse.collective import Collective, LocalCollective
from sembridge_ray.sparse.config import LossConfig, OptimConfig
from sembridge_ray.sparse.finite import NonFiniteError
from sembridge_ray.sparse.losses import LossWeights, splade_objective
from sembridge_ray.sparse.regularizers import quadratic_warmup

if TYPE_CHECKING:
    from sembridge_ray.sparse.model import SpladeEncoder

Features = dict[str, torch.Tensor]
Tokenize = Callable[..., Mapping[str, torch.Tensor]]
"""A Hugging Face tokenizer, as called here: ``tokenizer(texts, padding=, truncation=, max_length=,
return_tensors="pt")`` -> features."""
T = TypeVar("T")
DIVERGED_HINT = "lower optim.lr or optim.weight_decay, or check the model and the training data"


class TrainState(TypedDict):
    """What :func:`capture_state` returns and a checkpoint's ``state.pt`` holds."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    """``Optimizer.state_dict()``, as torch types it (nested per-parameter state and
    hyper-parameters)."""
    scheduler: dict[str, Any]
    """``LRScheduler.state_dict()``, likewise."""


class RngState(TypedDict):
    """One process's torch RNG streams (:func:`rng_state`)."""

    cpu: torch.Tensor
    cuda: NotRequired[list[torch.Tensor]]
    """Every visible GPU's, where CUDA is available."""


@dataclass(frozen=True)
class PairBatch:
    """One worker's share of a step: tokenised queries and [positives, hard negatives…],
    row-aligned."""

    query: Features
    docs: list[Features]


@dataclass(frozen=True, kw_only=True)
class LoopPlan:
    """What the loop needs to know beyond the model and the data."""

    total_steps: int
    global_batch: int
    loss: LossConfig = field(default_factory=LossConfig)
    clip_norm: float = 1.0
    bf16: bool = False
    log_every: int = 10


def worker_rows(rows: Mapping[str, Sequence[T]], rank: int, world: int) -> dict[str, Sequence[T]]:
    """Rows [rank · b, (rank + 1) · b) of a global batch of world · b rows: this worker's share."""
    size = len(next(iter(rows.values())))
    if size % world:
        raise ValueError(f"a global batch of {size} rows does not split over {world} workers")
    share = size // world
    return {k: v[rank * share : (rank + 1) * share] for k, v in rows.items()}


def pair_batches(
    raw: Iterable[Mapping[str, Sequence[object]]],
    tokenizer: Tokenize,
    max_query_length: int,
    max_doc_length: int,
    *,
    rank: int = 0,
    world: int = 1,
    skip: int = 0,
    device: str | torch.device = "cpu",
) -> Iterator[PairBatch]:
    """Global batches of raw text (in step order; columns ``query``, ``positive``,
    ``negative_1..k``) -> this worker's tokenised batches, from global batch ``skip``.

    Skipped batches are not tokenised. Every worker reads the same global batches and keeps its
    slice, so the batch of step s is the same for any number of workers and after any resume."""

    def encode(texts: Sequence[object], max_length: int) -> Features:
        enc = tokenizer(
            [str(t) for t in texts],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        return {k: v.to(device) for k, v in enc.items()}

    for rows in itertools.islice(raw, skip, None):
        mine = worker_rows(rows, rank, world)
        negatives = sorted(
            (c for c in mine if c.startswith(NEGATIVE_PREFIX)),
            key=lambda c: int(c.rsplit("_", 1)[1]),
        )
        docs = [encode(mine[c], max_doc_length) for c in (POSITIVE, *negatives)]
        yield PairBatch(encode(mine[QUERY], max_query_length), docs)


def lr_factor(step: int, total_steps: int, warmup_ratio: float) -> float:
    """Learning-rate multiplier of 1-based update ``step``: linear warm-up to 1, then linear decay
    towards 0."""
    warmup = max(0, round(warmup_ratio * total_steps))
    if step <= warmup:
        return step / warmup
    return max(0.0, (total_steps - step + 1) / max(1, total_steps - warmup))


FROZEN_UNTIL = "frozen_until"
"""Key of an AdamW parameter group whose parameters get no update up to and including that step."""


def build_optimizer(
    model: torch.nn.Module, optim: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its schedule (``lr_factor``); build after the model is on its device.

    With ``optim.embedding_warmup_steps`` K: two groups, the vocabulary-sized parameters
    (:func:`vocabulary_params`) at ``lr × embedding_warmup_lr_scale`` for steps 1..K, the rest
    frozen then (``FROZEN_UNTIL``: :func:`train` drops their gradients, so AdamW neither moves them
    nor updates their moments); from step K+1 both groups follow ``lr_factor`` over the remaining
    steps."""
    warm = min(optim.embedding_warmup_steps, max(total_steps - 1, 0))

    def after(done: int) -> float:
        return lr_factor(done + 1 - warm, total_steps - warm, optim.warmup_ratio)

    groups: list[dict[str, Any]] = [{"params": list(model.parameters())}]
    factors: list[Callable[[int], float]] = [after]
    if warm:
        vocab = {id(p) for p in vocabulary_params(model)}
        groups = [
            {"params": [p for p in groups[0]["params"] if id(p) in vocab]},
            {"params": [p for p in groups[0]["params"] if id(p) not in vocab], FROZEN_UNTIL: warm},
        ]
        factors = [
            lambda done: optim.embedding_warmup_lr_scale if done < warm else after(done),
            lambda done: 0.0 if done < warm else after(done),
        ]
    optimizer = torch.optim.AdamW(groups, lr=optim.lr, weight_decay=optim.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factors)


def vocabulary_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of a (DDP-wrapped) ``SpladeEncoder`` with one row per vocabulary entry: the
    input embeddings, an untied output matrix, the decoder bias (position and type embeddings have
    fewer rows)."""
    encoder = cast("SpladeEncoder", getattr(model, "module", model))
    size = cast("torch.nn.Embedding", encoder.mlm.get_input_embeddings()).num_embeddings
    return [p for p in model.parameters() if p.ndim and p.shape[0] == size]


def step_weights(step: int, plan: LoopPlan) -> LossWeights:
    warm = quadratic_warmup(step, plan.total_steps, plan.loss.flops_warmup)
    return LossWeights(
        lambda_q=plan.loss.lambda_q * warm,
        lambda_d=plan.loss.lambda_d * warm,
        anti_collapse=plan.loss.anti_collapse,
        scale=plan.loss.scale,
        ranking=plan.loss.ranking,
    )


def train(
    model: torch.nn.Module,
    batches: Iterable[PairBatch],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    plan: LoopPlan,
    *,
    start: int = 0,
    comm: Collective | None = None,
) -> Iterator[tuple[int, dict[str, float] | None]]:
    """Run steps ``start + 1 .. plan.total_steps`` over ``batches`` (which begin at step ``start +
    1``).

    ``model(*features)`` returns one (b, V) tensor per features dict (see ``SpladeEncoder``). Yields
    ``(step, metrics)``; metrics (global over workers) on every ``log_every``-th and on the last
    step. Raises :class:`NonFiniteError` naming the first step whose loss is NaN or infinite, before
    that step's update."""
    comm = comm or LocalCollective()
    device_type = next(model.parameters()).device.type
    model.train()
    clock, last_logged = time.perf_counter(), start
    for step, batch in enumerate(batches, start=start + 1):
        if step > plan.total_steps:
            break
        weights = step_weights(step, plan)
        lr = scheduler.get_last_lr()[0]
        parts = _losses(model, batch, weights, comm, device_type if plan.bf16 else None)
        require_finite_loss(parts["loss"], step, lr, comm)
        grad_norm = _update(model, optimizer, scheduler, parts["loss"], step, plan.clip_norm)
        metrics = None
        if step % plan.log_every == 0 or step == plan.total_steps:
            now = time.perf_counter()
            speed = plan.global_batch * (step - last_logged) / max(now - clock, 1e-9)
            metrics = _step_metrics(step, parts, weights, lr, speed, grad_norm, comm)
            clock, last_logged = now, step
        yield step, metrics


def _losses(
    model: torch.nn.Module,
    batch: PairBatch,
    weights: LossWeights,
    comm: Collective,
    autocast: str | None,
) -> dict[str, torch.Tensor]:
    """The step's loss parts: the forward pass (in bf16 autocast on device type ``autocast``), the
    loss in fp32."""
    with torch.autocast(autocast, dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
        reps = model(batch.query, *batch.docs)
    # the loss is never computed in bf16
    reps = [r.float() if r.dtype in (torch.bfloat16, torch.float16) else r for r in reps]
    return splade_objective(reps[0], reps[1:], weights, comm)


def _update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loss: torch.Tensor,
    step: int,
    clip_norm: float,
) -> torch.Tensor | None:
    """Backward, the frozen group's gradients dropped, clipping (when ``clip_norm`` > 0: the norm),
    AdamW, schedule."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # the embedding-only warm-up: the frozen group gets no update
    for group in optimizer.param_groups:
        if step <= group.get(FROZEN_UNTIL, 0):
            for param in group["params"]:
                param.grad = None
    grad_norm = (
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm) if clip_norm > 0 else None
    )
    optimizer.step()
    scheduler.step()
    return grad_norm


def _step_metrics(
    step: int,
    parts: dict[str, torch.Tensor],
    weights: LossWeights,
    lr: float | torch.Tensor,
    speed: float,
    grad_norm: torch.Tensor | None,
    comm: Collective,
) -> dict[str, float]:
    """A logged step's metrics: the loss parts averaged over workers (one collective), the weights,
    lr and speed."""
    means = comm.mean(torch.stack([v.detach().double() for v in parts.values()]))  # one collective
    return {
        "step": step,
        **dict(zip(parts, means.tolist(), strict=True)),
        "lambda_q": weights.lambda_q,
        "lambda_d": weights.lambda_d,
        "lr": lr,
        "examples_per_s": speed,
        **({} if grad_norm is None else {"grad_norm": float(grad_norm)}),
    }


def require_finite_loss(
    loss: torch.Tensor, step: int, lr: float | torch.Tensor, comm: Collective
) -> None:
    """Stop at a step whose loss is NaN or infinite on any worker: nothing trained after it can be
    right. One worker may diverge alone (a NaN from its share of the data), so the finiteness flags
    are averaged over workers (one scalar collective): every worker stops at the same step, and none
    waits for the others in the next collective."""
    everywhere = comm.mean(torch.isfinite(loss.detach()).to(torch.float32).reshape(1))
    if everywhere.item() != 1.0:
        raise NonFiniteError(
            f"training diverged at step {step}: the loss is not finite (learning rate {float(lr):.3g}); {DIVERGED_HINT}"
        )


def capture_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
) -> TrainState:
    """Everything but the data position and the RNG that a resume needs (tensors are references, not
    copies)."""
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }


def restore_state(
    state: TrainState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> int:
    """Load a ``capture_state`` dict into live objects (the optimiser state follows the parameters'
    device)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def rng_state() -> RngState:
    """This process's torch RNG streams (dropout): each worker saves and restores its own."""
    state: RngState = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: RngState) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
