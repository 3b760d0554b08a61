"""bridge_weights against full-row float64 entmax (the entmax package as oracle) on adversarial
inputs."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax_bisect, sparsemax

import sembridge_ray
from sembridge_ray.embed_init import weighting

TOL = 5e-4


@pytest.fixture(
    autouse=True, params=[torch.float32, torch.bfloat16], ids=["screen-fp32", "screen-bf16"]
)
def screen(request: pytest.FixtureRequest) -> torch.dtype:
    """Every test runs with both candidate-screening GEMMs (passed as ``screen=``): exactness must
    not depend on which one is used."""
    dtype: torch.dtype = request.param
    return dtype


def oracle(
    new: torch.Tensor, src: torch.Tensor, alpha: float, temperature: float = 1.0
) -> torch.Tensor:
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    if alpha == 2:
        return sparsemax(cos / temperature, dim=1)
    return entmax_bisect(cos / temperature, alpha=alpha, dim=1, n_iter=100)


def check(w: torch.Tensor, expected: torch.Tensor) -> None:
    assert w.layout == torch.sparse_csr and w.dtype == torch.float32
    dense = w.to_dense().double()
    assert bool((dense >= 0).all())
    torch.testing.assert_close(
        dense.sum(1), torch.ones(len(dense), dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert (dense - expected).abs().max().item() < TOL


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, 3.0, 4.0, 8.0])
@pytest.mark.parametrize(("n", "m", "d"), [(1, 1, 3), (7, 17, 5), (33, 300, 16), (5, 2000, 2)])
def test_matches_full_row_float64_entmax(
    alpha: float, n: int, m: int, d: int, screen: torch.dtype
) -> None:
    new, src = randn(n, d, seed=n), randn(m, d, seed=m)
    check(sembridge_ray.bridge_weights(new, src, alpha, screen=screen), oracle(new, src, alpha))


@pytest.mark.parametrize("alpha", [2.0, 4.0])
def test_ties_that_exceed_k(alpha: float, screen: torch.dtype) -> None:
    """40 exact copies of the nearest source vector: the support (all 40) is wider than the first
    k=16."""
    src = randn(500, 8, seed=1)
    src[100:140] = src[7]
    new = torch.stack([src[7] + 1e-3 * randn(8, seed=2), randn(8, seed=3)])
    w = sembridge_ray.bridge_weights(new, src, alpha, screen=screen)
    check(w, oracle(new, src, alpha))
    assert int((w.to_dense()[0] > 0).sum()) >= 41


def test_uniform_row_spreads_over_every_source_token(screen: torch.dtype) -> None:
    src = randn(100, 4)
    # zero vector: every cosine is 0
    w = sembridge_ray.bridge_weights(torch.zeros(1, 4), src, 4.0, screen=screen)
    torch.testing.assert_close(w.to_dense(), torch.full((1, 100), 0.01))


def test_near_tied_wide_support_in_low_dimension(screen: torch.dtype) -> None:
    src = torch.nn.functional.normalize(randn(3000, 2, seed=5), dim=1)  # many near-equal cosines
    new = randn(20, 2, seed=6)
    for alpha in (1.5, 4.0):
        check(sembridge_ray.bridge_weights(new, src, alpha, screen=screen), oracle(new, src, alpha))


def test_wide_supports_leave_the_gather_for_the_dense_product_and_stay_exact(
    screen: torch.dtype,
) -> None:
    """A near-uniform space (as ``relative`` makes of a cross-lingual vocabulary): supports near 90
    wide, so the rounds go from gathered candidates (k=8) to the dense float64 product (k=32, 128 >=
    M/128) and still equal the oracle; and both ways of computing the cosines agree with it on the
    same candidates."""
    base = randn(1, 32, seed=12)
    src, new = base + 0.003 * randn(4096, 32, seed=13), base + 0.003 * randn(6, 32, seed=14)
    w = sembridge_ray.bridge_weights(new, src, 4.0, screen=screen)
    expected = oracle(new, src, 4.0)
    assert (w.to_dense().double() - expected).abs().max().item() < 1e-6
    assert int((w.to_dense() > 0).sum(1).min()) > 32
    rows = weighting.PreparedRows.of(src, "src", torch.device("cpu"), screen)
    unit = torch.nn.functional.normalize(new.double(), dim=1)
    full = unit @ torch.nn.functional.normalize(src.double(), dim=1).T
    for k in (8, 512):  # below and above the switch
        idx = torch.randint(0, 4096, (6, k), generator=torch.Generator().manual_seed(k))
        torch.testing.assert_close(rows.cosines(unit, idx), full.gather(1, idx), atol=1e-12, rtol=0)


def test_alpha_2_equals_sparsemax_and_temperature_divides(screen: torch.dtype) -> None:
    new, src = randn(50, 16, seed=8), randn(400, 16, seed=9)
    check(sembridge_ray.bridge_weights(new, src, 2.0, screen=screen), oracle(new, src, 2.0))
    check(
        sembridge_ray.bridge_weights(new, src, 4.0, temperature=0.5, screen=screen),
        oracle(new, src, 4.0, 0.5),
    )


def test_softmax_over_top_k_with_temperature(screen: torch.dtype) -> None:
    new, src = randn(10, 16, seed=10), randn(300, 16, seed=11)
    w = (
        sembridge_ray.bridge_weights(new, src, 1.0, temperature=0.1, top_k=10, screen=screen)
        .to_dense()
        .double()
    )
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    top = cos.topk(10, dim=1)
    expected = torch.zeros_like(cos).scatter(1, top.indices, torch.softmax(top.values / 0.1, dim=1))
    assert (w - expected).abs().max().item() < 1e-6


def test_full_softmax_is_dense(screen: torch.dtype) -> None:
    new, src = randn(3, 4), randn(20, 4, seed=1)
    w = sembridge_ray.bridge_weights(new, src, 1.0, screen=screen)
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    torch.testing.assert_close(w.to_dense().double(), torch.softmax(cos, dim=1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_raises(bad: float, screen: torch.dtype) -> None:
    new = randn(3, 4)
    new[1, 2] = bad
    with pytest.raises(ValueError, match="non-finite"):
        sembridge_ray.bridge_weights(new, randn(10, 4), screen=screen)
    with pytest.raises(ValueError, match="non-finite"):
        sembridge_ray.bridge_weights(randn(3, 4), new, screen=screen)


def test_chunking_does_not_change_the_result(
    monkeypatch: pytest.MonkeyPatch, screen: torch.dtype
) -> None:
    new, src = randn(100, 8, seed=12), randn(1000, 8, seed=13)
    whole = sembridge_ray.bridge_weights(new, src, 4.0, screen=screen).to_dense()
    monkeypatch.setattr(weighting, "_CHUNK_BYTES", 7 * 4 * 1000)  # 7 rows per chunk
    assert torch.equal(sembridge_ray.bridge_weights(new, src, 4.0, screen=screen).to_dense(), whole)


def test_only_failing_rows_are_recomputed(
    monkeypatch: pytest.MonkeyPatch, screen: torch.dtype
) -> None:
    src = randn(400, 8, seed=14)
    src[200:240] = src[3]  # row 0 needs more than the first round's candidates; the others do not
    new = torch.cat([src[3:4] + 1e-4, randn(30, 8, seed=15)])
    calls: list[int] = []
    real = weighting._entmax_round

    def spy(new: object, rows: torch.Tensor, *args: object) -> object:
        calls.append(len(rows))
        return real(new, rows, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(weighting, "_entmax_round", spy)
    check(sembridge_ray.bridge_weights(new, src, 4.0, screen=screen), oracle(new, src, 4.0))
    assert calls[0] == 31 and all(c < 31 for c in calls[1:]) and len(calls) > 1


@pytest.mark.parametrize("m", [8 * weighting.GROUP + 5, 1000, 30 * weighting.GROUP])
@pytest.mark.parametrize("k", [1, 8, 32])
def test_top_candidates_is_a_top_k_set(m: int, k: int) -> None:
    """The same k values as torch.topk (the oracle) per row, with heavy ties and the short last
    group."""
    scores = torch.cat(
        [torch.randn(20, m, generator=torch.Generator().manual_seed(m + k)), torch.zeros(3, m)]
    )
    scores[5:10] = scores[5:10].round()  # many ties
    scores[10, -1] = 100.0  # the maximum in the short last group (if any)
    got = weighting.top_candidates(scores, k)
    assert got.shape == (23, k)
    assert all(len(set(row.tolist())) == k for row in got)  # k distinct columns
    expected = scores.topk(k, dim=1).values
    assert torch.equal(scores.gather(1, got).sort(dim=1, descending=True).values, expected)


@pytest.mark.parametrize("alpha", [1.5, 2.0, 4.0])
def test_offsets_are_added_to_the_cosines(alpha: float, screen: torch.dtype) -> None:
    """A column prior (position-aware bridging) against the oracle on cos + offsets, a penalty near
    the support radius included; with both screening GEMMs (the autouse fixture)."""
    new, src = randn(40, 8, seed=16), randn(600, 8, seed=17)
    offsets = -0.34 * (torch.arange(600) % 3 == 0).double()
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    expected = (
        sparsemax(cos + offsets, dim=1)
        if alpha == 2
        else entmax_bisect(cos + offsets, alpha=alpha, dim=1, n_iter=100)
    )
    check(sembridge_ray.bridge_weights(new, src, alpha, offsets=offsets, screen=screen), expected)
    with pytest.raises(ValueError, match="offsets"):
        sembridge_ray.bridge_weights(new, src, alpha, offsets=offsets[:5], screen=screen)


def test_a_prepared_source_gives_the_same_weights(screen: torch.dtype) -> None:
    """The source side prepared once (reused across calls, as the position classes do) changes no
    weight."""
    new, src = randn(30, 8, seed=18), randn(500, 8, seed=19)
    prepared = weighting.PreparedRows.of(src, "source_vecs", torch.device("cpu"), screen)
    for alpha in (1.0, 4.0):
        expected = sembridge_ray.bridge_weights(new, src, alpha, screen=screen).to_dense()
        assert torch.equal(weighting.bridge_weights(new, prepared, alpha).to_dense(), expected)
    other = torch.bfloat16 if screen == torch.float32 else torch.float32
    with pytest.raises(ValueError, match="prepared"):
        weighting.bridge_weights(new, prepared, 4.0, screen=other)
