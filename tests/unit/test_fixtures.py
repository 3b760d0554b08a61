from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from sembridge_ray.sparse.model import load_sparse_encoder
from sembridge_ray.testing import (
    FIXTURES,
    byte_bpe_tokenizer,
    target_text,
    tiny_bert_mlm,
    unigram_tokenizer,
)

TOKENIZERS = {
    "tok-wordpiece": "##",
    "tok-bytebpe": "Ġ",
    "tok-unigram": "▁",
    "bert-mlm": "##",
    "roberta-mlm": "Ġ",
}


def test_every_fixture_is_written(fixtures_root: Path) -> None:
    assert {p.name for p in fixtures_root.iterdir()} == set(FIXTURES)


@pytest.mark.parametrize(("name", "marker"), TOKENIZERS.items())
def test_tokenizer_families_have_their_markers(fixtures_root: Path, name: str, marker: str) -> None:
    tok = AutoTokenizer.from_pretrained(fixtures_root / name)
    vocab = tok.get_vocab()
    assert sum(marker in t for t in vocab) > 100
    assert (
        tok.pad_token_id is not None
        and tok.mask_token_id is not None
        and tok.cls_token_id is not None
    )


@pytest.mark.parametrize("name", ["bert-mlm", "roberta-mlm"])
def test_source_models_load_as_mlm_and_sparse_encoder(fixtures_root: Path, name: str) -> None:
    mlm = AutoModelForMaskedLM.from_pretrained(fixtures_root / name)
    tok = AutoTokenizer.from_pretrained(fixtures_root / name)
    emb = mlm.get_input_embeddings().weight
    assert emb.shape[0] == mlm.config.vocab_size == len(tok)
    assert mlm.get_output_embeddings().weight.data_ptr() == emb.data_ptr()  # tied
    encoder = load_sparse_encoder(str(fixtures_root / name))
    vec = encoder.encode(["A man is playing a guitar"], convert_to_tensor=True).to_dense()
    assert vec.shape == (1, len(tok)) and bool((vec >= 0).all()) and int((vec > 0).sum()) > 0


def test_bridge_is_a_sentence_transformer(fixtures_root: Path) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(fixtures_root / "bridge"), device="cpu")
    vecs = model.encode(["##ing", "Ġthe", "▁Haus"], convert_to_tensor=True)
    assert vecs.shape == (3, 32) and torch.isfinite(vecs).all()


def test_builders_are_deterministic() -> None:
    text = target_text()[:2000]
    assert byte_bpe_tokenizer(text, 600).get_vocab() == byte_bpe_tokenizer(text, 600).get_vocab()
    uni_a, uni_b = unigram_tokenizer(text, 600), unigram_tokenizer(text, 600)
    assert uni_a.get_vocab() == uni_b.get_vocab()
    a, b = tiny_bert_mlm(uni_a, seed=3), tiny_bert_mlm(uni_b, seed=3)
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_seeded_builders_leave_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_bert_mlm(unigram_tokenizer(target_text()[:500], 300), seed=9)
    assert torch.equal(torch.rand(3), expected)
