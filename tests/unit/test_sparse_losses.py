"""InfoNCE, FLOPs and the whole objective against sentence-transformers (values and gradients); the
schedules."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sembridge_ray.sparse.loop import lr_factor
from sembridge_ray.sparse.losses import LossWeights, infonce, splade_objective
from sembridge_ray.sparse.regularizers import active_dims, anti_collapse, flops, quadratic_warmup


@pytest.fixture(scope="module")
def st_model(fixtures_root):
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(fixtures_root / "bert-mlm"), device="cpu")
    for module in model.modules():  # deterministic forward passes for gradient comparisons
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.double()  # float64, so comparisons test the algebra rather than summation order


def _reps(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_(True)


@pytest.mark.parametrize("negatives", [0, 2])
def test_infonce_equals_sparse_mnrl_in_values_and_gradients(st_model, negatives: int) -> None:
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss

    embeddings = [_reps(6, 40, seed=i) for i in range(2 + negatives)]
    mnrl = SparseMultipleNegativesRankingLoss(st_model)
    theirs = mnrl.compute_loss_from_embeddings(embeddings, None)  # type: ignore[arg-type]
    grads_theirs = torch.autograd.grad(theirs, embeddings)
    ours = infonce(embeddings[0], embeddings[1:])
    grads_ours = torch.autograd.grad(ours, embeddings)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_infonce_with_an_offset_is_the_global_loss_of_those_rows() -> None:
    q, d = _reps(8, 30, seed=1), _reps(8, 30, seed=2)
    full = torch.nn.functional.cross_entropy(q @ d.T, torch.arange(8), reduction="none")
    torch.testing.assert_close(infonce(q[4:], [d], offset=4), full[4:].mean())


def test_flops_equals_flops_loss_in_values_and_gradients(st_model) -> None:
    from sentence_transformers.sparse_encoder.losses import FlopsLoss

    reps = _reps(7, 25, seed=3)
    theirs = FlopsLoss(st_model).compute_loss_from_embeddings(reps)
    ours = flops(reps)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(
        torch.autograd.grad(ours, reps)[0], torch.autograd.grad(theirs, reps)[0]
    )
    by_hand = sum(float(reps[:, v].mean().detach()) ** 2 for v in range(25))
    assert float(ours.detach()) == pytest.approx(by_hand)


@pytest.mark.parametrize(
    ("scale", "ranking", "directions"),
    [
        (1.0, "infonce", ("query_to_doc",)),
        (20.0, "infonce", ("query_to_doc",)),
        (1.0, "infonce_symmetric", ("query_to_doc", "doc_to_query")),
    ],
)
def test_objective_equals_splade_loss_on_a_real_encoder(
    st_model, scale: float, ranking: str, directions: tuple[Any, ...]
) -> None:
    """The whole chain: chunked SpladeEncoder + splade_objective vs SparseEncoder +
    SpladeLoss(SparseMNRL), at InfoNCE's scale 1 (SPLADE) and another (``loss.scale``,
    sentence-transformers' ``scale``), and for each ranking loss of the registry (``loss.ranking``:
    sentence-transformers' ``directions``)."""
    from sentence_transformers.sparse_encoder.losses import (
        SparseMultipleNegativesRankingLoss,
        SpladeLoss,
    )

    from sembridge_ray.sparse.model import SpladeEncoder

    queries = [
        "a man is playing a guitar",
        "a dog runs in the grass",
        "two kids sit on a bench",
        "a woman cooks",
    ]
    docs = [
        "someone plays guitar",
        "the dog is running outside",
        "children are sitting",
        "a lady is cooking food",
    ]
    negs = ["a cat sleeps", "nobody is here", "the car is red", "a bird flies away"]
    features = [st_model.preprocess(t) for t in (queries, docs, negs)]
    st_model.train()
    params = [p for p in st_model.parameters() if p.requires_grad]
    splade = SpladeLoss(
        st_model,
        SparseMultipleNegativesRankingLoss(st_model, scale=scale, directions=directions),
        document_regularizer_weight=3e-2,
        query_regularizer_weight=5e-2,
    )
    theirs = splade(features, None)
    total_theirs = sum(theirs.values())
    grads_theirs = torch.autograd.grad(total_theirs, params)

    encoder = SpladeEncoder(st_model[0].auto_model, chunk=3).train()
    assert encoder._split  # the sparse-gradient pooling, not the recomputing fallback
    reps = encoder(*features)
    ours = splade_objective(
        reps[0], reps[1:], LossWeights(lambda_q=5e-2, lambda_d=3e-2, scale=scale, ranking=ranking)
    )
    grads_ours = torch.autograd.grad(ours["loss"], params)
    torch.testing.assert_close(ours["loss"], total_theirs, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours[ranking], theirs["base_loss"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        3e-2 * ours["flops_d"], theirs["document_regularizer_loss"], rtol=1e-10, atol=1e-14
    )
    torch.testing.assert_close(
        5e-2 * ours["flops_q"], theirs["query_regularizer_loss"], rtol=1e-10, atol=1e-14
    )
    worst = max(float((a - b).abs().max()) for a, b in zip(grads_ours, grads_theirs, strict=True))
    assert worst <= 1e-10
    assert float(ours["active_dims_q"]) == pytest.approx(float(active_dims(reps[0])))


def test_anti_collapse_is_off_by_default_and_penalises_empty_vectors() -> None:
    q, d = _reps(4, 20, seed=5), _reps(4, 20, seed=6)
    parts = splade_objective(q, [d], LossWeights(lambda_q=1e-3, lambda_d=1e-3))
    assert "anti_collapse" not in parts
    with_term = splade_objective(
        q, [d], LossWeights(lambda_q=1e-3, lambda_d=1e-3, anti_collapse=0.5)
    )
    expected = 1 / float(q.sum(1).mean()) ** 2 + 1 / float(d.sum(1).mean()) ** 2
    assert float(with_term["anti_collapse"]) == pytest.approx(expected, rel=1e-5)
    torch.testing.assert_close(with_term["loss"], parts["loss"] + 0.5 * with_term["anti_collapse"])
    assert float(anti_collapse(q * 1e-3, d)) > 1e4 * float(anti_collapse(q, d)) / 2


def test_flops_weights_warm_up_quadratically_over_the_first_third() -> None:
    total = 300
    assert quadratic_warmup(0, total) == 0.0
    assert quadratic_warmup(50, total) == pytest.approx(0.25)
    assert quadratic_warmup(100, total) == pytest.approx(1.0)
    assert quadratic_warmup(101, total) == 1.0 and quadratic_warmup(300, total) == 1.0
    values = [quadratic_warmup(s, total) for s in range(1, total + 1)]
    assert values == sorted(values)
    assert quadratic_warmup(5, total, fraction=0) == 1.0


def test_learning_rate_warms_up_linearly_over_ten_percent_then_decays() -> None:
    total = 100
    factors = [lr_factor(s, total, 0.1) for s in range(1, total + 1)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[:10] == sorted(factors[:10]) and factors[10:] == sorted(
        factors[10:], reverse=True
    )
    assert 0 < factors[-1] < 0.05
    assert lr_factor(1, total, 0.0) == 1.0


def test_every_ranking_loss_has_a_name_and_a_label() -> None:
    from typing import get_args

    from sembridge_ray.sparse.config import RANKING_LABELS, RankingName
    from sembridge_ray.sparse.losses import RANKING_LOSSES

    assert set(RANKING_LOSSES) == set(get_args(RankingName)) == set(RANKING_LABELS)


class _Shard:
    """Worker ``rank`` of ``world`` whose gather returns the global batch (precomputed): values
    only."""

    def __init__(self, rank: int, world: int, full: dict[int, torch.Tensor]) -> None:
        self.rank, self.world, self.full = rank, world, full

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.full[id(tensor)]

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def test_the_symmetric_loss_split_over_two_workers_averages_to_the_global_one() -> None:
    """Each worker scores its own queries (and their positives) against the gathered batch: the mean
    of the workers' shares is the one-process loss on the global batch."""
    q, d, n = _reps(6, 30, seed=1), _reps(6, 30, seed=2), _reps(6, 30, seed=3)
    weights = LossWeights(lambda_q=0.0, lambda_d=0.0, ranking="infonce_symmetric")
    whole = splade_objective(q, [d, n], weights)["infonce_symmetric"]
    shares = []
    for rank in range(2):
        local = [t[3 * rank : 3 * rank + 3] for t in (q, d, n)]
        full = {id(part): whole_t for part, whole_t in zip(local, (q, d, n), strict=True)}
        shares.append(
            splade_objective(local[0], local[1:], weights, _Shard(rank, 2, full))[
                "infonce_symmetric"
            ]
        )
    torch.testing.assert_close((shares[0] + shares[1]) / 2, whole, rtol=1e-6, atol=1e-7)
