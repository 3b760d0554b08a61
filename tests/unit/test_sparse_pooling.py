"""The sparse-gradient and chunked SPLADE poolings equal the plain reference (values and gradients,
float64) and sentence-transformers' vectors."""

from __future__ import annotations

import copy

import pytest
import torch

from sembridge_ray.sparse.pooling import (
    slice_tokens,
    splade_max_pool,
    splade_pool,
    splade_pool_chunked,
)


def _inputs(seed: int, batch: int = 3, seq: int = 10, hidden: int = 8, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, 6:] = 0  # padded rows of different lengths
    mask[2, 2:] = 0
    head = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, vocab)
    )
    torch.manual_seed(seed)
    head = head.double()
    return h, mask, head


@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 0])
def test_chunked_pooling_equals_plain_pooling_in_values_and_gradients(chunk: int) -> None:
    h, mask, head = _inputs(seed=chunk)
    ref_head = copy.deepcopy(head)
    h_ref = h.detach().clone().requires_grad_(True)
    reference = splade_pool(ref_head(h_ref), mask)
    pooled = splade_pool_chunked(h, mask, head, chunk)
    torch.testing.assert_close(pooled, reference, rtol=0, atol=1e-12)
    weights = torch.rand(
        reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    (reference * weights).sum().backward()
    (pooled * weights).sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=0, atol=1e-10)
    for p, q in zip(head.parameters(), ref_head.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-10)


def _projection(seed: int, batch: int = 4, seq: int = 9, hidden: int = 6, vocab: int = 40):
    """Features with masked rows, a repeated token (tied logits at two positions) and a bias pushing
    about half of the logits below 0 (relu's dead zone)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64)
    feats[1, 5] = feats[1, 2]  # ties: every term of example 1 has equal logits at tokens 2 and 5
    feats[3, 7] = feats[3, 0]
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, 4:] = 0
    mask[2, 1:] = 0
    feats[0, 6] = 50.0  # a padded token with huge logits must neither win nor receive gradient
    weight = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
    bias = torch.randn(vocab, generator=g, dtype=torch.float64) - 0.5
    return feats, weight, bias, mask


def _grads(fn, tensors, upstream):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    return out, torch.autograd.grad((out * upstream).sum(), leaves)


@pytest.mark.parametrize("chunk", [0, 1, 2, 4, 9, 100])
def test_sparse_gradient_pooling_equals_plain_autograd_pooling_in_float64(chunk: int) -> None:
    feats, weight, bias, mask = _projection(seed=chunk)
    upstream = torch.rand(
        feats.shape[0],
        weight.shape[0],
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(3),
    )

    def plain(f, w, b):
        return splade_pool(torch.nn.functional.linear(f, w, b), mask)

    def sparse(f, w, b):
        return splade_max_pool(f, w, b, mask, chunk)

    expected, expected_grads = _grads(plain, (feats, weight, bias), upstream)
    got, got_grads = _grads(sparse, (feats, weight, bias), upstream)
    assert 0 < int((expected > 0).sum()) < expected.numel()  # both live and dead terms
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    for a, b in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    # the tie went to the first of the two equal tokens, in both: the second got no gradient
    assert (
        float(got_grads[0][1, 5].abs().max()) == 0.0 and float(got_grads[0][1, 2].abs().max()) > 0
    )
    assert (
        float(got_grads[0][0, 4:].abs().max()) == 0.0
        and float(got_grads[0][2, 1:].abs().max()) == 0.0
    )


def test_sparse_gradient_pooling_without_bias() -> None:
    feats, weight, _, mask = _projection(seed=11)
    upstream = torch.ones(feats.shape[0], weight.shape[0], dtype=torch.float64)
    expected, grads_e = _grads(lambda f, w: splade_pool(f @ w.T, mask), (feats, weight), upstream)
    got, grads_g = _grads(
        lambda f, w: splade_max_pool(f, w, None, mask, 3), (feats, weight), upstream
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    for a, b in zip(grads_g, grads_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_slices_follow_the_memory_budget() -> None:
    assert slice_tokens(32, 64, 30_522, 4) == 64  # 250 MB of query logits: one slice
    assert slice_tokens(32, 256, 30_522, 4) == 68  # 1 GB of document logits: 4 slices
    assert slice_tokens(32, 256, 30_522, 4, budget=1) == 1


@pytest.mark.parametrize("fixture", ["bert-mlm", "roberta-mlm"])
def test_splade_encoder_splits_known_heads_and_matches_the_full_head(
    fixtures_root, fixture: str
) -> None:
    from transformers import AutoModelForMaskedLM

    from sembridge_ray.sparse.model import SpladeEncoder

    mlm = AutoModelForMaskedLM.from_pretrained(str(fixtures_root / fixture)).double().train()
    for module in mlm.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    encoder = SpladeEncoder(mlm, chunk=0)
    assert encoder._split, "the head's projection should run in splade_max_pool"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, mlm.config.vocab_size, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    features = {"input_ids": ids, "attention_mask": mask}
    params = [p for p in mlm.parameters() if p.requires_grad]
    upstream = torch.rand(3, mlm.config.vocab_size, generator=g, dtype=torch.float64)
    ours = encoder(features)[0]
    grads_ours = torch.autograd.grad((ours * upstream).sum(), params)
    plain = splade_pool(mlm(**features).logits, mask)
    grads_plain = torch.autograd.grad((plain * upstream).sum(), params)
    torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_ours, grads_plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_pooling_is_max_of_log1p_relu_over_unpadded_tokens() -> None:
    logits = torch.tensor([[[1.0, -2.0], [3.0, 0.5], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    expected = torch.log1p(torch.tensor([[3.0, 0.5]]))
    torch.testing.assert_close(splade_pool(logits, mask), expected)


def test_fp32_chunked_gradients_match_to_1e5() -> None:
    h, mask, head = _inputs(seed=7, batch=4, seq=33, hidden=16, vocab=300)
    h, head = h.detach().float().requires_grad_(True), head.float()
    ref_head = copy.deepcopy(head)
    h_ref = h.detach().clone().requires_grad_(True)
    splade_pool(ref_head(h_ref), mask).sum().backward()
    splade_pool_chunked(h, mask, head, 8).sum().backward()
    assert (h.grad - h_ref.grad).abs().max() <= 1e-5
    for p, q in zip(head.parameters(), ref_head.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max() <= 1e-5


def test_splade_encoder_vectors_equal_the_sparse_encoder(fixtures_root) -> None:
    from sentence_transformers import SparseEncoder

    from sembridge_ray.sparse.model import SpladeEncoder

    model = SparseEncoder(str(fixtures_root / "bert-mlm"), device="cpu")
    texts = [
        "a man is playing a guitar",
        "the dog runs",
        "two kids are sitting on a bench in the park",
    ]
    expected = model.encode(texts, convert_to_tensor=True).to_dense()
    encoder = SpladeEncoder(model[0].auto_model, chunk=3).eval()  # type: ignore[arg-type]
    features = model.preprocess(texts)
    with torch.no_grad():
        (got,) = encoder(features)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
