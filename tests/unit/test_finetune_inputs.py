"""The fine-tuning job's config, training stream and bad-input handling: no Ray is started here."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.finetune import main
from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.data.stream import StreamInfo, materialise_stream, training_stream
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.outputs import SUCCESS


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_flags_map_onto_the_config(capsys) -> None:
    from sembridge_ray.cli import parse_config
    from sembridge_ray.recipes.finetune.config import FLAGS

    cfg, _ = parse_config(
        FinetuneConfig,
        [
            "--model",
            "m",
            "--train",
            "t",
            "--output",
            "o",
            "--workers",
            "3",
            "--gpus-per-worker",
            "0.5",
            "--batch-size",
            "48",
            "--lr",
            "3e-5",
            "--epochs",
            "2",
            "--max-steps",
            "7",
            "--lambda-q",
            "1e-4",
            "--lambda-d",
            "2e-4",
            "--checkpoint-every",
            "5",
            "--bf16",
            "off",
            "--max-query-length",
            "32",
            "--max-doc-length",
            "128",
            "seed=3",
        ],
        flags=FLAGS,
        job="finetune",
    )
    assert (cfg.resources.workers, cfg.resources.gpus_per_worker, cfg.optim.batch_size) == (
        3,
        0.5,
        48,
    )
    assert (cfg.optim.lr, cfg.optim.epochs, cfg.optim.max_steps, cfg.precision) == (
        3e-5,
        2,
        7,
        "fp32",
    )  # --bf16 off
    assert (cfg.loss.lambda_q, cfg.loss.lambda_d, cfg.checkpoint_every) == (1e-4, 2e-4, 5)
    assert (cfg.max_query_length, cfg.max_doc_length, cfg.seed) == (32, 128, 3)
    defaults = FinetuneConfig()
    assert (
        defaults.optim.lr,
        defaults.optim.batch_size,
        defaults.optim.epochs,
        defaults.optim.warmup_ratio,
    ) == (
        2e-5,
        64,
        1,
        0.1,
    )
    assert (defaults.loss.lambda_q, defaults.loss.lambda_d, defaults.loss.anti_collapse) == (
        5e-5,
        3e-5,
        0.0,
    )


def test_identity_ignores_settings_that_do_not_change_the_result() -> None:
    inputs = {"model": "sha256:m", "train": "sha256:t"}
    base = FinetuneConfig(model="m", train="t", output="a")
    same = base.with_overrides(
        [
            "output=b",
            "model=elsewhere",
            "checkpoint_every=7",
            "resources.cpus_per_worker=2",
            "storage=s3://bucket/x",
            "max_failures=9",
            "overwrite=true",
        ]
    )
    assert same.identity("finetune", inputs) == base.identity("finetune", inputs)
    changed = base.with_overrides(["optim.lr=1e-4"]).identity("finetune", inputs)
    assert changed.fingerprint != base.identity("finetune", inputs).fingerprint
    assert changed.differences(base.identity("finetune", inputs)) == ["optim.lr: 2e-05 → 0.0001"]
    # dropout streams per rank
    workers = base.with_overrides(["resources.workers=1"]).identity("finetune", inputs)
    assert workers.differences(base.identity("finetune", inputs)) == ["resources.workers: 2 → 1"]
    other_model = base.identity("finetune", inputs | {"model": "sha256:other"})
    assert other_model.differences(base.identity("finetune", inputs)) == [
        "inputs.model: sha256:m → sha256:other"
    ]


@pytest.mark.parametrize("missing", ["--model", "--train", "--output"])
def test_a_missing_required_flag_is_one_line_and_exit_2(capsys, missing: str) -> None:
    argv = {"--model": "m", "--train": "t", "--output": "o"}
    argv.pop(missing)
    code, line = _run(capsys, *[x for kv in argv.items() for x in kv])
    assert code == 2 and line == f"error: {missing} is required"


def test_a_missing_model_names_it(capsys, tmp_path: Path, sick_beir: Path) -> None:
    code, line = _run(
        capsys,
        "--model",
        str(tmp_path / "nope"),
        "--train",
        str(sick_beir),
        "--output",
        str(tmp_path / "out"),
    )
    assert code == 2 and "nope" in line and "not found" in line
    assert not (tmp_path / "out" / SUCCESS).exists()


def test_missing_data_names_it(capsys, tmp_path: Path, fixtures_root: Path) -> None:
    code, line = _run(
        capsys,
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(tmp_path / "absent"),
        "--output",
        str(tmp_path / "out"),
    )
    assert code == 2 and "absent" in line and line.startswith("error: dataset")
    assert not (tmp_path / "out" / SUCCESS).exists()


def test_an_empty_training_set_names_it(capsys, tmp_path: Path, fixtures_root: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(
        pa.table({QUERY: pa.array([], pa.string()), POSITIVE: pa.array([], pa.string())}), empty
    )
    code, line = _run(
        capsys,
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(empty),
        "--output",
        str(tmp_path / "out"),
    )
    assert code == 2 and line == f"error: training set {str(empty)!r} (train) is empty"
    assert not (tmp_path / "out").exists()  # a failed first run leaves nothing behind


def test_fewer_pairs_than_one_batch_is_an_error(tmp_path: Path, sick_beir: Path) -> None:
    with pytest.raises(InputError, match="fewer than one global batch of 4096"):
        materialise_stream(
            StreamInfo(
                spec=str(sick_beir),
                split="train",
                hard_negatives=0,
                batch_size=4096,
                epochs=1,
                max_steps=None,
                seed=0,
            ),
            tmp_path,
        )


def _beir_with_unknown_ids(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": "", "text": f"document {i}"} for i in range(4)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(4)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    rows = [
        "query-id\tcorpus-id\tscore",
        "q0\td0\t1",
        "q1\td1\t1",
        "q2\td2\t1",
        "q3\tghost-doc\t1",
        "ghost-query\td3\t1",
    ]
    (root / "qrels" / "train.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_qrels_naming_unknown_docs_or_queries_are_counted_warnings(tmp_path: Path, caplog) -> None:
    beir = _beir_with_unknown_ids(tmp_path / "beir")
    with caplog.at_level(logging.WARNING):
        _, info = materialise_stream(
            StreamInfo(
                spec=str(beir),
                split="train",
                hard_negatives=0,
                batch_size=2,
                epochs=1,
                max_steps=None,
                seed=0,
            ),
            tmp_path / "data",
        )
    assert (info.pairs, info.unknown_docs, info.unknown_queries, info.total_steps) == (3, 1, 1, 1)
    assert "1 qrels queries not in the topics, 1 positives not in the corpus" in caplog.text


def test_the_stream_is_seeded_whole_batches_per_epoch_and_reused(
    tmp_path: Path, sick_beir: Path
) -> None:
    pairs = pa.table({QUERY: [f"q{i}" for i in range(10)], POSITIVE: [f"d{i}" for i in range(10)]})
    stream = training_stream(pairs, batch_size=4, steps=5, seed=1)
    assert stream.num_rows == 20
    first, second = stream.column(QUERY).to_pylist()[:8], stream.column(QUERY).to_pylist()[8:16]
    assert len(set(first)) == 8 and len(set(second)) == 8 and first != second  # epoch 2 reshuffles
    assert training_stream(pairs, 4, 5, seed=1).equals(stream)
    request = StreamInfo(
        spec=str(sick_beir),
        split="train",
        hard_negatives=0,
        batch_size=8,
        epochs=2,
        max_steps=5,
        seed=0,
    )
    path, info = materialise_stream(request, tmp_path)
    stamp = path.stat().st_mtime_ns
    assert info.total_steps == 5 and pq.read_metadata(path).num_rows == 40
    assert materialise_stream(request, tmp_path)[0].stat().st_mtime_ns == stamp


def test_a_dense_model_is_refused_by_finetune_and_init(
    capsys, tmp_path: Path, fixtures_root: Path
) -> None:
    """A dense sentence-transformers BERT has no MLM head: fine-tuning or transplanting it would
    train a random one."""
    from jobs import init_embeddings

    dense = str(fixtures_root / "bridge")
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({QUERY: ["a", "b"], POSITIVE: ["c", "d"]}), pairs)
    code, line = _run(
        capsys, "--model", dense, "--train", str(pairs), "--output", str(tmp_path / "ft")
    )
    assert (
        code == 2
        and line.startswith(f"error: model {dense!r} is not a sparse encoder")
        and "dense" in line
    )
    code = init_embeddings.main(
        [
            "--model",
            dense,
            "--target-tokenizer",
            str(fixtures_root / "tok-wordpiece"),
            "--bridge-model",
            dense,
            "--output",
            str(tmp_path / "init"),
        ]
    )
    err = [x for x in capsys.readouterr().err.strip().splitlines() if x.startswith("error:")]
    assert (
        code == 2
        and len(err) == 1
        and "is not a sparse encoder" in err[0]
        and "no masked-LM head" in err[0]
    )
    assert not (tmp_path / "ft").exists() and not (tmp_path / "init").exists()


def _batches(stream: pa.Table, size: int) -> list[list[dict[str, str]]]:
    rows = stream.to_pylist()
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def test_no_duplicates_batches_hold_no_text_twice_and_cover_each_epoch_once() -> None:
    """Queries and positives repeat (as in SICK: 1,885 pairs, 1,588 distinct queries): no global
    batch holds a text twice, in any column; each epoch still uses every pair at most once and is
    seeded."""
    rng = np.random.default_rng(3)
    n, size = 400, 16
    pairs = pa.table(
        {
            QUERY: [f"q{rng.integers(0, 600)}" for _ in range(n)],
            POSITIVE: [f"p{rng.integers(0, 700)}" for _ in range(n)],
            "pair_id": [str(i) for i in range(n)],
        }
    )
    steps_per_epoch = n // size
    stream = training_stream(pairs, size, 2 * steps_per_epoch, seed=5)
    plain = training_stream(pairs, size, 2 * steps_per_epoch, seed=5, batch_sampler="batch_sampler")
    assert stream.num_rows == plain.num_rows == 2 * steps_per_epoch * size
    for batch in _batches(stream, size):
        texts = [r[QUERY] for r in batch] + [r[POSITIVE] for r in batch]
        assert len(set(texts)) == len(texts), batch
    dup = sum(
        len({r[QUERY] for r in b}) < size or len({r[POSITIVE] for r in b}) < size
        for b in _batches(plain, size)
    )
    assert dup > 0  # the plain shuffle does put a query or positive twice in some batch of this set
    # within an epoch a pair is drawn once (the sampler's own redraws aside: none here)
    for epoch in range(2):
        ids = stream.column("pair_id").to_pylist()[
            epoch * steps_per_epoch * size : (epoch + 1) * steps_per_epoch * size
        ]
        assert len(set(ids)) == len(ids)
    assert training_stream(pairs, size, 2 * steps_per_epoch, seed=5).equals(stream)
    assert not training_stream(pairs, size, 2 * steps_per_epoch, seed=6).equals(stream)


def test_the_plain_sampler_keeps_the_order_streams_had_before() -> None:
    """``batch_sampler`` is the seeded permutation per epoch, cut to whole batches (hand-built
    here)."""
    pairs = pa.table({QUERY: [f"q{i}" for i in range(10)], POSITIVE: [f"d{i}" for i in range(10)]})
    stream = training_stream(pairs, 4, 5, seed=1, batch_sampler="batch_sampler")
    expected = [
        int(i) for e in range(3) for i in np.random.default_rng([1, e]).permutation(10)[:8]
    ][:20]
    assert stream.column(QUERY).to_pylist() == [f"q{i}" for i in expected]


def test_export_refuses_a_checkpoint_that_does_not_verify_and_an_existing_output(
    capsys, tmp_path: Path
) -> None:
    from jobs import export

    missing = tmp_path / "step_00000004"
    assert export.main(["--checkpoint", str(missing), "--output", str(tmp_path / "m")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"error: checkpoint {str(missing)!r} does not verify")
    )
    assert export.main(["--output", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: --checkpoint is required"


def test_select_best_needs_a_development_set(capsys, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({QUERY: ["a", "b"], POSITIVE: ["c", "d"]}), pairs)
    code, line = _run(
        capsys,
        "--model",
        "m",
        "--train",
        str(pairs),
        "--output",
        str(tmp_path / "o"),
        "--select",
        "best",
    )
    assert code == 2 and line == "error: --select best needs a development set: --eval DATASET"
    code, line = _run(
        capsys,
        "--model",
        "m",
        "--train",
        str(pairs),
        "--output",
        str(tmp_path / "o"),
        "eval_split=test",
    )
    assert code == 2 and "eval_split='test': is a test split" in line
