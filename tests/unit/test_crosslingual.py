"""The cross-lingual recipe's options (``embed_init.crosslingual``, method ``sembridge_x``), each
against a hand computation or a direct implementation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from sembridge_ray.embed_init.crosslingual import (
    bridge_confidence,
    drop_rows,
    least_confident,
    rescale_to_sources,
)


def test_rows_take_the_weighted_mean_norm_of_their_sources_times_the_scale() -> None:
    rows = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]])
    weights = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.25, 0.75]])
    norms = torch.tensor([1.0, 3.0, 5.0])
    for w in (weights, weights.to_sparse_csr()):
        out = rescale_to_sources(rows, w, norms, 1.5)
        # row 0: 1.5 x (0.5·1 + 0.5·3) = 3 along (3, 4) / 5; row 1 has no weights: as it was
        assert torch.allclose(out[0], torch.tensor([1.8, 2.4]))
        assert torch.equal(out[1], rows[1])
        # row 2: 1.5 x (0.25·3 + 0.75·5) = 6.75 along (0, 1)
        assert torch.allclose(out[2], torch.tensor([0.0, 6.75]))


def _direct(new: np.ndarray, src: np.ndarray, tgt: np.ndarray, kind: str, k: int) -> np.ndarray:
    """The confidence of each new token by loops over plain numpy (the definitions, no blocks)."""

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    n, s, t = (
        unit(new.astype(np.float64)),
        unit(src.astype(np.float64)),
        unit(tgt.astype(np.float64)),
    )
    found = []
    for x in n:
        cos = s @ x
        best = np.sort(cos)[::-1][:k]
        if kind == "cosine":
            found.append(best[0])
        elif kind == "margin":
            found.append(best[0] / best.mean())
        else:
            r_t = [np.sort(t @ y)[::-1][:k].mean() for y in s]
            found.append(max(2 * cos[j] - best.mean() - r_t[j] for j in range(len(s))))
    return np.array(found)


@pytest.mark.parametrize("kind", ["csls", "margin", "cosine"])
def test_the_confidence_scores_match_their_definitions(kind: str) -> None:
    rng = np.random.default_rng(0)
    src, tgt = rng.standard_normal((30, 8)), rng.standard_normal((40, 8))
    new = tgt[:12]
    found = bridge_confidence(
        torch.from_numpy(new), torch.from_numpy(src), torch.from_numpy(tgt), kind, k=4, block=5
    )
    np.testing.assert_allclose(found.numpy(), _direct(new, src, tgt, kind, 4), rtol=1e-10)
    with pytest.raises(ValueError, match="unknown bridge confidence"):
        bridge_confidence(torch.from_numpy(new), torch.from_numpy(src), torch.from_numpy(tgt), "x")


def test_the_gate_takes_the_least_confident_share_ties_to_the_lower_index() -> None:
    sure = torch.tensor([0.5, 0.1, 0.9, 0.1, 0.3])
    assert least_confident(sure, 0.4).tolist() == [False, True, False, True, False]
    assert least_confident(sure, 0.2).tolist() == [False, True, False, False, False]
    assert not least_confident(sure, 0.0).any() and least_confident(sure, 1.0).all()


def test_dropped_rows_lose_their_weights_and_no_other_row_changes() -> None:
    dense = torch.tensor([[0.2, 0.8, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    out = drop_rows(dense.to_sparse_csr(), torch.tensor([False, True, False]))
    assert torch.equal(
        out.to_dense(), torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5]])
    )


def _init(fixtures_root: Path, out: Path, method: str, **weighting: object) -> Path:
    from sembridge_ray.recipes.init.config import InitConfig
    from sembridge_ray.recipes.init.run import initialise

    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-bytebpe"),
        bridge_model=str(fixtures_root / "bridge"),
        cache_dir=str(out.parent / "cache"),
        output=str(out),
        method=method,  # type: ignore[arg-type]
        copy_overlap=False,
        samples=0,
        precision="fp32",
    )
    initialise(cfg.with_settings(**weighting) if weighting else cfg)
    return out


def _embeddings(out: Path) -> torch.Tensor:
    weights = load_file(str(out / "model" / "model.safetensors"))
    return next(v for k, v in weights.items() if k.endswith("word_embeddings.weight"))


def test_the_recipe_rescales_the_bridged_rows_and_gives_the_least_sure_the_random_rows(
    fixtures_root: Path, tmp_path: Path
) -> None:
    """An init with ``norm_scale`` and ``confidence_gate``: the gated tokens' rows are exactly the
    random method's (same seed), the others the released rule's rows at 1.5 times their sources'
    weighted mean norm; the provenance names no source for a gated token."""
    plain = _embeddings(_init(fixtures_root, tmp_path / "sembridge", "sembridge"))
    random = _embeddings(_init(fixtures_root, tmp_path / "random", "random"))
    x = _init(
        fixtures_root,
        tmp_path / "x",
        "sembridge",
        norm_scale=1.5,
        confidence_gate=0.5,
        confidence="cosine",
    )
    rows = _embeddings(x)
    source = _embeddings_of(fixtures_root / "bert-mlm")
    prov = pq.read_table(x / "provenance.parquet").to_pylist()
    bridged = [r for r in prov if r["kind"] == "bridge"]
    gated = [r for r in bridged if not r["source_ids"]]
    assert len(gated) == round(0.5 * len(bridged))
    for r in gated:
        assert torch.equal(rows[r["target_id"]], random[r["target_id"]])
    for r in (r for r in bridged if r["source_ids"]):
        t, w = r["target_id"], torch.tensor(r["weights"], dtype=torch.float64)
        target = 1.5 * float((w * source[r["source_ids"]].double().norm(dim=1)).sum() / w.sum())
        assert float(rows[t].double().norm()) == pytest.approx(target, rel=1e-5)
        cosine = torch.nn.functional.cosine_similarity(rows[t].double(), plain[t].double(), dim=0)
        assert float(cosine) == pytest.approx(1.0, abs=1e-6)


def _embeddings_of(model_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForMaskedLM

    return (
        AutoModelForMaskedLM.from_pretrained(str(model_dir)).get_input_embeddings().weight.detach()
    )
