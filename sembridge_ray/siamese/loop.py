"""Training and prediction for the MaLSTM, free of Ray: Adadelta, gradient-norm clipping, early
stopping."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from sembridge_ray.siamese.config import PretrainConfig, TrainConfig
from sembridge_ray.siamese.data import EncodedPairs
from sembridge_ray.siamese.model import MaLSTM, to_score, to_target
from sembridge_ray.siamese.prepare import Prepared

log = logging.getLogger(__name__)
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def batches(data: EncodedPairs, size: int, order: np.ndarray | None = None) -> Iterator[Batch]:
    """(ids_a (B, Ta), len_a (B,), ids_b (B, Tb), len_b (B,), score (B,)) in ``order``, trimmed to
    each batch's longest sentence."""
    order = np.arange(len(data)) if order is None else order
    for start in range(0, len(order), size):
        idx = order[start : start + size]
        la, lb = data.len_a[idx], data.len_b[idx]
        yield (
            torch.from_numpy(data.ids_a[idx, : max(1, la.max())]),
            torch.from_numpy(la),
            torch.from_numpy(data.ids_b[idx, : max(1, lb.max())]),
            torch.from_numpy(lb),
            torch.from_numpy(data.score[idx]).float(),
        )


@torch.no_grad()
def predict(model: MaLSTM, data: EncodedPairs, batch_size: int = 512) -> np.ndarray:
    """Scores on the 1-5 scale (N,) float64, in ``data``'s order."""
    model.eval()
    out = [to_score(model(a, la, b, lb)) for a, la, b, lb, _ in batches(data, batch_size)]
    return torch.cat(out).double().numpy()


def mse(pred: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean((pred - gold) ** 2))


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """The best epoch (1-based; 0 = the starting weights) by the stopping metric, that epoch's
    validation MSE, and the stopping metric's curve."""

    best_epoch: int
    best_val_mse: float
    epochs_run: int
    val_curve: tuple[float, ...]
    seconds: float


def fit(
    model: MaLSTM,
    train: EncodedPairs,
    val: EncodedPairs,
    cfg: TrainConfig,
    generator: torch.Generator,
    stage: str = "train",
) -> FitResult:
    """Train ``model`` in place and leave it at its best validation epoch.

    Early stopping watches an exponential moving average of the validation MSE (``cfg.smoothing``; 0
    = the raw value), because the raw curve jumps between epochs; the weights kept are those of the
    best *raw* epoch. With ``cfg.weight_ema`` > 0 the weights evaluated (and kept) are an
    exponential moving average of the optimiser's iterates (Polyak averaging), updated after every
    step."""
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adadelta(params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps)
    averaged = [p.detach().clone() for p in params] if cfg.weight_ema > 0 else None
    pred = predict(model, val)
    best = _Best(
        state=_trainable_state(params),
        loss=stopping_loss(pred, val.score, cfg.stop_on),
        mse=mse(pred, val.score),
    )
    patience = _Patience(smooth=best.loss, best=best.loss)
    start, epoch = time.perf_counter(), 0
    for epoch in range(1, cfg.max_epochs + 1):
        train_epoch(model, params, opt, train, cfg, generator, averaged)
        loss = _validate(model, params, averaged, val, cfg.stop_on, best, epoch)
        patience.update(loss, cfg.smoothing, cfg.min_delta)
        if epoch % 10 == 0:
            log.info(
                "%s epoch %d: val %s %.4f (best %.4f at %d)",
                stage,
                epoch,
                cfg.stop_on,
                loss,
                best.loss,
                best.epoch,
            )
        if patience.since >= cfg.patience or not math.isfinite(loss):
            break
    _load(params, best.state)
    return FitResult(
        best_epoch=best.epoch,
        best_val_mse=best.mse,
        epochs_run=epoch,
        val_curve=tuple(patience.curve),
        seconds=time.perf_counter() - start,
    )


@dataclass(kw_only=True)
class _Best:
    """The best raw epoch so far: its trainable weights, stopping loss, validation MSE and number
    (0: the start)."""

    state: list[torch.Tensor]
    loss: float
    mse: float
    epoch: int = 0


