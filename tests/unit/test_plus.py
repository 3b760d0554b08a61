"""SemBridge+'s options (``embed_init.plus``): the bridge-space transforms against numpy, the FVT
decomposition against hand-made cases and BERT's own WordPiece, the blend against dense arithmetic,
the ``fvt`` method and the ``sembridge_plus`` recipe through the whole init."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from entmax import entmax_bisect
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from sembridge_ray.embed_init import plus, weighting
from sembridge_ray.embed_init.methods import SEMBRIDGE_PLUS
from sembridge_ray.embed_init.vocab import VocabIndex, canonical, tokenizer_family
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.runtime.config import ConfigError
from tests.unit.test_position import NGRAM_STAGES


@pytest.fixture(scope="module")
def vectors() -> torch.Tensor:
    rng = np.random.default_rng(3)
    # anisotropic, off-centre
    base = rng.standard_normal((400, 12)) @ np.diag(np.linspace(5, 0.2, 12)) + 3.0
    return torch.from_numpy(base)


def test_centre_and_abtt_match_numpy(vectors: torch.Tensor) -> None:
    x = vectors.numpy()
    centred = x - x.mean(0)
    # rows: principal directions, by variance
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    for k in (1, 3):
        top = vt[:k].T
        expected = centred - centred @ top @ top.T
        got = (
            plus.apply_transform(vectors, plus.space_transform(vectors, "abtt", k)).double().numpy()
        )
        np.testing.assert_allclose(got, expected, atol=1e-5)
    got = plus.apply_transform(vectors, plus.space_transform(vectors, "center", 3)).double().numpy()
    np.testing.assert_allclose(got, centred, atol=1e-5)
    assert plus.space_transform(vectors, "raw", 3) is None


def test_whitening_gives_the_identity_covariance(vectors: torch.Tensor) -> None:
    white = (
        plus.apply_transform(vectors, plus.space_transform(vectors, "whiten", 3)).double().numpy()
    )
    np.testing.assert_allclose(np.cov(white, rowvar=False, bias=True), np.eye(12), atol=1e-4)
    np.testing.assert_allclose(white.mean(0), 0, atol=1e-5)


def test_relative_space_gives_the_cosines_of_the_anchor_cosine_vectors(
    vectors: torch.Tensor,
) -> None:
    x = vectors.numpy()
    anchors = x[::7][:40]  # more anchors (40) than dimensions (12), as on a real vocabulary
    unit = anchors / np.linalg.norm(anchors, axis=1, keepdims=True)
    # TokAlign's representation: a token's cosines to the anchors (up to its own norm)
    rel = x @ unit.T
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
    # word-initial first, then continuations
    assert plus.decompose("▁playing", index, folded, 5) == [1, 2]
    assert plus.decompose("ing", index, folded, 5) == [2]  # a continuation stays a continuation
    # lower case for an uncased source
    assert plus.decompose("▁PLAYing", index, folded, 5) == [1, 2]
    assert plus.decompose("▁lala", index, folded, 5) == [6, 5]
    assert plus.decompose("▁pl#ay", index, folded, 5) == [3, 4]  # an uncovered character is dropped
    assert plus.decompose("##", index, folded, 5) == []


def test_word_initial_decompositions_are_berts_own_wordpiece(shared_data: Path) -> None:
    """WordPiece is greedy longest-match-first too: for a lower-case ASCII word, the cut of its
    canonical form equals ``BertTokenizer.tokenize`` of the word."""
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
    split, vocab = 0, bert.get_vocab()  # once: a 30k-entry dict built per word cost 80 s
    for row, tid in enumerate(ids):
        pieces = [vocab[p] for p in bert.tokenize(words[tid])]
        counts = {p: pieces.count(p) / len(pieces) for p in pieces}
        got = dict(
            zip(
                cols[crow[row] : crow[row + 1]].tolist(),
                vals[crow[row] : crow[row + 1]].tolist(),
                strict=True,
            )
        )
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
        got = (
            plus.least_squares(csr, torch.from_numpy(new), torch.from_numpy(source), ridge)
            .to_dense()
            .double()
        )
        for r, cols in enumerate(supports):
            w0 = dense[r, cols].astype(np.float32).astype(np.float64)
            b = new[r] / np.linalg.norm(new[r])
            # KKT of min |A w - y|^2 s.t. 1'w = 1, with A = [B'; sqrt(ridge) I], y = [b; sqrt(ridge)
            # w0]
            a = np.vstack([unit[cols].T, np.sqrt(ridge) * np.eye(len(cols))])
            y = np.concatenate([b, np.sqrt(ridge) * w0])
            k = len(cols)
            kkt = np.block([[2 * a.T @ a, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
            expected = np.linalg.solve(kkt, np.concatenate([2 * a.T @ y, [1.0]]))[:k]
            np.testing.assert_allclose(got[r, cols].numpy(), expected, atol=1e-5)
            assert float(got[r].sum()) == pytest.approx(1.0, abs=1e-5)
            assert int((got[r] != 0).sum()) <= k  # the support is kept
    huge = plus.least_squares(csr, torch.from_numpy(new), torch.from_numpy(source), 1e9).to_dense()
    # an infinite ridge is the released weights
    np.testing.assert_allclose(huge.numpy(), dense, atol=1e-5)


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
    ).with_settings(**overrides)
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
        if (
            row["kind"] != "bridge"
            or not token.startswith("Ġ")
            or not token[1:].isascii()
            or not token[1:].isalpha()
        ):
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
    off, _ = _init(
        fixtures_root, tmp_path / "off", bridge_space="raw", fvt_weight=0.0, bridge_components=7
    )
    assert all(released[k].equal(off[k]) for k in released)
    assert "weighting.fvt_weight" not in InitConfig().unread()
    assert "weighting.bridge_components" in InitConfig().unread()
    assert (
        "weighting.bridge_components"
        not in InitConfig().with_settings(bridge_space="abtt").unread()
    )


def test_fvt_weight_one_is_the_decomposition_where_there_is_one(
    fixtures_root: Path, tmp_path: Path
) -> None:
    fvt, _ = _init(fixtures_root, tmp_path / "fvt", method="fvt")
    blended, _ = _init(fixtures_root, tmp_path / "blend", fvt_weight=1.0)
    prov = pq.read_table(tmp_path / "fvt" / "provenance.parquet").to_pylist()
    covered = [r["target_id"] for r in prov if r["kind"] == "bridge" and r["source_ids"]]
    assert len(covered) > 100
    torch.testing.assert_close(
        _embeddings(blended)[covered], _embeddings(fvt)[covered], rtol=0, atol=1e-6
    )


def test_the_sembridge_plus_recipe_is_applied_and_refuses_a_conflict() -> None:
    cfg = InitConfig(method="sembridge_plus")
    assert all(getattr(cfg.weighting, k) == v for k, v in SEMBRIDGE_PLUS.items())
    conflicts = {"bridge_space": "abtt", "fvt_weight": 0.9, "bridge_components": 9}
    key = next(k for k in SEMBRIDGE_PLUS if k in conflicts)
    assert SEMBRIDGE_PLUS[key] != conflicts[key]
    with pytest.raises(ConfigError, match=f"{key}=.*method sembridge_plus fixes it"):
        InitConfig().with_settings(method="sembridge_plus", **{key: conflicts[key]})
    assert (
        InitConfig(method="sembridge_plus").identity("init", {}).settings["method"]
        == "sembridge_plus"
    )


def test_sembridge_plus_is_the_released_rule_with_its_recipe_and_records_it(
    fixtures_root: Path, tmp_path: Path
) -> None:
    plus_state, _ = _init(fixtures_root, tmp_path / "plus", method="sembridge_plus")
    spelled, _ = _init(fixtures_root, tmp_path / "spelled", **SEMBRIDGE_PLUS)
    # the anchors exist: relative ran
    assert all(plus_state[k].equal(spelled[k]) for k in plus_state)
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


@pytest.mark.parametrize("alpha", [4.0, 2.0, 1.5])
def test_support_temperature_gives_the_asked_support_under_entmax_bisect(alpha: float) -> None:
    gen = torch.Generator().manual_seed(int(alpha * 10))
    scores = torch.randn(60, 24, generator=gen, dtype=torch.float64).sort(1, descending=True).values
    sizes = torch.randint(1, 12, (60,), generator=gen)
    temps = weighting.support_temperature(scores, alpha, sizes)
    probs = entmax_bisect(scores / temps[:, None], alpha=alpha, dim=-1, n_iter=200)  # the oracle
    assert torch.equal((probs > 1e-12).sum(1), sizes)
    # a tie across the asked place: the largest size below that keeps it whole, else (tied at the
    # top) above it
    tied = torch.tensor(
        [[0.9, 0.5, 0.5, 0.1], [0.5, 0.5, 0.5, 0.1], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64
    )
    temps = weighting.support_temperature(tied, alpha, torch.tensor([2, 2, 2]))
    probs = entmax_bisect(tied / temps[:, None], alpha=alpha, dim=-1, n_iter=200)
    assert (probs > 1e-12).sum(1).tolist() == [1, 3, 4] and temps[2].item() == 1.0


def test_adaptive_support_is_exact_entmax_of_the_full_row_at_each_rows_temperature() -> None:
    gen = torch.Generator().manual_seed(5)
    new, src = torch.randn(50, 16, generator=gen), torch.randn(3000, 16, generator=gen)
    src[100:130] = src[7]  # ties around some rows' candidates: certification has to widen them
    new[:5] = src[7] + 1e-3 * torch.randn(5, 16, generator=gen)
    sizes = torch.randint(1, 7, (50,), generator=gen)
    got = sembridge_ray_weights(new, src, sizes)
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    temps = weighting.support_temperature(cos.sort(1, descending=True).values, 4.0, sizes)
    want = entmax_bisect(cos / temps[:, None], alpha=4.0, dim=-1, n_iter=200)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    assert torch.equal((got > 0).sum(1)[5:], sizes[5:])  # the tied rows keep the tie whole


def sembridge_ray_weights(
    new: torch.Tensor, src: torch.Tensor, sizes: torch.Tensor
) -> torch.Tensor:
    return weighting.bridge_weights(new, src, 4.0, support=sizes).to_dense()


def test_support_sizes_follow_the_decomposition() -> None:
    prior = plus._csr(np.array([0, 0, 0, 2]), np.array([1, 4, 5, 3]), np.full(4, 0.25), 3, 8)
    fvt, fixed = plus.support_sizes(prior, 3, "fvt", 2), plus.support_sizes(None, 3, "fixed", 4)
    assert fvt is not None and fixed is not None
    assert fvt.tolist() == [3, 2, 1]  # row 1 has no decomposition: support_size
    assert fixed.tolist() == [4, 4, 4]
    assert plus.support_sizes(prior, 3, "off", 2) is None


def test_frequency_bias_is_the_standardised_log_count_at_the_source_bias_moments(
    fixtures_root: Path,
) -> None:
    tok = AutoTokenizer.from_pretrained(fixtures_root / "tok-bytebpe")
    texts = ["a man is playing a guitar", "a man plays", "the guitar"]
    ids = np.array(sorted(set(tok("a man is playing a guitar")["input_ids"]) | {len(tok) - 1}))
    counts = {i: 0 for i in ids.tolist()}
    for text in texts:  # the oracle: count by hand, one text at a time
        for tid in tok.encode(text, add_special_tokens=False):
            counts[tid] = counts.get(tid, 0) + 1
    freq = plus.log_frequencies(plus.token_counts(tok, texts), ids)
    np.testing.assert_allclose(freq, np.log1p([counts[i] for i in ids.tolist()]))
    source = torch.tensor([-3.0, -1.0, -2.0, 0.5])
    bias = plus.frequency_bias(freq, source)
    z = (freq - freq.mean()) / freq.std()
    np.testing.assert_allclose(
        bias.numpy(), source.numpy().mean() + source.numpy().std() * z, rtol=1e-6
    )
    flat = plus.frequency_bias(np.zeros(3), source)
    np.testing.assert_allclose(flat.numpy(), np.full(3, source.numpy().mean()))


def test_the_new_options_through_the_init(fixtures_root: Path, tmp_path: Path) -> None:
    """random_blend=1 is the random method's rows; a fixed adaptive support is every bridged row's
    support."""
    random_state, _ = _init(fixtures_root, tmp_path / "random", method="random")
    blended, _ = _init(fixtures_root, tmp_path / "blend", random_blend=1.0)
    prov = pq.read_table(tmp_path / "blend" / "provenance.parquet").to_pylist()
    bridged = [r["target_id"] for r in prov if r["kind"] == "bridge"]
    torch.testing.assert_close(
        _embeddings(blended)[bridged], _embeddings(random_state)[bridged], rtol=0, atol=1e-6
    )
    _init(fixtures_root, tmp_path / "fixed", adaptive_support="fixed", support_size=3)
    rows = pq.read_table(tmp_path / "fixed" / "provenance.parquet").to_pylist()
    sizes = [len(r["source_ids"]) for r in rows if r["kind"] == "bridge"]
    assert sizes.count(3) > 0.8 * len(sizes)  # the tiny n-gram bridge has many exact ties
    tied_top = [r["weights"] for r in rows if r["kind"] == "bridge" and len(r["source_ids"]) > 3]
    assert all(max(w) - min(w) < 1e-6 for w in tied_top)  # more only where the tie reaches the top
    report = json.loads((tmp_path / "fixed" / "init_report.json").read_text(encoding="utf-8"))
    assert (report["adaptive_support"], report["support_size"]) == ("fixed", 3)


def test_the_frequency_bias_through_the_init(fixtures_root: Path, tmp_path: Path) -> None:
    """Copies keep their bias; the bridged rows' bias is the frequency prior at the source bias'
    moments."""
    root = tmp_path / "fixtures"
    shutil.copytree(fixtures_root / "bert-mlm", root / "bert-mlm")
    for name in ("tok-bytebpe", "bridge"):
        (root / name).symlink_to(fixtures_root / name)
    weights = root / "bert-mlm" / "model.safetensors"
    state = load_file(weights)
    source = (
        torch.randn(len(state["cls.predictions.bias"]), generator=torch.Generator().manual_seed(1))
        - 2
    )
    state["cls.predictions.bias"] = source
    save_file(state, weights)
    text = tmp_path / "text.txt"
    text.write_text("a man is playing a guitar\nthe woman is slicing an onion\n", encoding="utf-8")
    freq, result = _init(root, tmp_path / "freq", bias="frequency", bias_text=str(text))
    released, _ = _init(root, tmp_path / "released")
    prov = pq.read_table(tmp_path / "freq" / "provenance.parquet").to_pylist()
    bridged = torch.tensor([r["target_id"] for r in prov if r["kind"] == "bridge"])
    special = torch.tensor([r["target_id"] for r in prov if r["kind"] == "special"])
    key = "cls.predictions.bias"
    assert torch.equal(freq[key][special], released[key][special])
    tok = AutoTokenizer.from_pretrained(root / "tok-bytebpe")
    bert = AutoTokenizer.from_pretrained(root / "bert-mlm")
    counts = plus.log_frequencies(
        plus.token_counts(tok, text.read_text(encoding="utf-8").splitlines()), bridged.numpy()
    )
    kept = torch.tensor(sorted(set(range(len(source))) - set(bert.all_special_ids)))
    want = plus.frequency_bias(counts, source[kept])
    torch.testing.assert_close(freq[key][bridged], want, rtol=0, atol=1e-6)
    assert result.report["bias"] == "frequency"  # type: ignore[attr-defined]


def test_the_new_options_are_checked_and_read_only_when_on() -> None:
    with pytest.raises(
        ConfigError,
        match="adaptive_support='fvt': needs method sembridge or sembridge_plus with alpha",
    ):
        InitConfig().with_settings(alpha=1.0, adaptive_support="fvt")
    # a grid's global option leaves the methods it does not apply to as they were
    wechsel = InitConfig().with_settings(method="wechsel", adaptive_support="fvt")
    assert wechsel.rule.adaptive_support == "off"
    assert wechsel.rule == InitConfig(method="wechsel").rule
    with pytest.raises(ConfigError, match="bias_text"):
        InitConfig(bias="frequency")
    with pytest.raises(ConfigError, match="random_blend"):
        InitConfig().with_settings(random_blend=1.5)
    assert InitConfig().with_settings(support_size=5, random_blend=0.0).rule == InitConfig().rule
    on = InitConfig().with_settings(adaptive_support="fvt", random_blend=0.25)
    recorded = on.identity("init", {}).settings
    assert {
        recorded[f"weighting.{k}"] for k in ("adaptive_support", "support_size", "random_blend")
    } == {
        "fvt",
        2,
        0.25,
    }
