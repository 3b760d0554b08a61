"""``python -m jobs.export --target qdrant`` end to end on the module's Ray cluster: a tiny
transferred model (an init output) over SICK sentences, encoded through the evaluate job's encoding,
into an embedded Qdrant that reopens and answers as the exact search does; its parity is on the
model's card when it is published, and the model's own output is not written to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs import export
from sembridge_ray.distributed import cluster
from sembridge_ray.export.base import Vectors
from sembridge_ray.export.parity import exact_topk, parity
from sembridge_ray.model_card import CARD, render
from sembridge_ray.provenance import read_provenance
from sembridge_ray.publish import scores_of
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.retrieval.store import parquet_files, read_vectors
from sembridge_ray.runtime.identity import path_identity
from sembridge_ray.runtime.manifest import is_complete, output_fingerprint
from tests.conftest import error_lines


def test_export_to_embedded_qdrant(
    ray_cluster: cluster.ClusterInfo, fixtures_root: Path, tmp_path: Path
) -> None:
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient, models

    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.resources import sick_dir

    # the untrained model is dense
    sick_beir = write_sick_beir(sick_dir(), tmp_path / "sick", limit=80, splits=("test",))

    # a finished model of this project (an init output), whose published card shows the parity
    init_out = tmp_path / "init"
    initialise(
        InitConfig(
            source_model=str(fixtures_root / "bert-mlm"),
            target_tokenizer=str(fixtures_root / "tok-bytebpe"),
            bridge_model=str(fixtures_root / "bridge"),
            output=str(init_out),
            cache_dir=str(tmp_path / "init-cache"),
            samples=2,
        )
    )
    model, identity = init_out / "model", output_fingerprint(init_out / "model")
    card = (model / CARD).read_bytes()
    out = tmp_path / "qdrant-export"
    argv = [
        "--target",
        "qdrant",
        "--model",
        str(model),
        "--dataset",
        str(sick_beir),
        "--output",
        str(out),
    ]
    assert export.main([*argv, "--workers", "1"]) == 0
    report = json.loads((out / "export_report.json").read_text())
    assert {
        "target",
        "documents",
        "seconds",
        "overlap@10",
        "ndcg@10_exact",
        "ndcg@10_target",
    } <= set(report)
    assert report["target"] == "qdrant" and report["passed"] is True
    assert report["overlap@10"] == 1.0 and report["identical_up_to_ties"] == 1.0
    assert report["ndcg@10_target"] == pytest.approx(report["ndcg@10_exact"])
    # the parity is on the card the model is published with; its output is as it was
    (recorded,) = scores_of(path_identity(model), "", [str(out)]).exports
    assert recorded["target"] == "qdrant" and recorded["overlap10"] == 1.0 and recorded["passed"]
    assert recorded["ndcg10_target"] == report["ndcg@10_target"]
    assert "| `qdrant` |" in render(read_provenance(model), exports=[recorded])
    assert (model / CARD).read_bytes() == card
    assert is_complete(init_out) and output_fingerprint(model) == identity
    # the vectors the job encoded (its cache), searched by a fresh client on the written collection
    cache = out / "cache"
    docs = Vectors(*read_vectors(parquet_files(next(cache.glob("docs-*")) / "vectors")))
    queries = Vectors(*read_vectors(parquet_files(next(cache.glob("queries-*")) / "vectors")))
    assert report["documents"] == len(docs) and report["postings"] == docs.postings
    client = QdrantClient(path=str(out / "qdrant"))
    terms, weights = queries.row(0)
    found = client.query_points(
        "sembridge",
        query=models.SparseVector(indices=terms.tolist(), values=weights.tolist()),
        using="sparse",
        limit=10,
    )
    client.close()
    assert is_complete(out)  # searching the store changed none of its checksummed files
    first = Vectors(queries.ids[:1], queries.rows.slice(0, 1))
    checked = parity(docs, first, [[(p.payload or {})["doc_id"] for p in found.points]])
    assert checked.identical_up_to_ties == 1.0 and len(exact_topk(docs, first)[0]) == 10


def test_export_the_doc_only_variant(
    ray_cluster: cluster.ClusterInfo, fixtures_root: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SparseEncoder

    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.resources import sick_dir

    sick_beir = write_sick_beir(sick_dir(), tmp_path / "sick", limit=80, splits=("test",))
    out = tmp_path / "doc-only"
    argv = [
        "--target",
        "doc-only",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--dataset",
        str(sick_beir),
    ]
    assert export.main([*argv, "--output", str(out), "--workers", "1"]) == 0
    report = json.loads((out / "export_report.json").read_text())
    assert report["target"] == "doc-only" and report["passed"] is True
    assert report["ndcg@10_target"] is not None and report["ndcg@10_exact"] is not None
    model = SparseEncoder(str(out / "model-doc-only"), device="cpu")
    assert model.encode_query(["a man"], convert_to_tensor=True).coalesce().values().numel() >= 1


def test_a_model_replaced_during_the_export_stops_it_before_the_report(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The model is edited after it was encoded (as an --overwrite of it would): one line, exit 2,
    and no report of vectors that are no longer the model's."""
    import shutil

    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.export.lucene import FilesTarget
    from sembridge_ray.resources import sick_dir

    sick_beir = write_sick_beir(sick_dir(), tmp_path / "sick", limit=40, splits=("test",))
    model = tmp_path / "model"
    shutil.copytree(fixtures_root / "bert-mlm", model)
    build = FilesTarget.export

    def edit_then_build(*args: object, **kwargs: object) -> object:
        with (model / "config.json").open("a", encoding="utf-8") as f:
            f.write("\n")
        return build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(FilesTarget, "export", edit_then_build)
    out = tmp_path / "out"
    argv = ["--target", "opensearch", "--model", str(model), "--dataset", str(sick_beir)]
    assert export.main([*argv, "--output", str(out), "--workers", "1"]) == 2
    (line,) = error_lines(capsys)
    assert "input model" in line and "changed while this run was reading it" in line
    assert not (out / "export_report.json").exists()


