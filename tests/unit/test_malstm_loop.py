from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from sembridge_ray.data.sick import Pair
from sembridge_ray.siamese.config import TrainConfig
from sembridge_ray.siamese.data import EncodedPairs, encode_pairs, tokenize_pairs, vocabulary
from sembridge_ray.siamese.loop import fit, predict
from sembridge_ray.siamese.model import MaLSTM

WORDS = [
    "man",
    "woman",
    "dog",
    "cat",
    "plays",
    "runs",
    "sleeps",
    "eats",
    "guitar",
    "ball",
    "food",
    "quickly",
]


def _pairs(n: int, seed: int) -> list[Pair]:
    """Relatedness = 1 + 4 · (share of words the two sentences have in common): learnable from the
    words alone."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = rng.choice(WORDS, 4, replace=False)
        b = np.concatenate([a[: rng.integers(0, 5)], rng.choice(WORDS, 4, replace=False)])[:4]
        out.append(
            Pair(
                pair_id=str(i), a=" ".join(a), b=" ".join(b), score=1 + 4 * len(set(a) & set(b)) / 4
            )
        )
    return out


def _setup(seed: int = 0) -> tuple[MaLSTM, EncodedPairs, EncodedPairs]:
    train, val = tokenize_pairs(_pairs(96, 1)), tokenize_pairs(_pairs(48, 2))
    vocab = vocabulary(train, val)
    emb = torch.randn(len(vocab), 6, generator=torch.Generator().manual_seed(0))
    emb[0] = 0
    model = MaLSTM(emb, hidden=8, generator=torch.Generator().manual_seed(seed))
    return model, encode_pairs(train, vocab), encode_pairs(val, vocab)


CFG = TrainConfig(hidden=8, batch_size=16, max_epochs=15, patience=15)


@pytest.mark.parametrize("weight_ema", [0.0, 0.9])
def test_training_lowers_validation_mse_and_keeps_the_best_epoch(weight_ema: float) -> None:
    model, train, val = _setup()
    before = float(np.mean((predict(model, val) - val.score) ** 2))
    result = fit(
        model, train, val, replace(CFG, weight_ema=weight_ema), torch.Generator().manual_seed(0)
    )
    after = float(np.mean((predict(model, val) - val.score) ** 2))
    assert after < before and after == result.best_val_mse == min(result.val_curve)
    assert result.val_curve[result.best_epoch - 1] == result.best_val_mse


def test_early_stopping_waits_patience_epochs_after_the_best() -> None:
    model, train, val = _setup()
    start = predict(model, val)
    result = fit(
        model, train, val, replace(CFG, lr=0.0, patience=4), torch.Generator().manual_seed(0)
    )
    # nothing improves: stop after `patience` epochs
    assert (result.best_epoch, result.epochs_run) == (0, 4)
    np.testing.assert_array_equal(predict(model, val), start)  # and keep the starting weights


def test_training_is_reproducible_from_its_seed() -> None:
    runs = []
    for _ in range(2):
        model, train, val = _setup(seed=5)
        fit(model, train, val, replace(CFG, max_epochs=3), torch.Generator().manual_seed(5))
        runs.append(predict(model, val))
    np.testing.assert_array_equal(runs[0], runs[1])
