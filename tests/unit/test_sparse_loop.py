"""The framework-free loop on a list of tiny batches: it learns, logs every key, and resumes
exactly."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.recipes.finetune.config import LossConfig, OptimConfig
from sembridge_ray.sparse.loop import (
    LoopPlan,
    build_optimizer,
    capture_state,
    pair_batches,
    restore_state,
    rng_state,
    set_rng_state,
    train,
    worker_rows,
)
from sembridge_ray.sparse.model import SpladeEncoder, load_mlm

METRIC_KEYS = {
    "step",
    "loss",
    "infonce",
    "flops_q",
    "flops_d",
    "lambda_q",
    "lambda_d",
    "active_dims_q",
    "active_dims_d",
    "lr",
    "examples_per_s",
}
QUERIES = [
    "a man is playing a guitar",
    "a dog runs in the grass",
    "two kids sit on a bench",
    "a woman cooks",
    "the sun is shining",
    "a cat sleeps on a sofa",
]
DOCS = [
    "someone plays guitar",
    "the dog is running outside",
    "children are sitting",
    "a lady is cooking food",
    "it is a sunny day",
    "the kitten is asleep",
]


def _raw_batches(size: int = 3) -> list[dict[str, list[str]]]:
    return [
        {QUERY: QUERIES[i : i + size], POSITIVE: DOCS[i : i + size]}
        for i in range(0, len(QUERIES), size)
    ]


def _setup(fixtures_root, total: int, lr: float = 1e-3):
    mlm, tokenizer = load_mlm(str(fixtures_root / "bert-mlm"))
    model = SpladeEncoder(mlm, chunk=4)
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=lr, warmup_ratio=0.0), total)
    return model, tokenizer, optimizer, scheduler


def _plan(total: int) -> LoopPlan:
    return LoopPlan(
        total_steps=total,
        global_batch=3,
        loss=LossConfig(lambda_q=1e-3, lambda_d=1e-3),
        log_every=1,
    )


def test_the_loop_learns_and_logs_every_metric(fixtures_root) -> None:
    total = 8
    model, tok, optimizer, scheduler = _setup(fixtures_root, total)
    batches = list(pair_batches(_raw_batches()[:1] * total, tok, 16, 16))
    out = list(train(model, batches, optimizer, scheduler, _plan(total)))
    assert [step for step, _ in out] == list(range(1, total + 1))
    metrics = [m for _, m in out if m is not None]
    assert len(metrics) == total and all(set(m) >= METRIC_KEYS for m in metrics)
    assert metrics[-1]["infonce"] < metrics[0]["infonce"]
    assert metrics[0]["lambda_q"] < metrics[-1]["lambda_q"] == pytest.approx(1e-3)


def test_the_loop_logs_every_nth_step_and_the_last() -> None:
    model = torch.nn.Linear(4, 4)

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = model

        def forward(self, *features):
            return [torch.log1p(torch.relu(self.lin(f["x"]))) for f in features]

    from sembridge_ray.sparse.loop import PairBatch

    g = torch.Generator().manual_seed(0)
    batches = [
        PairBatch({"x": torch.randn(2, 4, generator=g)}, [{"x": torch.randn(2, 4, generator=g)}])
        for _ in range(7)
    ]
    toy = Toy()
    optimizer, scheduler = build_optimizer(toy, OptimConfig(), 7)
    plan = LoopPlan(total_steps=7, global_batch=2, log_every=3)
    logged = [step for step, m in train(toy, batches, optimizer, scheduler, plan) if m is not None]
    assert logged == [3, 6, 7]


def test_a_resumed_run_takes_exactly_the_same_steps(fixtures_root) -> None:
    total, cut = 4, 2
    raw = _raw_batches(size=2)[:2] * 2  # 4 global batches of 2 pairs
    torch.manual_seed(5)
    model, tok, optimizer, scheduler = _setup(fixtures_root, total)
    straight = [
        m
        for _, m in train(model, pair_batches(raw, tok, 16, 16), optimizer, scheduler, _plan(total))
    ]

    torch.manual_seed(5)
    model, tok, optimizer, scheduler = _setup(fixtures_root, total)
    first = list(
        itertools.islice(
            train(model, pair_batches(raw, tok, 16, 16), optimizer, scheduler, _plan(total)), cut
        )
    )
    buffer = io.BytesIO()
    torch.save({**capture_state(model, optimizer, scheduler, cut), "rng": rng_state()}, buffer)
    torch.manual_seed(99)  # a new process would have a different stream
    model, tok, optimizer, scheduler = _setup(fixtures_root, total)
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    start = restore_state(state, model, optimizer, scheduler)
    set_rng_state(state["rng"])
    rest = list(
        train(
            model,
            pair_batches(raw, tok, 16, 16, skip=start),
            optimizer,
            scheduler,
            _plan(total),
            start=start,
        )
    )
    assert start == cut and [s for s, _ in rest] == [3, 4]
    resumed = [m for _, m in first] + [m for _, m in rest]
    for a, b in zip(straight, resumed, strict=True):
        assert a is not None and b is not None
        for key in ("loss", "infonce", "flops_q", "flops_d", "lr", "lambda_q"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key


def test_pair_batches_split_a_global_batch_by_rank_and_skip_without_tokenising() -> None:
    rows = {QUERY: ["q0", "q1", "q2", "q3"], POSITIVE: ["d0", "d1", "d2", "d3"]}
    assert worker_rows(rows, 1, 2) == {QUERY: ["q2", "q3"], POSITIVE: ["d2", "d3"]}
    with pytest.raises(ValueError, match="does not split"):
        worker_rows(rows, 0, 3)
    seen = []

    def tokenizer(texts, **_):
        seen.append(list(texts))
        return {
            "input_ids": torch.zeros(len(texts), 2, dtype=torch.long),
            "attention_mask": torch.ones(len(texts), 2, dtype=torch.long),
        }

    raw = [
        rows,
        {QUERY: ["x0", "x1", "x2", "x3"], POSITIVE: ["y0", "y1", "y2", "y3"]},
        {
            QUERY: ["z0", "z1", "z2", "z3"],
            POSITIVE: ["w0", "w1", "w2", "w3"],
            "negative_1": list("abcd"),
        },
    ]
    out = list(pair_batches(raw, tokenizer, 8, 8, rank=0, world=2, skip=1))
    assert len(out) == 2 and len(out[1].docs) == 2
    assert ["x0", "x1"] in seen and ["a", "b"] in seen and ["q0", "q1"] not in seen


def test_bf16_autocast_runs_and_keeps_the_loss_in_fp32(fixtures_root) -> None:
    model, tok, optimizer, scheduler = _setup(fixtures_root, 1)
    plan = LoopPlan(total_steps=1, global_batch=3, bf16=True, log_every=1)
    ((step, metrics),) = list(
        train(model, pair_batches(_raw_batches()[:1], tok, 16, 16), optimizer, scheduler, plan)
    )
    assert (
        step == 1
        and metrics is not None
        and all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    )
    assert next(model.parameters()).dtype == torch.float32


def test_the_embedding_warmup_trains_only_the_vocabulary_rows_then_everything(
    fixtures_root,
) -> None:
    total, warm, lr, scale = 5, 2, 1e-3, 10.0
    mlm, tok = load_mlm(str(fixtures_root / "bert-mlm"))
    model = SpladeEncoder(mlm, chunk=4)
    optim = OptimConfig(
        lr=lr, warmup_ratio=0.0, embedding_warmup_steps=warm, embedding_warmup_lr_scale=scale
    )
    optimizer, scheduler = build_optimizer(model, optim, total)
    vocab = {
        id(p)
        for p in (mlm.get_input_embeddings().weight, mlm.get_parameter("cls.predictions.bias"))
    }
    # the tied decoder is the same tensor
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == vocab
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = iter(pair_batches(_raw_batches()[:1] * total, tok, 16, 16))
    steps = train(model, batches, optimizer, scheduler, _plan(total))
    logged = [m for _, m in itertools.islice(steps, warm)]
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    vocab_names = {n for n, p in model.named_parameters() if id(p) in vocab}
    assert moved == vocab_names  # nothing but the vocabulary rows and the bias in the first K steps
    assert [m["lr"] for m in logged if m] == pytest.approx([lr * scale] * warm)
    rest = [m for _, m in steps]
    # then the whole model, on a fresh linear decay over the remaining 3 steps: lr * 3/3, 2/3, 1/3
    assert [m["lr"] for m in rest if m] == pytest.approx([lr, lr * 2 / 3, lr / 3])
    assert all(
        not torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad
    )


def test_no_embedding_warmup_is_one_group_on_the_plain_schedule(fixtures_root) -> None:
    mlm, _ = load_mlm(str(fixtures_root / "bert-mlm"))
    optimizer, scheduler = build_optimizer(
        SpladeEncoder(mlm), OptimConfig(lr=1e-3, warmup_ratio=0.0), 4
    )
    assert len(optimizer.param_groups) == 1 and scheduler.get_last_lr() == pytest.approx([1e-3])


@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_the_loss_scale_reaches_the_loops_infonce(scale: float) -> None:
    """``loss.scale`` multiplies the dot products of the InfoNCE the loop optimises (it once stopped
    at the config)."""
    from sembridge_ray.sparse.loop import PairBatch

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 6)

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, *features):
            return [torch.log1p(torch.relu(self.lin(f["x"]))) for f in features]

    g = torch.Generator().manual_seed(1)
    batch = PairBatch(
        {"x": torch.randn(3, 4, generator=g)}, [{"x": torch.randn(3, 4, generator=g)}]
    )
    toy = Toy()
    with torch.no_grad():
        q, d = toy(batch.query, batch.docs[0])
        expected = torch.nn.functional.cross_entropy(scale * q @ d.T, torch.arange(3))
    optimizer, scheduler = build_optimizer(toy, OptimConfig(), 1)
    plan = LoopPlan(total_steps=1, global_batch=3, loss=LossConfig(scale=scale), log_every=1)
    (_, metrics), *_ = train(toy, [batch], optimizer, scheduler, plan)
    assert metrics is not None and metrics["infonce"] == pytest.approx(float(expected), rel=1e-6)
