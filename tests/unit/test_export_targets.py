"""The export targets (issue 36), Ray-free: every embedded target's top-10 against a brute-force
float64 oracle on 40 queries (exact targets identical up to ties, quantised ones within their
documented tolerance), the OpenSearch/Elasticsearch bulk files against the engines' field rules and
back to the same vectors, the ONNX encoder against PyTorch, and bad input refused with one line,
exit 2, before any encoding."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic import sparse_vectors, zipf_probs
from jobs import export as export_job
from sembridge_ray.export.base import Vectors
from sembridge_ray.export.engine import EngineTarget
from sembridge_ray.export.parity import exact_topk, parity
from sembridge_ray.export.targets import TARGETS
from tests.conftest import error_lines

VOCAB = 3000


@pytest.fixture(scope="module")
def corpus() -> tuple[Vectors, Vectors]:
    """400 documents, 40 queries: Zipf-drawn terms, uniform weights (many near-ties: the tie rule is
    exercised)."""
    rng = np.random.default_rng(7)
    probs = zipf_probs(VOCAB, 1.1, rng)
    docs = sparse_vectors(400, 60, probs, rng)
    queries = sparse_vectors(40, 12, probs, rng)
    return Vectors([f"doc-{i:04d}" for i in range(400)], docs), Vectors(
        [f"q{i}" for i in range(40)], queries
    )


def dense(vectors: Vectors) -> np.ndarray:
    out = np.zeros((len(vectors), VOCAB))
    for i in range(len(vectors)):
        terms, weights = vectors.row(i)
        out[i, terms] = weights
    return out


def oracle(docs: Vectors, queries: Vectors, k: int = 10) -> tuple[np.ndarray, list[list[float]]]:
    """float64 brute force: every (query, document) score, and each query's k best positive
    scores."""
    scores = dense(queries) @ dense(docs).T
    best = [sorted((s for s in row if s > 0), reverse=True)[:k] for row in scores]
    return scores, best


def agrees(docs: Vectors, queries: Vectors, hits: list[list[str]]) -> list[bool]:
    """Per query: the returned documents' oracle scores are the k best scores (ties may be chosen
    either way)."""
    scores, best = oracle(docs, queries)
    where = {d: i for i, d in enumerate(docs.ids)}
    got = [
        sorted((scores[q, where[d]] for d in row[:10] if scores[q, where[d]] > 0), reverse=True)
        for q, row in enumerate(hits)
    ]
    return [
        len(g) == len(b) and np.allclose(g, b, rtol=1e-5, atol=0)
        for g, b in zip(got, best, strict=True)
    ]


def test_the_exact_search_is_the_oracle(corpus: tuple[Vectors, Vectors]) -> None:
    docs, queries = corpus
    assert all(agrees(docs, queries, exact_topk(docs, queries)))


@pytest.mark.parametrize("name", ["qdrant", "milvus", "seismic", "pisa"])
def test_an_embedded_engine_returns_the_exact_top10(
    name: str, corpus: tuple[Vectors, Vectors], tmp_path: Path
) -> None:
    found = TARGETS[name]
    assert isinstance(found, EngineTarget) and found.package
    pytest.importorskip(found.package.module)
    docs, queries = corpus
    engine, details = found.build(tmp_path, docs)
    try:
        hits = engine.search(queries, 10)
    finally:
        engine.close()
    assert (tmp_path / found.location).exists()
    same = agrees(docs, queries, hits)
    checked = parity(docs, queries, hits)
    assert checked.identical_up_to_ties == pytest.approx(np.mean(same))
    if found.tolerance.exact:
        assert all(same), f"{name}: {same.count(False)} queries differ from the exact top-10"
    else:
        assert checked.overlap_at_10 >= found.tolerance.min_overlap, (name, checked)
    if name == "pisa":
        assert details["scale"] == 100.0


def test_qdrant_local_mode_reopens(corpus: tuple[Vectors, Vectors], tmp_path: Path) -> None:
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient

    from sembridge_ray.export import qdrant

    docs, _ = corpus
    engine, _ = qdrant.build(tmp_path, docs)
    engine.close()
    client = QdrantClient(path=str(tmp_path / "qdrant"))
    assert client.count(qdrant.COLLECTION).count == len(docs)
    client.close()


def test_milvus_lite_reopens_after_close(corpus: tuple[Vectors, Vectors], tmp_path: Path) -> None:
    """Closing the engine stops the embedded server; a fresh client finds every row in the file."""
    pytest.importorskip("milvus_lite")
    from milvus_lite.server_manager import server_manager_instance
    from pymilvus import MilvusClient

    from sembridge_ray.export import milvus

    docs, _ = corpus
    engine, _ = milvus.build(tmp_path, docs)
    engine.close()
    client = MilvusClient(str(tmp_path / milvus.LOCATION))
    (row,) = client.query(milvus.COLLECTION, output_fields=["count(*)"])
    client.close()
    server_manager_instance.release_server(str(tmp_path / milvus.LOCATION))
    assert row["count(*)"] == len(docs)


TOKENS = ["[PAD]", "the", "##ing", "▁de", "東京", "e.g.", "3.5", "%", "%2E", "a.b%c"]


@pytest.mark.parametrize("target", ["opensearch", "elasticsearch", "opensearch-sparse-vector"])
def test_bulk_files_follow_the_field_rules_and_round_trip(target: str, tmp_path: Path) -> None:
    from sembridge_ray.export import lucene

    rng = np.random.default_rng(1)
    vocab = TOKENS + [f"tok{i}" for i in range(90)]
    rows = [np.sort(rng.choice(len(vocab), 12, replace=False)) for _ in range(30)]
    weights = [rng.uniform(0.01, 5.0, 12).astype(np.float32) for _ in rows]
    weights[0][0] = 1e-40  # subnormal: Lucene rejects it, the file leaves it out
    docs = Vectors.from_rows([f"d{i}" for i in range(30)], rows, weights)
    queries = Vectors.from_rows(["q"], rows[:1], weights[:1])
    lucene.write(tmp_path, target, docs, queries, vocab, 10)
    assert lucene.validate(tmp_path / lucene.BULK, target) == []
    back = lucene.read_bulk(tmp_path / lucene.BULK, target, vocab)
    assert back.ids == docs.ids
    for i in range(len(docs)):
        terms, values = docs.row(i)
        keep = values >= lucene.FLOAT_MIN_NORMAL
        want = (
            np.minimum(values[keep], 3.0) if target == "opensearch-sparse-vector" else values[keep]
        )
        np.testing.assert_array_equal(back.row(i)[0], terms[keep])
        np.testing.assert_array_equal(back.row(i)[1], want)
    names = [
        k
        for line in (tmp_path / lucene.BULK).read_text().splitlines()[1::2]
        for k in json.loads(line)["sparse"]
    ]
    if target == "opensearch-sparse-vector":
        assert all(n.isdigit() for n in names)
        params = json.loads((tmp_path / lucene.MAPPING).read_text())["mappings"]["properties"][
            "sparse"
        ]["method"]
        assert params["parameters"]["quantization_ceiling_ingest"] == 3.0
    else:
        assert not any("." in n for n in names) and {
            "e%2Eg%2E",
            "a%2Eb%25c",
            "東京",
            "##ing",
        } <= set(names)
        assert {lucene.unescape(lucene.escape(t)) for t in vocab} == set(vocab)
    body = json.loads((tmp_path / lucene.SEARCHES).read_text().splitlines()[1])
    assert body["size"] == 10 and "query" in body


def test_bad_bulk_lines_are_named(tmp_path: Path) -> None:
    from sembridge_ray.export import lucene

    path = tmp_path / "bulk.ndjson"
    path.write_text(
        '{"index": {"_id": "a"}}\n{"sparse": {"x.y": 1.0, "z": -2.0, "": 1.0, "w": NaN}}\n'
    )
    problems = lucene.validate(path, "elasticsearch")
    assert (
        len(problems) == 4
        and any("'x.y'" in p for p in problems)
        and any("-2.0" in p for p in problems)
    )
    path.write_text('{"index": {"_id": "a"}}\n{"sparse": {"12": 3.5, "tok": 1.0}}\n')
    assert len(lucene.validate(path, "opensearch-sparse-vector")) == 2


def test_lucene_keeps_nine_significant_bits() -> None:
    from sembridge_ray.export.lucene import stored

    values = np.array([1.0, 1.2345678, 3.14159, 0.001], np.float32)
    vec = Vectors.from_rows(["d"], [np.arange(4, dtype=np.int32)], [values])
    kept = stored("elasticsearch", vec).rows.values
    assert np.all(kept <= values) and np.all((values - kept) / values < 2.0**-8)
    assert kept[0] == 1.0 and kept[1] != values[1]


def _dense(vectors: Vectors, width: int) -> np.ndarray:
    rows = vectors.rows
    dense = np.zeros((rows.rows, width), dtype=np.float32)
    dense[np.repeat(np.arange(rows.rows), np.diff(rows.indptr)), rows.indices] = rows.values
    return dense


@pytest.mark.parametrize("variant", ["onnx", "onnx-optimized", "onnx-int8", "openvino"])
def test_onnx_encodes_as_pytorch(variant: str, fixtures_root: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    found = TARGETS[variant]
    assert found.package
    pytest.importorskip(found.package.module)
    from sembridge_ray.export import onnx
    from sembridge_ray.sparse.encode import encode_texts
    from sembridge_ray.sparse.model import load_sparse_encoder
    from sembridge_ray.testing import source_text

    model = str(fixtures_root / "bert-mlm")
    texts, asked = source_text()[:200], source_text()[2000:2040]
    torch_docs = Vectors.from_rows(
        [f"d{i}" for i in range(200)],
        *encode_texts(load_sparse_encoder(model, max_length=256), texts, 32, "document"),
    )
    torch_queries = Vectors.from_rows(
        [f"q{i}" for i in range(40)],
        *encode_texts(load_sparse_encoder(model, max_length=64), asked, 32, "query"),
    )
    config = onnx.export(model, tmp_path, variant, 64, 256)
    assert config["variant"] == variant and (tmp_path / onnx.graph_name(variant)).is_file()
    encoder = onnx.OnnxSparseEncoder(tmp_path)
    docs = Vectors.from_rows(torch_docs.ids, *encoder.encode(texts, "document"))
    queries = Vectors.from_rows(torch_queries.ids, *encoder.encode(asked, "query"))
    hits = exact_topk(docs, queries)
    same = agrees(torch_docs, torch_queries, hits)
    if found.tolerance.exact:
        assert all(same)
        # as dense weights: a weight within rounding of zero may be kept by one engine and not the
        # other (seen on one machine: 383,652 against 383,653 nonzeros), a difference below atol
        width = 1 + int(max(docs.rows.indices.max(), torch_docs.rows.indices.max()))
        np.testing.assert_allclose(
            _dense(docs, width), _dense(torch_docs, width), rtol=1e-4, atol=1e-5
        )
    else:
        assert parity(torch_docs, torch_queries, hits).overlap_at_10 >= found.tolerance.min_overlap


def test_the_onnx_export_truncates_at_the_lengths_it_is_given(
    fixtures_root: Path, tmp_path: Path
) -> None:
    """``--max-query-length`` / ``--max-doc-length`` reach the exported encoder: at 8 and 16 tokens
    it encodes as PyTorch truncated there, not as at the defaults."""
    pytest.importorskip("onnx")
    from sembridge_ray.export import onnx
    from sembridge_ray.sparse.encode import encode_texts
    from sembridge_ray.sparse.model import load_sparse_encoder
    from sembridge_ray.testing import source_text

    model = str(fixtures_root / "bert-mlm")
    texts = [t for t in source_text() if len(t.split()) > 20][:8]
    onnx.export(model, tmp_path, "onnx", 8, 16)
    encoder = onnx.OnnxSparseEncoder(tmp_path)
    for role, length in (("query", 8), ("document", 16)):
        got = Vectors.from_rows(texts, *encoder.encode(texts, role))
        cut, full = (
            Vectors.from_rows(
                texts, *encode_texts(load_sparse_encoder(model, max_length=n), texts, 8, role)
            )
            for n in (length, 256)
        )
        np.testing.assert_array_equal(got.rows.indices, cut.rows.indices)
        np.testing.assert_allclose(got.rows.values, cut.rows.values, rtol=1e-4, atol=1e-5)
        assert got.rows.values.shape != full.rows.values.shape or not np.allclose(
            got.rows.values, full.rows.values, rtol=1e-3
        )


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert export_job.main(argv) == 2
    said = error_lines(capsys)
    assert len(said) == 1 and said[0].startswith("error: "), said
    return said[0]


def test_an_unknown_target_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(
        ["--target", "lucene", "--model", "m", "--dataset", "d", "--output", str(tmp_path / "o")],
        capsys,
    )
    assert "lucene" in line
    assert not (tmp_path / "o").exists()


def test_an_unreachable_url_is_one_line_before_encoding(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("qdrant_client")
    url = f"http://127.0.0.1:{_free_loopback_port()}"
    argv = [
        "--target",
        "qdrant",
        "--url",
        url,
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--dataset",
        "sick",
    ]
    line = _refused([*argv, "--output", str(tmp_path / "o")], capsys)
    assert url in line and "unreachable" in line
    assert not (tmp_path / "o").exists()


def test_a_model_without_a_tokenizer_is_one_line_before_encoding(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("qdrant_client")
    model = tmp_path / "model"
    shutil.copytree(fixtures_root / "bert-mlm", model)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    argv = [
        "--target",
        "qdrant",
        "--model",
        str(model),
        "--dataset",
        "sick",
        "--output",
        str(tmp_path / "o"),
    ]
    line = _refused(argv, capsys)
    assert "tokenizer" in line and str(model) in line
    assert not (tmp_path / "o").exists()


def test_url_on_an_embedded_only_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("seismic")
    argv = ["--target", "seismic", "--url", "http://127.0.0.1:1", "--model", "m", "--dataset", "d"]
    assert "seismic" in _refused([*argv, "--output", str(tmp_path / "o")], capsys)


def test_the_doc_only_variant_weights_queries_by_idf(fixtures_root: Path, tmp_path: Path) -> None:
    from sembridge_ray.export import doc_only
    from sembridge_ray.sparse.encode import encode_texts, sparse_rows
    from sembridge_ray.sparse.model import load_sparse_encoder
    from sembridge_ray.testing import source_text

    model = str(fixtures_root / "bert-mlm")
    full = load_sparse_encoder(model, max_length=256)
    texts = source_text()[:300]
    weights = doc_only.idf(full.tokenizer, texts, len(full.tokenizer))
    token_sets = [set(full.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    # an oracle: df counted by hand
    for token in (full.tokenizer.convert_tokens_to_ids("man"), 100, 1500):
        df = sum(token in s for s in token_sets)
        assert weights[token] == pytest.approx(
            np.log(1 + (len(texts) - df + 0.5) / (df + 0.5)), rel=1e-6
        )
    assert weights[full.tokenizer.cls_token_id] == 0.0
    variant = doc_only.write(model, tmp_path / "m", weights, "sick", 256)
    assert json.loads((tmp_path / "m" / doc_only.CONFIG).read_text())["variant"].startswith(
        "inference-free"
    )
    terms, values = (
        a[0]
        for a in sparse_rows(variant.encode_query(["a man is playing"], convert_to_tensor=True))
    )
    asked = sorted(set(full.tokenizer("a man is playing", add_special_tokens=False)["input_ids"]))
    assert terms.tolist() == [t for t in asked if weights[t] > 0]
    np.testing.assert_allclose(values, weights[terms], rtol=1e-6)
    docs = sparse_rows(variant.encode_document(texts[:4], convert_to_tensor=True))
    want = encode_texts(full, texts[:4], 4, "document")
    for a, b in zip(docs[1], want[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_an_export_names_the_settings_it_does_not_read() -> None:
    """``--select`` picks a checkpoint's weights, and the default target (a checkpoint as a model
    directory) checks no parity: where a setting does nothing it is named in the run's warning;
    where it is read it changes the identity."""
    import dataclasses

    from sembridge_ray.recipes.export.config import ExportConfig

    by_model = ExportConfig(target="qdrant", model="m", dataset="d", output="o", select="best")
    assert set(by_model.inapplicable({"select", "max_doc_length"})) == {"select"}
    assert "select" in by_model.unread()
    by_checkpoint = dataclasses.replace(by_model, model="", checkpoint="c")
    assert by_checkpoint.inapplicable({"select"}) == {}
    fingerprints = {
        dataclasses.replace(by_checkpoint, **change).identity("export", {}).fingerprint
        for change in ({}, {"select": "last"}, {"max_doc_length": 16}, {"split": "dev"})
    }
    assert len(fingerprints) == 4
    as_model_dir = ExportConfig(checkpoint="c", output="o", max_query_length=32, split="dev")
    assert set(as_model_dir.inapplicable({"max_query_length", "split", "select"})) == {
        "max_query_length",
        "split",
    }
