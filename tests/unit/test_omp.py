"""The ``omp`` method: batched orthogonal matching pursuit against scikit-learn fitted row by row,
and the init job with it against the same oracle on the tiny fixtures."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from sklearn.linear_model import OrthogonalMatchingPursuit
from transformers import AutoTokenizer

from sembridge_ray.embed_init import omp
from sembridge_ray.embed_init.bridge import vocab_strings
from sembridge_ray.embed_init.config import WeightingConfig
from sembridge_ray.embed_init.pipeline import RowsContext, compute_rows
from sembridge_ray.embed_init.vocab import partition_vocab
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.runtime.config import ConfigError
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.outputs import is_complete
from tests.unit.test_position import NGRAM_STAGES, ngram_vectors

TOL = 1e-8


def sklearn_omp(
    targets: np.ndarray, atoms: np.ndarray, k: int, unit_atoms: bool = True
) -> np.ndarray:
    """(n, K) coefficients: scikit-learn's OMP fitted per row (``X = atoms.T``, no intercept).
    ``unit_atoms``: on the L2-normalised atoms, coefficients divided by the norms (selection by
    normalised correlation); else on the atoms as given. k is capped at K (scikit-learn refuses
    more) and at D: after D atoms the residual is zero, and its Cholesky path (D < K) checks the
    first correlation, not the residual's, so it may take a dependent atom whose factor rounding
    left above eps, with arbitrary coefficients; ``omp_weights`` stops there."""
    norms = np.linalg.norm(atoms, axis=1) if unit_atoms else np.ones(len(atoms))
    design = (atoms / norms[:, None]).T
    out = np.zeros((len(targets), len(atoms)))
    atoms_at_most = min(k, *atoms.shape)
    # "Orthogonal matching pursuit ended prematurely": a zero residual
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for row, y in enumerate(targets):
            fit = OrthogonalMatchingPursuit(n_nonzero_coefs=atoms_at_most, fit_intercept=False).fit(
                design, y
            )
            out[row] = fit.coef_ / norms
    return out


def batched(targets: np.ndarray, atoms: np.ndarray, k: int) -> np.ndarray:
    w = omp.omp_weights(torch.from_numpy(targets), torch.from_numpy(atoms), k)
    assert w.layout == torch.sparse_csr and w.dtype == torch.float64
    crow, cols = w.crow_indices(), w.col_indices()
    assert all(
        bool((cols[a + 1 : b] > cols[a : b - 1]).all())
        for a, b in itertools.pairwise(crow.tolist())
    )
    return w.to_dense().numpy()


def check(got: np.ndarray, want: np.ndarray, k: int) -> None:
    """Same atoms (scikit-learn's may add ~1e-17 coefficients after an exact fit) and coefficients
    to 1e-8."""
    np.testing.assert_array_equal(got != 0, np.abs(want) > 1e-12)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert int((got != 0).sum(1).max()) <= k


def rng_data(seed: int, n: int, m: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # norms far from 1: selection is scale-free
    atoms = rng.standard_normal((m, dim)) * rng.uniform(0.2, 3.0, (m, 1))
    return rng.standard_normal((n, dim)), atoms


@pytest.mark.parametrize(
    ("n", "m", "dim", "k"),
    [
        (40, 60, 16, 8),  # D < K: scikit-learn's Cholesky path
        (40, 12, 64, 8),  # D > K: its Gram path
        (10, 5, 16, 8),  # k > K: every atom at most
        (20, 30, 6, 8),  # k > D: the residual is zero after D atoms
        (30, 300, 32, 1),
        (25, 200, 48, 3),
    ],
)
def test_matches_scikit_learn_row_by_row(n: int, m: int, dim: int, k: int) -> None:
    targets, atoms = rng_data(n * m + k, n, m, dim)
    got = batched(targets, atoms, k)
    check(got, sklearn_omp(targets, atoms, k), k)
    assert (got < 0).any()  # least-squares coefficients: signed


def test_near_duplicate_atoms() -> None:
    """Pairs of atoms 1e-3 apart, targets near them: the choice between twins and the
    ill-conditioned refit."""
    targets, atoms = rng_data(7, 30, 80, 24)
    rng = np.random.default_rng(8)
    atoms[40:50] = atoms[:10] + 1e-3 * rng.standard_normal((10, 24))
    targets[:10] = atoms[:10] + 0.3 * atoms[40:50] + 0.05 * rng.standard_normal((10, 24))
    check(batched(targets, atoms, 8), sklearn_omp(targets, atoms, 8), 8)


def test_on_unit_atoms_it_is_scikit_learn_as_it_is() -> None:
    targets, atoms = rng_data(3, 20, 50, 16)
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    check(batched(targets, atoms, 5), sklearn_omp(targets, atoms, 5, unit_atoms=False), 5)


def test_an_exactly_representable_target_stops_at_its_atoms() -> None:
    _, atoms = rng_data(5, 1, 40, 32)
    atoms[7] = 0.0  # a zero atom is never chosen
    targets = np.stack([2.0 * atoms[3] - 0.5 * atoms[11] + atoms[30], np.zeros(32), atoms[19]])
    got = batched(targets, atoms, 8)
    kept = np.arange(40) != 7
    want = np.zeros_like(got)
    # scikit-learn cannot normalise a zero atom
    want[:, kept] = sklearn_omp(targets, atoms[kept], 8)
    check(got, want, 8)
    assert np.flatnonzero(got[0]).tolist() == [3, 11, 30]
    np.testing.assert_allclose(got[0, [3, 11, 30]], [2.0, -0.5, 1.0], rtol=0, atol=1e-12)
    assert not got[1].any()  # a zero target: an empty row
    assert np.flatnonzero(got[2]).tolist() == [19] and got[2, 19] == pytest.approx(1.0, abs=1e-12)


def test_rows_do_not_depend_on_their_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray stage cuts rows into batches, the in-process path does not: a row's code must not
    move."""
    targets, atoms = rng_data(11, 50, 120, 16)
    whole = batched(targets, atoms, 8)
    monkeypatch.setattr(omp, "_CHUNK_BYTES", 7 * 8 * 120)  # 7 rows per chunk
    assert np.array_equal(batched(targets, atoms, 8), whole)
    assert np.array_equal(batched(targets[13:20], atoms, 8), whole[13:20])


def test_bad_input_is_refused() -> None:
    targets, atoms = rng_data(1, 3, 5, 4)
    with pytest.raises(ValueError, match="k must be"):
        omp.omp_weights(torch.from_numpy(targets), torch.from_numpy(atoms), 0)
    targets[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        omp.omp_weights(torch.from_numpy(targets), torch.from_numpy(atoms), 2)
    with pytest.raises(ValueError, match="atoms"):
        omp.omp_weights(torch.from_numpy(targets), torch.from_numpy(atoms[:, :3]), 2)


def test_the_rows_stage_applies_the_code_over_the_anchors_to_every_source_matrix() -> None:
    """compute_rows with omp: the code over the anchors' bridge vectors, as CSR over source ids,
    weights the input rows, an untied output matrix and the decoder bias alike; a context without
    anchors is refused."""
    gen = torch.Generator().manual_seed(4)
    source_vecs, new = torch.randn(60, 16, generator=gen), torch.randn(9, 16, generator=gen)
    inputs, outputs, bias = (
        torch.randn(60, 5, generator=gen),
        torch.randn(60, 5, generator=gen),
        torch.randn(60),
    )
    anchors = torch.tensor([2, 3, 11, 17, 20, 31, 40, 41, 47, 52, 58])
    ctx = RowsContext(
        method="omp",
        weighting=WeightingConfig(omp_atoms=3),
        source_vecs=source_vecs,
        candidates=torch.arange(60),
        overlap_sources=anchors,
        inputs=inputs,
        outputs=outputs,
        bias=bias,
    )
    rows = compute_rows(ctx, np.arange(100, 109), new.numpy())
    assert rows.weights is not None
    dense = rows.weights.to_dense()
    want = omp.omp_weights(new, source_vecs[anchors], 3).to_dense()
    assert (
        torch.equal(dense[:, anchors], want)
        and not dense[:, np.setdiff1d(np.arange(60), anchors)].any()
    )
    for got, matrix in (
        (rows.inputs, inputs),
        (rows.outputs, outputs),
        (rows.bias, bias.unsqueeze(1)),
    ):
        assert got is not None
        torch.testing.assert_close(
            got.double().reshape(9, -1), dense @ matrix.double(), rtol=0, atol=1e-6
        )
    with pytest.raises(InputError, match="no anchors"):
        replace(ctx, overlap_sources=anchors[:0])


# ---- the init job
# ----------------------------------------------------------------------------------------------


def _config(root: Path, out: Path, **overrides: object) -> InitConfig:
    return InitConfig(
        source_model=str(root / "bert-mlm"),
        target_tokenizer=str(root / "tok-bytebpe"),
        bridge_model=str(root / "bridge"),
        output=str(out),
        cache_dir=str(out.parent / "cache"),
        samples=3,
        method="omp",
    ).with_settings(**overrides)


def _vectors(tok: object) -> dict[int, np.ndarray]:
    table = vocab_strings(tok)  # type: ignore[arg-type]
    vecs = ngram_vectors(table.column("text").to_pylist()).astype(np.float64)
    return dict(zip(table.column("id").to_pylist(), vecs, strict=True))


def test_the_init_composes_each_token_from_its_omp_code(
    fixtures_root: Path, tmp_path: Path
) -> None:
    """Bridged rows (inputs and decoder bias) are the anchors' source rows weighted by
    scikit-learn's OMP code of the token's bridge vector over theirs (the n-gram bridge); the
    provenance holds the code."""
    cfg = _config(fixtures_root, tmp_path / "omp", omp_atoms=4)
    initialise(cfg, NGRAM_STAGES)
    state = load_file(tmp_path / "omp" / "model" / "model.safetensors")
    assert all(bool(torch.isfinite(t).all()) for t in state.values())
    (key,) = [k for k in state if k.endswith("word_embeddings.weight")]
    source_state = load_file(fixtures_root / "bert-mlm" / "model.safetensors")
    e_in, bias = (
        source_state[key].double().numpy(),
        source_state["cls.predictions.bias"].double().numpy(),
    )
    src, tgt = (
        AutoTokenizer.from_pretrained(fixtures_root / n) for n in ("bert-mlm", "tok-bytebpe")
    )
    anchors = np.array(partition_vocab(src, tgt, cfg.match).anchors)
    src_vecs, tgt_vecs = _vectors(src), _vectors(tgt)
    atoms = np.stack([src_vecs[int(a)] for a in anchors])
    prov = [
        r
        for r in pq.read_table(tmp_path / "omp" / "provenance.parquet").to_pylist()
        if r["kind"] == "bridge"
    ]
    assert len(prov) > 50
    sample = prov[:: max(1, len(prov) // 40)]
    codes = sklearn_omp(np.stack([tgt_vecs[r["target_id"]] for r in sample]), atoms, 4)
    column = {int(a): j for j, a in enumerate(anchors)}
    for row, code in zip(sample, codes, strict=True):
        # the n-gram vectors are float32: a token their sum gives exactly leaves a residual of
        # ~1e-8, on which either side may stop or take another atom at a ~1e-8 coefficient; every
        # other weight agrees to 1e-6
        got = np.zeros(len(anchors))
        got[[column[s] for s in row["source_ids"]]] = row["weights"]
        np.testing.assert_allclose(got, code, rtol=0, atol=1e-6, err_msg=row["token"])
        np.testing.assert_allclose(
            state[key][row["target_id"]].double().numpy(), code @ e_in[anchors], atol=1e-6
        )
        got_bias = state["cls.predictions.bias"][row["target_id"]].item()
        assert got_bias == pytest.approx(float(code @ bias[anchors]), abs=1e-6)
    weights = [w for r in prov for w in r["weights"]]
    # signed, k atoms at most
    assert min(weights) < 0 and max(len(r["source_ids"]) for r in prov) == 4


def test_the_init_refuses_omp_without_anchors_or_with_convex_only_options(
    fixtures_root: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        InputError, match=r"^method omp: no source token matches a target token"
    ) as err:
        initialise(_config(fixtures_root, tmp_path / "none", match=()), NGRAM_STAGES)
    assert "\n" not in str(err.value) and not is_complete(tmp_path / "none")
    for key in ("fvt_weight", "lsq_ridge"):
        with pytest.raises(
            ConfigError, match=rf"^{key}=0\.5: method omp's weights are least-squares coefficients"
        ):
            initialise(_config(fixtures_root, tmp_path / key, **{key: 0.5}), NGRAM_STAGES)
    with pytest.raises(ConfigError, match=r"position_penalty=0\.5: method omp weighs no cosines"):
        _config(fixtures_root, tmp_path / "pa", position_aware=True, position_penalty=0.5)
    with pytest.raises(ConfigError, match=r"omp_atoms=0: must be >= 1"):
        _config(fixtures_root, tmp_path / "k", omp_atoms=0)


def test_omp_atoms_is_read_by_omp_only() -> None:
    assert "weighting.omp_atoms" not in InitConfig(method="omp").unread()
    assert "weighting.omp_atoms" in InitConfig().unread()
    assert InitConfig().with_settings(omp_atoms=3).rule == InitConfig().rule
    assert (
        InitConfig().why_unused("omp_atoms") == "method sembridge does not read it; only omp does"
    )
    assert "weighting.alpha" in InitConfig(method="omp").unread()