@dataclass(kw_only=True)
class _Patience:
    """Early stopping's curve: each epoch's stopping loss, its moving average, the average's best,
    epochs since."""

    smooth: float
    best: float
    since: int = 0
    curve: list[float] = field(default_factory=list)

    def update(self, loss: float, smoothing: float, min_delta: float) -> None:
        """Record an epoch's loss; the count restarts when the average beats its best by more than
        ``min_delta``."""
        self.curve.append(loss)
        self.smooth = smoothing * self.smooth + (1 - smoothing) * loss
        if self.smooth < self.best - min_delta:
            self.best, self.since = self.smooth, 0
        else:
            self.since += 1


def _validate(
    model: MaLSTM,
    params: list[torch.Tensor],
    averaged: list[torch.Tensor] | None,
    val: EncodedPairs,
    metric: str,
    best: _Best,
    epoch: int,
) -> float:
    """The epoch's stopping loss on ``val`` under the evaluated weights, which become ``best`` when
    they beat it."""
    with _swapped(params, averaged):
        pred = predict(model, val)
        loss = stopping_loss(pred, val.score, metric)
        if loss < best.loss:
            best.state, best.loss, best.epoch = _trainable_state(params), loss, epoch
            best.mse = mse(pred, val.score)
    return loss


def stopping_loss(pred: np.ndarray, gold: np.ndarray, metric: str) -> float:
    """Lower is better: the raw MSE, or 1 − Pearson r (what a calibrated model's MSE depends on: a
    monotone recalibration removes the raw scores' offset and scale, not their correlation)."""
    if metric == "mse":
        return mse(pred, gold)
    r = float(np.corrcoef(pred, gold)[0, 1])
    return 1.0 - r if math.isfinite(r) else math.inf


def train_epoch(
    model: MaLSTM,
    params: list[torch.Tensor],
    opt: torch.optim.Optimizer,
    train: EncodedPairs,
    cfg: TrainConfig,
    generator: torch.Generator,
    averaged: list[torch.Tensor] | None,
) -> None:
    """One shuffled pass: MSE on (y − 1)/4, gradient-norm clipping, then the running weight average
    if any."""
    model.train()
    order = torch.randperm(len(train), generator=generator).numpy()
    for ids_a, len_a, ids_b, len_b, score in batches(train, cfg.batch_size, order):
        loss = nn.functional.mse_loss(model(ids_a, len_a, ids_b, len_b), to_target(score))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, cfg.clip_norm)
        opt.step()
        if averaged is not None:
            with torch.no_grad():
                for avg, p in zip(averaged, params, strict=True):
                    avg.lerp_(p, 1.0 - cfg.weight_ema)


def _trainable_state(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


@torch.no_grad()
def _load(params: list[torch.Tensor], weights: list[torch.Tensor]) -> None:
    for p, w in zip(params, weights, strict=True):
        p.copy_(w)


@contextlib.contextmanager
def _swapped(params: list[torch.Tensor], weights: list[torch.Tensor] | None) -> Iterator[None]:
    """Temporarily load ``weights`` into ``params`` (nothing when None)."""
    if weights is None:
        yield
        return
    saved = _trainable_state(params)
    _load(params, weights)
    try:
        yield
    finally:
        _load(params, saved)


@dataclass(frozen=True, kw_only=True)
class RestartResult:
    """One restart: its best model's raw predictions on validation (N_val,) and test (N_test,), and
    how it got there."""

    seed: int
    val_pred: np.ndarray
    test_pred: np.ndarray
    val_mse: float
    pretrain: FitResult | None
    train: FitResult


def train_restart(
    data: Prepared, train: TrainConfig, pretrain: PretrainConfig, seed: int
) -> RestartResult:
    """Pretrain on STS (when ``data`` has it; ``pretrain``'s epochs and patience, ``train``'s
    optimiser), then train on SICK from those weights; everything seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    model = MaLSTM(
        torch.tensor(data.embeddings), train.hidden, train.forget_bias, train.init_sigma, generator
    )
    pre = None
    if data.sts_train is not None and data.sts_val is not None:
        stage = replace(train, max_epochs=pretrain.max_epochs, patience=pretrain.patience)
        pre = fit(
            model, data.sts_train, data.sts_val, stage, generator, stage=f"seed {seed} pretrain"
        )
    result = fit(model, data.train, data.val, train, generator, stage=f"seed {seed} train")
    return RestartResult(
        seed=seed,
        val_pred=predict(model, data.val),
        test_pred=predict(model, data.test),
        val_mse=result.best_val_mse,
        pretrain=pre,
        train=result,
    )
