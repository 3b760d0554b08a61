"""The model a user loads is the model that was scored: ``SparseEncoder(<output>/model)`` encodes
queries and documents at the lengths the evaluation used, with the source's pooling, and knows its
dimension on load."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.data.sick import read_sick_split
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.resources import sick_dir
from sembridge_ray.sparse.encode import encode_texts
from sembridge_ray.sparse.model import load_sparse_encoder

_SENTENCES = [p.a for p in read_sick_split(sick_dir(), "test")[:400]]
LONG_TEXTS = [" ".join(_SENTENCES[i : i + 20]) for i in range(0, 400, 20)]
"""20 documents of 20 SICK sentences each: well beyond 128 tokens, so any length cut shows."""


def encoded(model, texts: list[str], role: str) -> np.ndarray:
    encode = model.encode_query if role == "query" else model.encode_document
    return encode(texts, convert_to_tensor=True).to_dense().numpy()


def evaluated(model_dir: str, texts: list[str], role: str, cfg: EvaluateConfig) -> np.ndarray:
    """What the evaluate job's encoder actors compute (``SparseEncodeUDF``): load at the job's
    length, encode."""
    length = cfg.max_query_length if role == "query" else cfg.max_doc_length
    model = load_sparse_encoder(model_dir, max_length=length)
    indices, values = encode_texts(model, texts, cfg.encode_batch_size, role, None, "fp32")
    dimension = model.get_embedding_dimension()
    assert dimension is not None
    out = np.zeros((len(texts), dimension), np.float32)
    for row, (i, v) in enumerate(zip(indices, values, strict=True)):
        out[row, i] = v
    return out


def assert_encodes_as_evaluated(model_dir: str, texts: list[str], cfg: EvaluateConfig) -> None:
    from sentence_transformers import SparseEncoder

    published = SparseEncoder(model_dir, device="cpu")
    for role in ("document", "query"):
        assert (
            np.abs(encoded(published, texts, role) - evaluated(model_dir, texts, role, cfg)).max()
            < 1e-5
        ), role


@pytest.fixture(scope="module")
def init_cfg(fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory) -> InitConfig:
    root = tmp_path_factory.mktemp("published")
    return InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-wordpiece"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(root / "init"),
        cache_dir=str(root / "cache"),
        samples=0,
        query_length=12,
        document_length=40,
    )


def test_the_initialised_model_encodes_at_the_scored_lengths_and_knows_its_dimension(
    init_cfg: InitConfig,
) -> None:
    from sentence_transformers import SparseEncoder

    result = initialise(init_cfg)
    model = SparseEncoder(result.model, device="cpu")
    vocab = json.loads((Path(result.model) / "config.json").read_text())["vocab_size"]
    assert model.get_embedding_dimension() == vocab  # on load, before the first encode
    assert (
        model.max_seq_length == 40
        and model[0].document_length == 40
        and model[0].query_length == 12
    )
    scored = EvaluateConfig(max_query_length=12, max_doc_length=40)
    assert_encodes_as_evaluated(result.model, LONG_TEXTS, scored)
    unscored = EvaluateConfig()  # 64 / 256 tokens: another cut, other vectors
    assert (
        np.abs(
            encoded(model, LONG_TEXTS, "document")
            - evaluated(result.model, LONG_TEXTS, "document", unscored)
        ).max()
        > 1e-3
    )


def test_the_source_models_pooling_settings_are_kept(init_cfg: InitConfig, tmp_path: Path) -> None:
    source = tmp_path / "sum-pooled"
    shutil.copytree(init_cfg.source_model, source)
    pooling = source / "1_SpladePooling" / "config.json"
    settings = json.loads(pooling.read_text()) | {"pooling_strategy": "sum"}
    pooling.write_text(json.dumps(settings))
    result = initialise(replace(init_cfg, source_model=str(source), output=str(tmp_path / "init")))
    written = json.loads((Path(result.model) / "1_SpladePooling" / "config.json").read_text())
    assert (written["pooling_strategy"], written["activation_function"]) == (
        "sum",
        settings["activation_function"],
    )
