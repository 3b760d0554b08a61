"""Diverged training and non-finite models are refused: the loop stops at the first non-finite step
before it updates the weights, and a state dict with NaN or infinity is named, as a one-line input
error."""

from __future__ import annotations

import pytest
import torch

from sembridge_ray.cli import user_error
from sembridge_ray.recipes.finetune.config import OptimConfig
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.sparse.collective import LocalCollective
from sembridge_ray.sparse.finite import NonFiniteError, nonfinite, require_finite
from sembridge_ray.sparse.loop import LoopPlan, PairBatch, build_optimizer, pair_batches, train
from sembridge_ray.sparse.model import SpladeEncoder, load_mlm


class Toy(torch.nn.Module):
    """A linear 'encoder' with SPLADE's activation: features {"x": (b, 4)} -> (b, 4)
    non-negative."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, *features: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [torch.log1p(torch.relu(self.lin(f["x"]))) for f in features]


def _batches(count: int, nan_at: int | None = None) -> list[PairBatch]:
    g = torch.Generator().manual_seed(0)
    batches = []
    for step in range(1, count + 1):
        query = torch.randn(2, 4, generator=g)
        if step == nan_at:
            query[1, 2] = float("nan")  # one value of one query, as a broken row of data would give
        batches.append(PairBatch({"x": query}, [{"x": torch.randn(2, 4, generator=g)}]))
    return batches


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_loop_stops_at_the_first_non_finite_loss_before_updating_the_weights() -> None:
    torch.manual_seed(0)
    toy = Toy()
    optimizer, scheduler = build_optimizer(toy, OptimConfig(lr=1e-2), 6)
    plan = LoopPlan(total_steps=6, global_batch=2, log_every=1)
    done, weights = [], {}
    with pytest.raises(
        NonFiniteError, match=r"^training diverged at step 4: the loss is not finite"
    ) as err:
        for step, metrics in train(toy, _batches(6, nan_at=4), optimizer, scheduler, plan):
            # every yielded step is finite
            assert metrics is not None and metrics["loss"] == metrics["loss"]
            done.append(step)
            weights = _weights(toy)
    assert done == [1, 2, 3]
    after = _weights(toy)
    assert all(torch.equal(after[k], weights[k]) for k in after)  # step 4 changed nothing
    assert nonfinite(after) == []
    # one line, exit 2
    assert isinstance(err.value, InputError) and user_error(err.value) == str(err.value)
    assert "\n" not in str(err.value) and "optim.lr" in str(err.value)


class OtherWorkerDiverged(LocalCollective):
    """Rank 0's view of a two-worker group whose other worker's loss is NaN: in every all-reduce the
    other worker contributes 0 (its finiteness flag), so the mean of the flags is 1/2."""

    world = 2

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor.detach() + torch.zeros_like(tensor)) / self.world


def test_every_worker_stops_when_one_worker_alone_diverges() -> None:
    torch.manual_seed(0)
    toy = Toy()
    before = _weights(toy)
    optimizer, scheduler = build_optimizer(toy, OptimConfig(lr=1e-2), 3)
    plan = LoopPlan(total_steps=3, global_batch=4, log_every=10)
    steps = train(toy, _batches(3), optimizer, scheduler, plan, comm=OtherWorkerDiverged())
    with pytest.raises(NonFiniteError, match="at step 1:"):
        next(steps)  # this worker's own loss is finite
    assert all(torch.equal(v, before[k]) for k, v in _weights(toy).items())


def test_a_huge_weight_decay_on_a_real_encoder_is_stopped_at_step_two(fixtures_root) -> None:
    mlm, tokenizer = load_mlm(str(fixtures_root / "bert-mlm"))
    model = SpladeEncoder(mlm, chunk=4)
    # AdamW's decoupled decay multiplies every weight by 1 - lr · weight_decay = 1 - 1e11 per step
    optimizer, scheduler = build_optimizer(
        model, OptimConfig(lr=1e-4, weight_decay=1e15, warmup_ratio=0.0), 4
    )
    raw = [
        {
            "query": ["a man plays a guitar", "a dog runs"],
            "positive": ["someone plays", "the dog is running"],
        }
    ]
    batches = pair_batches(raw * 4, tokenizer, 16, 16)
    done = []
    # step 2's learning rate: 1e-4 · (4 - 2 + 1) / 4 with no warm-up (linear decay)
    with pytest.raises(
        NonFiniteError, match=r"at step 2: the loss is not finite \(learning rate 7\.5e-05\)"
    ):
        for step, _ in train(
            model, batches, optimizer, scheduler, LoopPlan(total_steps=4, global_batch=2)
        ):
            done.append(step)
            # step 1's weights, about 1e9, are still finite
            assert nonfinite(model.state_dict()) == []
    assert done == [1]  # step 1's loss (initial weights) is finite


def test_non_finite_tensors_of_a_state_dict_are_named_and_refused() -> None:
    state = {
        "ok": torch.ones(3),
        "nan": torch.tensor([0.0, float("nan")]),
        "neg_inf": torch.tensor([-float("inf")]),
        "ids": torch.arange(3),  # integers cannot be NaN: not looked at
        "half": torch.tensor([float("inf")], dtype=torch.float16),
    }
    assert nonfinite(state) == ["nan", "neg_inf", "half"]
    with pytest.raises(NonFiniteError) as err:
        require_finite(state, "the initialised model for /out", "check the source model")
    assert str(err.value) == (
        "the initialised model for /out: NaN or infinite values in 3 weight tensor(s) (first: nan); "
        "check the source model"
    )
    require_finite({"ok": torch.ones(3), "ids": torch.arange(3)}, "finite")  # nothing raised


def test_a_real_model_is_finite(fixtures_root) -> None:
    mlm, _ = load_mlm(str(fixtures_root / "bert-mlm"))
    assert nonfinite(mlm.state_dict()) == []
    # a view of the parameter: writing it poisons the model
    bias = mlm.state_dict()["cls.predictions.bias"]
    bias[7] = float("nan")
    assert "cls.predictions.bias" in nonfinite(mlm.state_dict())