def test_a_target_export_follows_the_output_contract(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As every job's output: a target outside its tolerance is not marked complete and is done
    again by the next run; a finished export is skipped; other settings are refused (the output left
    as it was) unless --overwrite, which replaces it complete."""
    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.export.base import Tolerance
    from sembridge_ray.resources import sick_dir
    from sembridge_ray.runtime.manifest import SUCCESS

    sick_beir = write_sick_beir(sick_dir(), tmp_path / "sick", limit=40, splits=("test",))
    out = tmp_path / "out"
    argv = ["--target", "opensearch", "--model", str(fixtures_root / "bert-mlm")]
    argv += ["--dataset", str(sick_beir), "--output", str(out), "--workers", "1"]

    def report() -> dict[str, object]:
        return dict(json.loads((out / "export_report.json").read_text(encoding="utf-8")))

    with monkeypatch.context() as patched:  # the target loses more than its tolerance
        patched.setattr(Tolerance, "passes", lambda tolerance, report: False)
        assert export.main(argv) == 2
    assert "lost more than its tolerance" in error_lines(capsys)[-1]
    assert report()["passed"] is False and not (out / SUCCESS).exists()

    assert export.main(argv) == 0  # done again
    first = report()
    assert first["passed"] is True and is_complete(out)
    assert "skipped" not in capsys.readouterr().out
    assert export.main(argv) == 0 and "skipped" in capsys.readouterr().out
    assert report() == first

    shorter = [*argv, "--max-doc-length", "4"]
    assert export.main(shorter) == 2
    (line,) = error_lines(capsys)
    assert "max_doc_length" in line and "--overwrite" in line
    assert report() == first and is_complete(out)

    assert export.main([*shorter, "--overwrite"]) == 0
    replaced = report()
    assert replaced["passed"] is True and is_complete(out)
    assert replaced["postings"] < first["postings"]  # type: ignore[operator]
    assert not any(p.name.startswith("out.overwrite") for p in tmp_path.iterdir())
