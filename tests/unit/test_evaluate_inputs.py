"""jobs.evaluate: bad input is one line naming it and exit code 2, before any Ray cluster starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.evaluate import main
from sembridge_ray.recipes import PRESET_DIR, load_preset_file
from sembridge_ray.recipes.evaluate.config import EvaluateConfig


def beir(root: Path, corpus: list[dict], queries: list[dict], qrels: str) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return root


@pytest.fixture
def model(fixtures_root: Path) -> Path:
    """A tiny sparse encoder: it passes the driver's checks; these runs fail on their data before
    Ray starts."""
    return fixtures_root / "bert-mlm"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def test_missing_model_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = beir(
        tmp_path / "d", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "x"}], "q1\td1\t1\n"
    )
    code, err = run(
        capsys,
        "--model",
        str(tmp_path / "nope"),
        "--dataset",
        str(data),
        "--output",
        str(tmp_path / "o"),
    )
    assert code == 2 and err == f"error: model {str(tmp_path / 'nope')!r} not found"


def test_empty_corpus_is_named(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = beir(tmp_path / "d", [], [{"_id": "q1", "text": "x"}], "q1\td1\t1\n")
    code, err = run(
        capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o")
    )
    assert code == 2 and "corpus" in err and "is empty" in err and str(data) in err


def test_split_without_qrels_is_named(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = beir(tmp_path / "d", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "x"}], "")
    code, err = run(
        capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o")
    )
    assert code == 2 and "split 'test' has no qrels" in err
    code, err = run(
        capsys,
        "--model",
        str(model),
        "--dataset",
        str(data),
        "--split",
        "dev",
        "--output",
        str(tmp_path / "o"),
    )
    assert code == 2 and "no qrels for split 'dev'" in err


def test_duplicate_query_id_is_an_error(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queries = [{"_id": "q1", "text": "x"}, {"_id": "q1", "text": "y"}]
    data = beir(tmp_path / "d", [{"_id": "d1", "text": "x"}], queries, "q1\td1\t1\n")
    code, err = run(
        capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o")
    )
    assert code == 2 and "query id 'q1' appears twice" in err


def test_flags_map_onto_the_config() -> None:
    from sembridge_ray.cli import parse_config
    from sembridge_ray.recipes.evaluate.config import FLAGS

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
    assert (
        cfg.top_k,
        cfg.resources.workers,
        cfg.shard_size,
        cfg.doc_max_active_dims,
        cfg.split,
    ) == (
        50,
        3,
        1000,
        128,
        "test",
    )
    smoke = load_preset_file(PRESET_DIR / "evaluate_smoke.yaml")
    assert isinstance(smoke, EvaluateConfig) and smoke.model == "minilm-splade"


def test_no_judged_query_with_text_is_refused(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an empty queries.jsonl
    data = beir(tmp_path / "d", [{"_id": "d1", "text": "x"}], [], "q1\td1\t1\n")
    code, err = run(
        capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o")
    )
    assert (
        code == 2
        and "none of the 1 queries judged in split 'test' has a text" in err
        and "\n" not in err
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["sentence-transformers", "plain"])
def test_a_dense_model_is_refused_naming_what_was_found(
    tmp_path: Path, fixtures_root: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    import shutil

    dense = tmp_path / "dense"
    # a BERT + mean-pooling sentence-transformers model
    shutil.copytree(fixtures_root / "bridge", dense)
    if kind == "plain":
        # a transformers BertModel directory: no MLM head in its weights
        (dense / "modules.json").unlink()
    data = beir(
        tmp_path / "d", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "x"}], "q1\td1\t1\n"
    )
    code, err = run(
        capsys, "--model", str(dense), "--dataset", str(data), "--output", str(tmp_path / "o")
    )
    assert code == 2 and f"model {str(dense)!r} is not a sparse encoder" in err and "\n" not in err
    assert ("dense embedding model" if kind != "plain" else "hold no masked-LM head (cls.*)") in err
    assert not (tmp_path / "o").exists()


def test_an_unreachable_ray_address_is_one_line_before_the_output_is_claimed(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from sembridge_ray.distributed import cluster

    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    # what the check waits for: its own bound, not ray.init's
    monkeypatch.setattr(cluster, "REACH_TIMEOUT_S", 0.5)
    data = beir(
        tmp_path / "d", [{"_id": "d1", "text": "x"}], [{"_id": "q1", "text": "x"}], "q1\td1\t1\n"
    )
    code, err = run(
        capsys, "--model", str(model), "--dataset", str(data), "--output", str(tmp_path / "o")
    )
    assert (
        code == 2
        and err.startswith(f"error: RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers")
        and "\n" not in err
    )
    assert "0.5 s)" in err and not cluster.ray.is_initialized() and not (tmp_path / "o").exists()


def test_ray_addresses_name_their_endpoint() -> None:
    from sembridge_ray.distributed.cluster import address_endpoint

    assert address_endpoint("10.0.0.5:6380") == ("10.0.0.5", 6380)
    assert address_endpoint("ray://head:10001") == ("head", 10001)
    assert address_endpoint("http://127.0.0.1:8265") == ("127.0.0.1", 8265)
    assert address_endpoint("head") == ("head", 6379)
    assert address_endpoint("[::1]:6379") == ("::1", 6379)
