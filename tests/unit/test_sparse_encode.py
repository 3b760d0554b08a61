from __future__ import annotations

import numpy as np
import pytest
import torch

from sembridge_ray.sparse.encode import sparse_rows, sparse_table, table_rows


def test_rows_round_trip_through_arrow() -> None:
    dense = torch.tensor([[0.0, 1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]])
    idx, val = sparse_rows(dense.to_sparse())
    table = sparse_table(["a", "b", "c"], idx, val)
    assert str(table.schema.field("indices").type) == "list<item: int32>"
    ids, idx2, val2 = table_rows(table)
    assert ids == ["a", "b", "c"]
    rebuilt = np.zeros((3, 4), dtype=np.float32)
    for r, (i, v) in enumerate(zip(idx2, val2, strict=True)):
        rebuilt[r, i] = v
    np.testing.assert_array_equal(rebuilt, dense.numpy())


def test_max_active_dims_keeps_largest_and_breaks_ties_by_lower_index() -> None:
    idx, val = sparse_rows(torch.tensor([[1.0, 2.0, 2.0, 0.5, 2.0]]), max_active_dims=2)
    assert idx[0].tolist() == [1, 2] and val[0].tolist() == [2.0, 2.0]


TEXTS = [
    "a man is playing a guitar on a stage in front of a large crowd of people",
    "the dog runs",
    "two kids are sitting on a bench in the park and eating ice cream together",
    "a woman cooks",
    "nobody",
    "a cat sleeps on the warm windowsill",
    "someone is slicing an onion",
]


@pytest.fixture(scope="module")
def st64(fixtures_root):
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(fixtures_root / "bert-mlm"), device="cpu").double().eval()


def _one_by_one(model, texts):
    """The oracle: each text alone (no padding, no sorting) through the full MLM and plain
    pooling."""
    from sembridge_ray.sparse.pooling import splade_pool

    rows = []
    with torch.no_grad():
        for text in texts:
            features = model.preprocess([text])
            inputs = {
                k: v
                for k, v in features.items()
                if k in ("input_ids", "attention_mask", "token_type_ids")
            }
            rows.append(
                splade_pool(model[0].auto_model(**inputs).logits, features["attention_mask"])[0]
            )
    return torch.stack(rows)


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_length_sorted_encoding_returns_input_order_equal_to_one_text_at_a_time(
    st64, batch_size: int
) -> None:
    from sembridge_ray.sparse.encode import encode_texts, fast_parts

    assert fast_parts(st64, "document") is not None
    expected = _one_by_one(st64, TEXTS)
    idx, val = encode_texts(st64, TEXTS, batch_size, role="document")
    for row, (i, v) in enumerate(zip(idx, val, strict=True)):
        nz = torch.nonzero(expected[row] > 0).squeeze(1)
        assert i.tolist() == nz.tolist(), f"row {row}: active set differs"
        np.testing.assert_allclose(v, expected[row, nz].float().numpy(), rtol=1e-6, atol=0)
    # batch order does not leak into values: shuffled input gives the same rows, permuted
    perm = [3, 0, 6, 2, 5, 1, 4]
    idx2, val2 = encode_texts(st64, [TEXTS[p] for p in perm], batch_size, role="document")
    for k, p in enumerate(perm):
        assert idx2[k].tolist() == idx[p].tolist()
        np.testing.assert_allclose(val2[k], val[p], rtol=1e-6, atol=0)


def test_encoding_equals_sentence_transformers_encode_document_with_max_active_dims(
    fixtures_root,
) -> None:
    from sentence_transformers import SparseEncoder

    from sembridge_ray.sparse.encode import encode_texts

    model = SparseEncoder(str(fixtures_root / "bert-mlm"), device="cpu").eval()
    theirs = sparse_rows(
        model.encode_document(TEXTS, batch_size=4, convert_to_tensor=True), max_active_dims=5
    )
    ours = encode_texts(model, TEXTS, 4, role="document", max_active_dims=5)
    for a, b in zip(ours[0], theirs[0], strict=True):
        assert a.tolist() == b.tolist()
    for a, b in zip(ours[1], theirs[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_model_with_a_document_prompt_takes_sentence_transformers_own_path(fixtures_root) -> None:
    from sentence_transformers import SparseEncoder

    from sembridge_ray.sparse.encode import encode_texts, fast_parts

    model = SparseEncoder(
        str(fixtures_root / "bert-mlm"), device="cpu", prompts={"document": "passage: "}
    ).eval()
    assert fast_parts(model, "document") is None and fast_parts(model, "query") is not None
    theirs = sparse_rows(model.encode_document(TEXTS[:3], convert_to_tensor=True))
    ours = encode_texts(model, TEXTS[:3], 2, role="document")
    assert [a.tolist() for a in ours[0]] == [b.tolist() for b in theirs[0]]
