"""jobs.evaluate: bad input is one line naming it and exit code 2, before any Ray cluster starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.evaluate import main
from sembridge_ray.jobs import PRESET_DIR, load_preset_file
from sembridge_ray.jobs.evaluate import EvaluateConfig


def beir(root: Path, corpus: list[dict], queries: list[dict], qrels: str) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return root


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """Enough of a model directory to pass the driver's check; these runs fail before anything loads it."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path / "model"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def test_missing_model_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = beir(tmp_path / "d", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "x"}], "q1\td1\t1\n")
    code, err = run(capsys, "--model", str(tmp_path / "nope"), "--dataset", str(data), "--output", str(tmp_path / "o"))
    assert code == 2 and err == f"error: model {str(tmp_path / 'nope')!r} not found"


def test_empty_corpus_is_named(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = beir(tmp_path / "d", [], [{"_id": "q1", "text": "x"}], "q1\td1\t1\n")
    code, err = run(capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o"))
    assert code == 2 and "corpus" in err and "is empty" in err and str(data) in err


def test_split_without_qrels_is_named(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = beir(tmp_path / "d", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "x"}], "")
    code, err = run(capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o"))
    assert code == 2 and "split 'test' has no qrels" in err
    code, err = run(
        capsys, "--model", str(model), "--dataset", str(data), "--split", "dev", "--output", str(tmp_path / "o")
    )
    assert code == 2 and "no qrels for split 'dev'" in err


def test_duplicate_query_id_is_an_error(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    queries = [{"_id": "q1", "text": "x"}, {"_id": "q1", "text": "y"}]
    data = beir(tmp_path / "d", [{"_id": "d1", "text": "x"}], queries, "q1\td1\t1\n")
    code, err = run(capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o"))
    assert code == 2 and "query id 'q1' appears twice" in err


def test_flags_map_onto_the_config() -> None:
    from sembridge_ray.cli import parse_config
    from sembridge_ray.jobs.evaluate import FLAGS

    cfg, _ = parse_config(
        EvaluateConfig,
        [
            "--model",
            "m",
            "--dataset",
            "miracl:ar",
            "--output",
            "o",
            "--top-k",
            "50",
            "--workers",
            "3",
            "--shard-size",
            "1000",
            "--doc-top-k",
            "128",
        ],
        flags=FLAGS,
        job="evaluate",
    )
    assert (cfg.top_k, cfg.resources.workers, cfg.shard_size, cfg.doc_top_k, cfg.split) == (50, 3, 1000, 128, "test")
    assert load_preset_file(PRESET_DIR / "evaluate_smoke.yaml").model == "minilm-splade"
