"""SemBridge+'s options (``embed_init.plus``): the bridge-space transforms against numpy, the FVT decomposition
against hand-made cases and BERT's own WordPiece, the blend against dense arithmetic, the ``fvt`` method and the
``sembridge_plus`` recipe through the whole init."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from sembridge_ray.config import ConfigError
from sembridge_ray.distributed.init_job import initialise
from sembridge_ray.embed_init import plus
from sembridge_ray.embed_init.methods import SEMBRIDGE_PLUS
from sembridge_ray.embed_init.vocab import VocabIndex, canonical, tokenizer_family
from sembridge_ray.jobs.init import InitConfig
from tests.unit.test_position import NGRAM_STAGES


@pytest.fixture(scope="module")
def vectors() -> torch.Tensor:
    rng = np.random.default_rng(3)
    base = rng.standard_normal((400, 12)) @ np.diag(np.linspace(5, 0.2, 12)) + 3.0  # anisotropic, off-centre
    return torch.from_numpy(base)


def test_centre_and_abtt_match_numpy(vectors: torch.Tensor) -> None:
    x = vectors.numpy()
    centred = x - x.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)  # rows: principal directions, by variance
    for k in (1, 3):
        top = vt[:k].T
        expected = centred - centred @ top @ top.T
        got = plus.apply_transform(vectors, plus.space_transform(vectors, "abtt", k)).double().numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)
    got = plus.apply_transform(vectors, plus.space_transform(vectors, "center", 3)).double().numpy()
    np.testing.assert_allclose(got, centred, atol=1e-5)
    assert plus.space_transform(vectors, "raw", 3) is None


def test_whitening_gives_the_identity_covariance(vectors: torch.Tensor) -> None:
    white = plus.apply_transform(vectors, plus.space_transform(vectors, "whiten", 3)).double().numpy()
    np.testing.assert_allclose(np.cov(white, rowvar=False, bias=True), np.eye(12), atol=1e-4)
    np.testing.assert_allclose(white.mean(0), 0, atol=1e-5)


def test_relative_space_gives_the_cosines_of_the_anchor_cosine_vectors(vectors: torch.Tensor) -> None:
    x = vectors.numpy()
    anchors = x[::7][:40]  # more anchors (40) than dimensions (12), as on a real vocabulary
    unit = anchors / np.linalg.norm(anchors, axis=1, keepdims=True)
    rel = x @ unit.T  # TokAlign's representation: a token's cosines to the anchors (up to its own norm)
    rel /= np.linalg.norm(rel, axis=1, keepdims=True)
    fitted = plus.space_transform(vectors, "relative", 3, anchors=torch.from_numpy(anchors))
    got = plus.apply_transform(vectors, fitted).double().numpy()
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    assert got.shape == x.shape  # D columns, not K
    np.testing.assert_allclose(got @ got.T, rel @ rel.T, atol=1e-5)
    with pytest.raises(ValueError, match="no anchors"):
        plus.space_transform(vectors, "relative", 3, anchors=torch.from_numpy(anchors[:0]))


def test_decompose_by_greedy_longest_canonical_match() -> None:
    index = VocabIndex(exact={"▁play": 1, "ing": 2, "▁pl": 3, "ay": 4, "la": 5, "▁la": 6}, fuzzy={})
    folded = plus.folded_index(index)
    assert plus.decompose("▁playing", index, folded, 5) == [1, 2]  # word-initial first, then continuations
    assert plus.decompose("ing", index, folded, 5) == [2]  # a continuation stays a continuation
    assert plus.decompose("▁PLAYing", index, folded, 5) == [1, 2]  # lower case for an uncased source
    assert plus.decompose("▁lala", index, folded, 5) == [6, 5]
    assert plus.decompose("▁pl#ay", index, folded, 5) == [3, 4]  # an uncovered character is dropped
    assert plus.decompose("##", index, folded, 5) == []


def test_word_initial_decompositions_are_berts_own_wordpiece(shared_data: Path) -> None:
    """WordPiece is greedy longest-match-first too: for a lower-case ASCII word, the cut of its canonical form
    equals ``BertTokenizer.tokenize`` of the word."""
    bert = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "bert-base-uncased")
    roberta = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "roberta-base")
    words = {
        tid: tok[1:]
        for tok, tid in roberta.get_vocab().items()
        if tok.startswith("Ġ") and tok[1:].isascii() and tok[1:].isalpha() and tok[1:].islower()
    }
    ids = sorted(words)[::4]  # a spread of frequencies, rare words included
    weights = plus.fvt_weights(bert, roberta, ids, len(bert))
    crow, cols, vals = weights.crow_indices(), weights.col_indices(), weights.values()
    split = 0
    for row, tid in enumerate(ids):
        vocab = bert.get_vocab()
        pieces = [vocab[p] for p in bert.tokenize(words[tid])]
        counts = {p: pieces.count(p) / len(pieces) for p in pieces}
        got = dict(zip(cols[crow[row] : crow[row + 1]].tolist(), vals[crow[row] : crow[row + 1]].tolist(), strict=True))
        assert got == pytest.approx(counts), words[tid]
        split += len(pieces) > 1
    assert split > 100  # many words really are cut into several pieces


def test_a_continuation_piece_decomposes_into_continuations(shared_data: Path) -> None:
    bert = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "bert-base-uncased")
    roberta = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "roberta-base")
    ing = roberta.get_vocab()["ing"]
    assert canonical("ing", tokenizer_family(roberta)) == "ing"
    weights = plus.fvt_weights(bert, roberta, [ing], len(bert))
    assert weights.col_indices().tolist() == [bert.get_vocab()["##ing"]]


def _csr(dense: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dense).float().to_sparse_csr()


def test_least_squares_weights_solve_the_constrained_ridge_problem() -> None:
    rng = np.random.default_rng(11)
    source, new = rng.standard_normal((30, 8)), rng.standard_normal((4, 8))
    supports = [[2, 5, 9], [1], [0, 3, 4, 7, 29], [6, 8]]
    dense = np.zeros((4, 30))
    for r, cols in enumerate(supports):
        dense[r, cols] = rng.dirichlet(np.ones(len(cols)))
    csr = torch.from_numpy(dense).float().to_sparse_csr()
    unit = source / np.linalg.norm(source, axis=1, keepdims=True)
    for ridge in (0.05, 1.0):
        got = plus.least_squares(csr, torch.from_numpy(new), torch.from_numpy(source), ridge).to_dense().double()
        for r, cols in enumerate(supports):
            w0 = dense[r, cols].astype(np.float32).astype(np.float64)
            b = new[r] / np.linalg.norm(new[r])
            # KKT of min |A w - y|^2 s.t. 1'w = 1, with A = [B'; sqrt(ridge) I], y = [b; sqrt(ridge) w0]
            a = np.vstack([unit[cols].T, np.sqrt(ridge) * np.eye(len(cols))])
            y = np.concatenate([b, np.sqrt(ridge) * w0])
            k = len(cols)
            kkt = np.block([[2 * a.T @ a, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
            expected = np.linalg.solve(kkt, np.concatenate([2 * a.T @ y, [1.0]]))[:k]
            np.testing.assert_allclose(got[r, cols].numpy(), expected, atol=1e-5)
            assert float(got[r].sum()) == pytest.approx(1.0, abs=1e-5)
            assert int((got[r] != 0).sum()) <= k  # the support is kept
    huge = plus.least_squares(csr, torch.from_numpy(new), torch.from_numpy(source), 1e9).to_dense()
    np.testing.assert_allclose(huge.numpy(), dense, atol=1e-5)  # an infinite ridge is the released weights


def test_blend_and_select_rows_match_dense_arithmetic() -> None:
    rng = np.random.default_rng(0)
    bridge = rng.random((5, 7)) * (rng.random((5, 7)) < 0.4)
    bridge[:, 0] += 0.1
    bridge /= bridge.sum(1, keepdims=True)
    prior = rng.random((5, 7)) * (rng.random((5, 7)) < 0.5)
    prior[2] = 0  # no decomposition: keeps its bridge weights
    prior[prior.sum(1) > 0] /= prior[prior.sum(1) > 0].sum(1, keepdims=True)
    got = plus.blend(_csr(bridge), _csr(prior), 0.3).to_dense().double().numpy()
    expected = np.where(prior.sum(1, keepdims=True) > 0, 0.7 * bridge + 0.3 * prior, bridge)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got.sum(1), 1, atol=1e-6)
    rows = torch.tensor([4, 0, 2])
    np.testing.assert_array_equal(
        plus.select_rows(_csr(prior), rows).to_dense().numpy(), prior[[4, 0, 2]].astype(np.float32)
    )


def _init(root: Path, out: Path, **overrides: object) -> tuple[dict[str, torch.Tensor], object]:
    cfg = InitConfig(
        source_model=str(root / "bert-mlm"),
        target_tokenizer=str(root / "tok-bytebpe"),
        bridge_model=str(root / "bridge"),
        output=str(out),
        cache_dir=str(out.parent / "cache"),
        samples=3,
        copy_overlap=False,
        exclude_special_sources=True,
        **overrides,  # type: ignore[arg-type]
    )
    result = initialise(cfg, NGRAM_STAGES)
    return load_file(out / "model" / "model.safetensors"), result


def _embeddings(state: dict[str, torch.Tensor]) -> torch.Tensor:
    (key,) = [k for k in state if k.endswith("word_embeddings.weight")]
    return state[key]


def test_the_fvt_method_composes_each_decomposition(fixtures_root: Path, tmp_path: Path) -> None:
    source = _embeddings(load_file(fixtures_root / "bert-mlm" / "model.safetensors"))
    state, _ = _init(fixtures_root, tmp_path / "fvt", method="fvt")
    bert = AutoTokenizer.from_pretrained(fixtures_root / "bert-mlm")
    target = AutoTokenizer.from_pretrained(fixtures_root / "tok-bytebpe")
    prov = pq.read_table(tmp_path / "fvt" / "provenance.parquet").to_pylist()
    rows = _embeddings(state)
    checked = 0
    for row in prov:
        token = row["token"]
        if row["kind"] != "bridge" or not token.startswith("Ġ") or not token[1:].isascii() or not token[1:].isalpha():
            continue
        vocab = bert.get_vocab()
        texts = bert.tokenize(token[1:].lower())
        if bert.unk_token in texts:
            continue
        pieces = [vocab[p] for p in texts]
        expected = source[pieces].double().mean(0).float()
        torch.testing.assert_close(rows[row["target_id"]], expected, rtol=0, atol=1e-6)
        checked += 1
    assert checked > 100 and len(target) == len(prov)


def test_options_off_are_the_released_rule(fixtures_root: Path, tmp_path: Path) -> None:
    released, _ = _init(fixtures_root, tmp_path / "released")
    off, _ = _init(fixtures_root, tmp_path / "off", bridge_space="raw", fvt_weight=0.0, bridge_components=7)
    assert all(released[k].equal(off[k]) for k in released)
    assert InitConfig(fvt_weight=0.0).identity_settings() == InitConfig().identity_settings()
    assert "fvt_weight" in InitConfig(fvt_weight=0.5).identity_settings()
    assert "bridge_components" in InitConfig(bridge_space="abtt").identity_settings()


def test_fvt_weight_one_is_the_decomposition_where_there_is_one(fixtures_root: Path, tmp_path: Path) -> None:
    fvt, _ = _init(fixtures_root, tmp_path / "fvt", method="fvt")
    blended, _ = _init(fixtures_root, tmp_path / "blend", fvt_weight=1.0)
    prov = pq.read_table(tmp_path / "fvt" / "provenance.parquet").to_pylist()
    covered = [r["target_id"] for r in prov if r["kind"] == "bridge" and r["source_ids"]]
    assert len(covered) > 100
    torch.testing.assert_close(_embeddings(blended)[covered], _embeddings(fvt)[covered], rtol=0, atol=1e-6)


def test_the_sembridge_plus_recipe_is_applied_and_refuses_a_conflict() -> None:
    cfg = InitConfig(method="sembridge_plus")
    assert all(getattr(cfg, k) == v for k, v in SEMBRIDGE_PLUS.items())
    conflicts = {"bridge_space": "abtt", "fvt_weight": 0.9, "bridge_components": 9}
    key = next(k for k in SEMBRIDGE_PLUS if k in conflicts)
    assert SEMBRIDGE_PLUS[key] != conflicts[key]
    with pytest.raises(ConfigError, match=f"{key}=.*method sembridge_plus fixes it"):
        InitConfig(method="sembridge_plus", **{key: conflicts[key]})  # type: ignore[arg-type]
    assert InitConfig(method="sembridge_plus").identity_settings()["method"] == "sembridge_plus"


def test_sembridge_plus_is_the_released_rule_with_its_recipe_and_records_it(
    fixtures_root: Path, tmp_path: Path
) -> None:
    plus_state, _ = _init(fixtures_root, tmp_path / "plus", method="sembridge_plus")
    spelled, _ = _init(fixtures_root, tmp_path / "spelled", **SEMBRIDGE_PLUS)
    assert all(plus_state[k].equal(spelled[k]) for k in plus_state)  # the anchors exist: relative ran
    released, _ = _init(fixtures_root, tmp_path / "released")
    assert not _embeddings(plus_state).equal(_embeddings(released))
    rule = json.loads((tmp_path / "plus" / "init_report.json").read_text(encoding="utf-8"))
    assert {k: rule[k] for k in SEMBRIDGE_PLUS} == dict(SEMBRIDGE_PLUS)


def test_least_squares_with_an_infinite_ridge_is_the_entmax_weights_through_the_init(
    fixtures_root: Path, tmp_path: Path
) -> None:
    released, _ = _init(fixtures_root, tmp_path / "released")
    ridged, _ = _init(fixtures_root, tmp_path / "ridged", lsq_ridge=1e12)
    fitted, _ = _init(fixtures_root, tmp_path / "fitted", lsq_ridge=0.01)
    torch.testing.assert_close(_embeddings(ridged), _embeddings(released), rtol=0, atol=1e-6)
    assert not _embeddings(fitted).equal(_embeddings(released))
