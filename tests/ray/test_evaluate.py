"""jobs.evaluate end to end on Ray: the tiny bert-mlm fixture over real SICK sentences in a BEIR
directory."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytrec_eval
import ray.data
import torch

from jobs import evaluate
from sembridge_ray.data.retrieval import load_beir
from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed import executor as executor_module
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.evaluate.run import run_evaluate
from sembridge_ray.retrieval.encode import encode
from sembridge_ray.retrieval.store import parquet_files, read_run, read_vectors, stage_corpus
from sembridge_ray.runtime.executor import LocalExecutor
from sembridge_ray.runtime.outputs import SUCCESS, is_complete
from sembridge_ray.runtime.placement import Placement, ResourceConfig
from sembridge_ray.sparse.encode import sparse_rows
from sembridge_ray.sparse.model import load_sparse_encoder
from tests.unit.test_outputs import snapshot


@pytest.fixture(scope="module")
def dataset(sick_beir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SICK as BEIR, plus judgements naming two documents the corpus lacks and a query that has no
    text."""
    root = tmp_path_factory.mktemp("eval") / "sick"
    shutil.copytree(sick_beir, root)
    with open(root / "qrels" / "test.tsv", "a", encoding="utf-8") as fh:
        fh.write("q0\tnot-a-doc\t1\nq1\talso-missing\t0\nq-no-text\td0\t2\n")
    return root


