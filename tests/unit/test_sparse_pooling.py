"""Chunked SPLADE pooling equals the plain reference (values and gradients) and sentence-transformers' vectors."""

from __future__ import annotations

import copy

import pytest
import torch

from sembridge_ray.sparse.pooling import splade_pool, splade_pool_chunked


def _inputs(seed: int, batch: int = 3, seq: int = 10, hidden: int = 8, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, seq, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, 6:] = 0  # padded rows of different lengths
    mask[2, 2:] = 0
    head = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, vocab))
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
    weights = torch.rand(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (reference * weights).sum().backward()
    (pooled * weights).sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=0, atol=1e-10)
    for p, q in zip(head.parameters(), ref_head.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-10)


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
    texts = ["a man is playing a guitar", "the dog runs", "two kids are sitting on a bench in the park"]
    expected = model.encode(texts, convert_to_tensor=True).to_dense()
    encoder = SpladeEncoder(model[0].auto_model, chunk=3).eval()
    features = model.preprocess(texts)
    with torch.no_grad():
        (got,) = encoder(features)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
