"""The reproduction driver on the paper preset's code path, with local stand-ins for the hub:
fixture paths for the source model, bridge and target tokenizer, and a MIRACL mirror built from real
SICK pairs. Two cells run as concurrent Ray tasks; one of them fails and must not stop the other.
Fine-tuning is scored on a development set (``finetune.eval``: SICK trial), and so is the source
model, once."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from jobs import reproduce
from sembridge_ray.data.retrieval import read_qrels
from tests.conftest import error_lines


def miracl_mirror(sick_beir: Path, root: Path, lang: str = "ko") -> Path:
    """MIRACL's mirror layout (topics/qrels TSV per split, gzipped JSONL corpus) from a BEIR
    directory."""
    base = root / lang
    (base / "corpus").mkdir(parents=True)
    queries = {}
    for line in (sick_beir / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        queries[row["_id"]] = row["text"]
    for beir_split, split in (("train", "train"), ("test", "dev")):
        qrels = read_qrels(sick_beir / "qrels" / f"{beir_split}.tsv")
        topics = "".join(f"{q}\t{queries[q]}\n" for q in sorted(qrels))
        (base / f"topics.miracl-v1.0-{lang}-{split}.tsv").write_text(topics, encoding="utf-8")
        judged = "".join(
            f"{q} Q0 {d} {g}\n" for q in sorted(qrels) for d, g in sorted(qrels[q].items())
        )
        (base / f"qrels.miracl-v1.0-{lang}-{split}.tsv").write_text(judged, encoding="utf-8")
    with gzip.open(base / "corpus" / "docs-0.jsonl.gz", "wt", encoding="utf-8") as fh:
        for line in (sick_beir / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            fh.write(json.dumps({"docid": row["_id"], "title": "", "text": row["text"]}) + "\n")
    return root


@pytest.mark.slow  # about 1.5 min (a grid run twice): CI's slow step
def test_paper_path_runs_cells_concurrently_records_failures_and_resumes(
    ray_cluster, fixtures_root, sick_beir, tmp_path, capsys
) -> None:
    out = tmp_path / "paper"
    good, missing = str(fixtures_root / "bert-mlm"), str(tmp_path / "no-such-model")
    args = [
        "--preset",
        "paper",
        "--output",
        str(out),
        "--model",
        f"{good},{missing}",
        "--languages",
        "ko",
        "--datasets",
        "miracl",
        "--methods",
        "sembridge",
        "--alphas",
        "4",
        "--max-concurrent",
        "2",
        f"miracl_mirror={miracl_mirror(sick_beir, tmp_path / 'mirror')}",
        f"target_tokenizers=ko={fixtures_root / 'tok-wordpiece'}",
        f"init.bridge_model={fixtures_root / 'bridge'}",
        "init.resources.workers=1",
        "evaluate.resources.workers=1",
        "evaluate.doc_max_active_dims=64",
        "finetune.resources.workers=1",
        "finetune.optim.batch_size=8",
        "finetune.optim.max_steps=2",
        "finetune.max_query_length=32",
        "finetune.max_doc_length=64",
        "finetune.log_every=1",
        f"finetune.eval={sick_beir}",  # its dev split: SICK trial, never trained on
        "finetune.eval_every=1",
    ]
    assert reproduce.main(args) == 3  # one cell failed
    captured = capsys.readouterr()
    assert "# Results (nDCG@10)" in captured.out
    summary = json.loads((out / "failures.json").read_text(encoding="utf-8"))
    failed = [name for name in summary if "no-such-model" in name]
    assert len(failed) == 1 and "no-such-model" in summary[failed[0]]
    assert [line for line in captured.err.splitlines() if line.startswith("error: cell ")] == [
        f"error: cell {failed[0]} failed: {summary[failed[0]].splitlines()[0]}"
    ]
    assert (out / "cells" / failed[0] / "error.txt").is_file()

    found = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    # the model's rows, BM25 beside each stage and the model's fusion with it
    assert {(r["method"], r["alpha"], r["stage"], r["dataset"], r["language"]) for r in found} == {
        (method, alpha, stage, "miracl", "ko")
        for stage in ("zero_shot", "finetuned")
        for method, alpha in (("sembridge", "4"), ("sembridge+bm25", "4"), ("bm25", ""))
    }
    rows = [r for r in found if r["method"] == "sembridge"]
    for row in rows:  # the table is the evaluation job's own metrics.json
        metrics = json.loads(
            (out / "cells" / row["cell"] / "miracl" / row["stage"] / "metrics.json").read_text()
        )
        assert float(row["ndcg@10"]) == metrics["nDCG@10"] and 0.0 <= metrics["nDCG@10"] <= 1.0
    tuned = next(r for r in rows if r["stage"] == "finetuned")
    assert tuned["train_steps"] == "2"
    summary = json.loads(
        (out / "cells" / tuned["cell"] / "miracl" / "finetune" / "finetune.json").read_text()
    )
    figures = summary["convergence"]
    assert figures["evaluations"] == 3  # steps 0, 1 and 2
    assert (
        float(tuned["dev_final"]) == figures["final"] and float(tuned["dev_auc"]) == figures["auc"]
    )
    # select: last
    assert int(tuned["steps_to_95"]) == figures["steps_to_95"] and tuned["best_step"] == ""
    assert next(r for r in rows if r["stage"] == "zero_shot")["dev_final"] == ""
    source_dev = json.loads((out / "sources" / "bert-mlm" / "dev" / "metrics.json").read_text())
    assert 0.0 <= source_dev["nDCG@10"] <= 1.0
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "## miracl — zero-shot" in table and "## Failed cells" in table and failed[0] in table
    assert {p.name for p in (out / "plots").glob("*.png")} >= {
        "learning_bert-mlm_ko_miracl.png",
        "support_sizes.png",
        "convergence.png",
    }

    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/miracl/*/metrics.json")}
    # rerun: finished stages are skipped, the failing cell is retried
    assert reproduce.main(args) == 3
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    changed = [*args, "finetune.optim.lr=2e-4"]
    capsys.readouterr()
    assert reproduce.main(changed) == 2  # checked before any work: the changed stages are listed
    err = error_lines(capsys)
    good_cell = next(p.name for p in (out / "cells").iterdir() if "no-such-model" not in p.name)
    assert len(err) == 1 and f"{good_cell}/miracl/finetune (optim.lr: 2e-05 → 0.0002)" in err[0]
    assert f"{good_cell}/miracl/finetuned (inputs.model" in err[0] and "--overwrite" in err[0]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert reproduce.main([*changed, "--overwrite"]) == 3
    zero_shot = out / "cells" / good_cell / "miracl" / "zero_shot" / "metrics.json"
    assert zero_shot.stat().st_mtime_ns == stamps[zero_shot]  # unchanged stages are still skipped
    tuned = out / "cells" / good_cell / "miracl" / "finetune" / "config.yaml"
    assert "lr: 0.0002" in tuned.read_text()