@pytest.fixture(scope="module")
def first_run(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    dataset: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[EvaluateConfig, dict]:
    """Through Ray's actors (encoder pools, shard actors), however small the fixture
    (``IN_DRIVER_ROWS`` 0)."""
    out = tmp_path_factory.mktemp("eval-out")
    cfg = EvaluateConfig(
        model=str(fixtures_root / "bert-mlm"),
        dataset=str(dataset),
        output=str(out / "run1"),
        shard_size=90,
        cache_dir=str(out / "cache"),
        query_batch_size=16,
        resources=ResourceConfig(workers=2),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cluster, "IN_DRIVER_ROWS", 0)
        return cfg, run_evaluate(cfg, executor=RayExecutor()).metrics


def brute_force_scores(model_dir: Path, dataset: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Exact float64 scores of every query against every document, encoded in-process by the same
    encoder."""
    data = load_beir(dataset, "test")
    qids = sorted(q for q in data.qrels if q in data.queries)
    corpus = pa.concat_tables(list(data.corpus.batches(1000)))
    query_enc = load_sparse_encoder(str(model_dir), max_length=64)
    doc_enc = load_sparse_encoder(str(model_dir), max_length=256)
    q = (
        query_enc.encode_query([data.queries[i] for i in qids], convert_to_tensor=True)
        .to_dense()
        .double()
    )
    d = (
        doc_enc.encode_document(corpus.column(TEXT).to_pylist(), convert_to_tensor=True)
        .to_dense()
        .double()
    )
    return qids, corpus.column(ID).to_pylist(), (q @ d.T).numpy()


def test_outputs_and_metric_keys(first_run: tuple[EvaluateConfig, dict]) -> None:
    cfg, metrics = first_run
    out = Path(cfg.output)
    assert {p.name for p in out.iterdir()} >= {"run.trec", "metrics.json", "config.yaml", SUCCESS}
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert {
        "nDCG@10",
        "R@100",
        "RR@10",
        "num_queries",
        "mean_active_dims_query",
        "mean_active_dims_doc",
        "flops_per_pair",
    } <= set(metrics)
    assert metrics["shards"] >= 4 and metrics["cache"] == {"docs": False, "queries": False}
    assert metrics["unknown_qrels_docs"] == 2 and metrics["unknown_qrels_relevant"] == 1
    assert metrics["queries_without_text"] == 1
    assert 0 < metrics["nDCG@10"] < 1 and metrics["flops_per_pair"] > 0
    assert all(len(line.split()) == 6 for line in (out / "run.trec").read_text().splitlines())


def test_ndcg_equals_trec_eval_on_its_own_run_over_all_qrels_queries(
    first_run: tuple[EvaluateConfig, dict], dataset: Path
) -> None:
    cfg, metrics = first_run
    qrels = load_beir(dataset, "test").qrels
    run = read_run(Path(cfg.output) / "run.trec")
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    for measure, key in (("nDCG@10", "ndcg_cut_10"), ("R@100", "recall_100")):
        expected = sum(per_query.get(q, {}).get(key, 0.0) for q in qrels) / len(qrels)
        assert metrics[measure] == pytest.approx(expected, abs=1e-12)
    assert metrics["num_queries"] == len(qrels)


def test_top10_equals_brute_force_up_to_ties(
    first_run: tuple[EvaluateConfig, dict], fixtures_root: Path, dataset: Path
) -> None:
    cfg, _ = first_run
    run = read_run(Path(cfg.output) / "run.trec")
    qids, doc_ids, scores = brute_force_scores(fixtures_root / "bert-mlm", dataset)
    for qid, row in zip(qids, scores, strict=True):
        got = sorted(run.get(qid, {}).items(), key=lambda x: (-x[1], x[0]))[:10]
        best = np.sort(row[row > 0])[::-1][:10]
        np.testing.assert_allclose([s for _, s in got], best, rtol=1e-5, atol=1e-6)
        if len(best) == 0:
            continue
        tol = 1e-5 * best[-1]  # documents clearly above the 10th score must all be there
        must = {doc_ids[i] for i in np.flatnonzero(row > best[-1] + tol)}
        assert must <= {d for d, _ in got}
        assert all(abs(s - row[doc_ids.index(d)]) <= 1e-5 * max(1.0, s) for d, s in got)


def test_rerun_skips_and_rescoring_reuses_the_cache(first_run: tuple[EvaluateConfig, dict]) -> None:
    cfg, metrics = first_run
    stamp = (Path(cfg.output) / SUCCESS).stat().st_mtime_ns
    again = run_evaluate(cfg, executor=RayExecutor())
    assert again.skipped and again.metrics == metrics
    assert (Path(cfg.output) / SUCCESS).stat().st_mtime_ns == stamp
    other = EvaluateConfig.from_dict(
        cfg.to_dict() | {"output": cfg.output + "-k20", "top_k": 20, "shard_size": 0}
    )
    rescored = run_evaluate(other, executor=RayExecutor()).metrics
    assert rescored["cache"] == {"docs": True, "queries": True}
    # top-20 holds the top-10
    assert rescored["nDCG@10"] == pytest.approx(metrics["nDCG@10"], abs=1e-12)


def _artefacts(out: Path) -> dict[str, object]:
    """What a run produced, minus what may differ between runs (timings, cache hits, actor memory,
    paths)."""
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("seconds", "cache", "actors", "shards"):
        metrics.pop(key)
    return {
        "run.trec": (out / "run.trec").read_bytes(),
        "per_query.tsv": (out / "per_query.tsv").read_bytes(),
        "metrics": metrics,
        "identity.json": (out / "identity.json").read_bytes(),
    }


def test_reruns_other_settings_overwrite_copies_and_determinism(
    first_run: tuple[EvaluateConfig, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, _ = first_run
    out = tmp_path / "copy"
    shutil.copytree(cfg.output, out)
    before = snapshot(out)
    base = [
        "--model",
        cfg.model,
        "--dataset",
        cfg.dataset,
        "--output",
        str(out),
        f"cache_dir={cfg.cache_dir}",
        "query_batch_size=16",
    ]
    assert evaluate.main(base) == 0  # a copied output is the same run: skipped
    assert snapshot(out) == before
    capsys.readouterr()

    assert evaluate.main([*base, "--top-k", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "top_k: 100 → 20" in err[0] and "--overwrite" in err[0]
    assert snapshot(out) == before

    # a fresh, independent run (new cache, other shards, one worker) gives byte-identical artefacts
    fresh = EvaluateConfig.from_dict(
        cfg.to_dict()
        | {
            "output": str(tmp_path / "fresh"),
            "shard_size": 0,
            "cache_dir": str(tmp_path / "cache2"),
        }
    )
    run_evaluate(replace(fresh, resources=ResourceConfig(workers=1)), executor=RayExecutor())
    assert _artefacts(tmp_path / "fresh") == _artefacts(Path(cfg.output))

    assert evaluate.main([*base, "--top-k", "20", "--overwrite"]) == 0
    assert json.loads((out / "metrics.json").read_text())["top_k"] == 20 and is_complete(out)


@pytest.mark.parametrize("in_driver", [False, True], ids=["actors", "driver"])
def test_encoding_through_ray_equals_in_process(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    in_driver: bool,
) -> None:
    """The encoder pool's vectors, and the driver's for an input too small for a pool, are
    sentence-transformers'."""
    monkeypatch.setattr(cluster, "IN_DRIVER_ROWS", cluster.IN_DRIVER_ROWS if in_driver else 0)
    model = str(fixtures_root / "bert-mlm")
    texts = [
        "A man is playing a guitar",
        "The kids are running in the park",
        "Nobody is riding a horse",
    ] * 3
    table = pa.table({ID: [f"t{i}" for i in range(len(texts))], TEXT: texts})
    cfg = EvaluateConfig(
        doc_max_active_dims=5,
        max_doc_length=8,
        encode_batch_size=4,
        resources=ResourceConfig(workers=2),
    )
    files = stage_corpus((table.slice(i, 4) for i in range(0, len(texts), 4)), tmp_path / "staged")
    encode(files, tmp_path / "enc", cfg.encoding(), model, "document", RayExecutor())
    ids, got = read_vectors(parquet_files(tmp_path / "enc"))
    enc = load_sparse_encoder(model, max_length=8)
    idx, val = sparse_rows(enc.encode_document(texts, convert_to_tensor=True), max_active_dims=5)
    assert pq.read_table(parquet_files(tmp_path / "enc")[0]).schema.field(
        "indices"
    ).type == pa.list_(pa.int32())
    row_of = {doc: row for row, doc in enumerate(ids)}
    for n in range(len(texts)):
        lo, hi = got.indptr[row_of[f"t{n}"]], got.indptr[row_of[f"t{n}"] + 1]
        np.testing.assert_array_equal(got.indices[lo:hi], idx[n])
        np.testing.assert_allclose(got.values[lo:hi], val[n], rtol=1e-5, atol=1e-6)
        assert len(idx[n]) == 5


def test_small_input_in_the_driver_equals_the_actors(
    first_run: tuple[EvaluateConfig, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same settings as the actors' run, but a fresh cache: a fixture this small is encoded and
    searched in the driver (no pool, no shard actor), and every artefact is the actors' byte for
    byte."""
    cfg, _ = first_run
    decided: list[bool] = []
    decide = cluster.in_driver

    def recorded(plan: Placement, rows: int) -> bool:
        decided.append(decide(plan, rows))
        return decided[-1]

    monkeypatch.setattr(cluster, "in_driver", recorded)
    monkeypatch.setattr(
        executor_module, "_RayHeld", lambda *a, **k: pytest.fail("shard actors started")
    )
    monkeypatch.setattr(
        ray.data, "from_items", lambda *a, **k: pytest.fail("an encoder pool started")
    )
    here = replace(cfg, output=str(tmp_path / "driver"), cache_dir=str(tmp_path / "cache"))
    metrics = run_evaluate(here, executor=RayExecutor()).metrics
    assert decided == [True, True]  # the documents, the queries
    assert (
        metrics["cache"] == {"docs": False, "queries": False}
        and metrics["shards"] == first_run[1]["shards"]
    )
    # run.trec, per_query.tsv, metrics
    assert _artefacts(tmp_path / "driver") == _artefacts(Path(cfg.output))


def test_the_in_process_executor_gives_the_actors_evaluation(
    first_run: tuple[EvaluateConfig, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job on :class:`LocalExecutor`: Ray is never asked (no cluster, pool or actor), and
    every artefact is the Ray run's byte for byte."""
    cfg, _ = first_run
    for name in ("connect", "placement", "require_reachable"):
        monkeypatch.setattr(cluster, name, lambda *a, **k: pytest.fail("Ray was asked"))
    monkeypatch.setattr(
        ray.data, "from_items", lambda *a, **k: pytest.fail("an encoder pool started")
    )
    here = replace(cfg, output=str(tmp_path / "here"), cache_dir=str(tmp_path / "cache"))
    metrics = run_evaluate(here, executor=LocalExecutor()).metrics
    assert metrics["cache"] == {"docs": False, "queries": False}
    assert _artefacts(tmp_path / "here") == _artefacts(Path(cfg.output))


def test_a_dataset_whose_splits_have_their_own_corpus_never_serves_one_splits_encoding_to_another(
    ray_cluster: cluster.ClusterInfo, fixtures_root: Path, tmp_path: Path
) -> None:
    """XQuAD's dev and test search the sentences of different articles: dev then test through one
    cache scores test as an evaluation of test alone does, and every judged sentence is in the
    corpus searched."""
    dev = EvaluateConfig(
        model=str(fixtures_root / "bert-splade"),
        dataset="xquad:en",
        split="dev",
        output=str(tmp_path / "dev"),
        cache_dir=str(tmp_path / "cache"),
        resources=ResourceConfig(workers=1),
    )
    test = replace(dev, split="test", output=str(tmp_path / "test"))
    alone = replace(test, output=str(tmp_path / "alone"), cache_dir=str(tmp_path / "own-cache"))
    scores = [run_evaluate(cfg, executor=RayExecutor()).metrics for cfg in (dev, test, alone)]
    assert [m["unknown_qrels_docs"] for m in scores] == [0, 0, 0]
    assert scores[1]["cache"]["docs"] is False
    assert scores[1]["nDCG@10"] == scores[2]["nDCG@10"]


def test_the_health_figures_count_the_empty_vectors_the_encoder_gives(
    first_run: tuple[EvaluateConfig, dict], fixtures_root: Path, dataset: Path, tmp_path: Path
) -> None:
    """The share of empty query and document vectors, against sentence-transformers' own encoding of
    the same texts; and a crafted model whose decoder bias silences every term: every vector empty,
    its queries flagged as collapsed."""
    from transformers import AutoModelForMaskedLM

    from sembridge_ray.sparse.convergence import query_collapse

    cfg, metrics = first_run
    data = load_beir(dataset, "test")
    qids = sorted(q for q in data.qrels if q in data.queries)
    texts = pa.concat_tables(list(data.corpus.batches(1000))).column(TEXT).to_pylist()
    model = load_sparse_encoder(str(fixtures_root / "bert-mlm"), max_length=64)
    queries = model.encode_query([data.queries[q] for q in qids], convert_to_tensor=True).to_dense()
    model = load_sparse_encoder(str(fixtures_root / "bert-mlm"), max_length=256)
    docs = model.encode_document(texts, convert_to_tensor=True).to_dense()
    empty_q = float(((queries > 0).sum(dim=1) == 0).float().mean())
    empty_d = float(((docs > 0).sum(dim=1) == 0).float().mean())
    assert metrics["empty_share_query"] == pytest.approx(empty_q)
    assert metrics["empty_share_doc"] == pytest.approx(empty_d)
    silent = tmp_path / "silent"
    shutil.copytree(fixtures_root / "bert-mlm", silent)
    mlm = AutoModelForMaskedLM.from_pretrained(str(silent))
    with torch.no_grad():
        mlm.cls.predictions.bias.fill_(-1e4)
    mlm.save_pretrained(str(silent))
    crafted = replace(
        cfg, model=str(silent), output=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache")
    )
    found = run_evaluate(crafted, executor=RayExecutor()).metrics
    assert (found["empty_share_query"], found["empty_share_doc"]) == (1.0, 1.0)
    assert found["mean_active_dims_query"] == 0 and query_collapse(0.0) is not None
