"""The MaLSTM smoke preset end to end through Ray (one local 2-CPU cluster)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from jobs import malstm as job
from sembridge_ray.data.schema import CALIBRATED, GOLD, PAIR_ID, RAW
from sembridge_ray.distributed import cluster
from sembridge_ray.runtime.outputs import is_complete
from sembridge_ray.siamese.calibration import fit_calibrator
from sembridge_ray.siamese.report import metrics, read_tsv
from tests.unit.test_outputs import snapshot


@pytest.fixture(scope="module")
def smoke_run(ray_cluster: cluster.ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("malstm") / "out"
    cache = tmp_path_factory.mktemp("vectors")
    # the bundled thesaurus keeps the run independent of whether nltk finds WordNet here
    assert (
        job.main(
            [
                "--preset",
                "smoke",
                "--output",
                str(out),
                f"vectors.cache_dir={cache}",
                "augment.thesaurus=bundled",
            ]
        )
        == 0
    )
    return out


def test_smoke_run_writes_every_artefact_and_success_last(smoke_run: Path) -> None:
    names = {p.name for p in smoke_run.iterdir()}
    assert {
        "report.json",
        "report.md",
        "predictions.tsv",
        "val_predictions.tsv",
        "calibration.png",
        "scatter.png",
        "config.yaml",
        "_SUCCESS",
    } <= names
    manifest = json.loads((smoke_run / "_SUCCESS").read_text())
    assert set(manifest["files"]) == names - {"_SUCCESS"}
    assert is_complete(smoke_run)
    assert yaml.safe_load((smoke_run / "config.yaml").read_text())["limit_train"] == 500


def test_report_recomputes_exactly_from_the_prediction_files(smoke_run: Path) -> None:
    report = json.loads((smoke_run / "report.json").read_text())
    ids, test = read_tsv(smoke_run / "predictions.tsv")
    assert (smoke_run / "predictions.tsv").read_text().splitlines()[0].split("\t") == [
        PAIR_ID,
        GOLD,
        RAW,
        CALIBRATED,
    ]
    assert len(ids) == len(set(ids)) == 4927
    assert report["test"] == {
        RAW: metrics(test[RAW], test[GOLD]),
        CALIBRATED: metrics(test[CALIBRATED], test[GOLD]),
    }
    assert test[CALIBRATED].min() >= 1 and test[CALIBRATED].max() <= 5
    val_ids, val = read_tsv(smoke_run / "val_predictions.tsv")
    assert set(val) == {GOLD, RAW} and len(val_ids) == report["data"]["sick_validation"] == 150
    assert report["validation"][RAW] == metrics(val[RAW], val[GOLD])


def test_report_keys_follow_the_contract(smoke_run: Path) -> None:
    report = json.loads((smoke_run / "report.json").read_text())
    for split in ("test", "validation"):
        assert set(report[split]) == {RAW, CALIBRATED}
        assert all(set(m) == {"pearson", "spearman", "mse"} for m in report[split].values())
    assert {"bandwidth", "loo_mse", "n"} <= set(report["calibration"]) and report["calibration"][
        "n"
    ] == 150
    assert {
        "sick_train",
        "sick_validation",
        "augmented",
        "pretrain_train",
        "removed_by_leak_guard",
        "oov_rate",
    } <= set(report["data"])
    assert [s["seed"] for s in report["seeds"]] == [0, 1]
    assert report["best_seed"] == min(report["seeds"], key=lambda s: s["val_mse"])["seed"]
    assert report["paper"]["MaLSTM"] == {"pearson": 0.8822, "spearman": 0.8345, "mse": 0.2286}
    assert "| MaLSTM (paper) | .8822 | .8345 | .2286 |" in (smoke_run / "report.md").read_text()


def test_calibration_bandwidth_is_no_worse_than_statsmodels_cv_ls(smoke_run: Path) -> None:
    report = json.loads((smoke_run / "report.json").read_text())
    val = read_tsv(smoke_run / "val_predictions.tsv")[1]
    theirs = fit_calibrator(val[RAW], val[GOLD])
    their_loo = theirs.cv_loo(np.abs(theirs.bw), theirs._est_loc_linear)[0]
    ours = theirs.cv_loo(np.array([report["calibration"]["bandwidth"]]), theirs._est_loc_linear)[0]
    assert ours <= their_loo and report["calibration"]["loo_mse"] == pytest.approx(ours, rel=1e-10)


def test_a_copied_output_skips_other_settings_are_refused_and_overwrite_redoes(
    smoke_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(smoke_run, copy)
    same = [
        "--preset",
        "smoke",
        "--output",
        str(copy),
        "augment.thesaurus=bundled",
        f"vectors.cache_dir={tmp_path / 'vectors'}",
    ]
    before = snapshot(copy)
    assert job.main(same) == 0  # a moved or copied output is the same run: skipped
    assert snapshot(copy) == before
    *_, scores, artefact = capsys.readouterr().out.strip().splitlines()
    assert (
        json.loads(scores)["output"] == str(copy) and artefact == f"report.md: {copy / 'report.md'}"
    )

    tiny = [
        "--restarts",
        "1",
        "--no-pretrain",
        "--no-augment",
        "train.max_epochs=1",
        "limit_train=200",
    ]
    assert job.main([*same, *tiny]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "restarts: 2 → 1" in err[0] and "pretrain.enabled: true → false" in err[0]
    )
    assert snapshot(copy) == before  # refused: untouched

    assert job.main([*same, *tiny, "--overwrite"]) == 0
    report = json.loads((copy / "report.json").read_text())
    assert [s["seed"] for s in report["seeds"]] == [0] and is_complete(copy)
    assert yaml.safe_load((copy / "config.yaml").read_text())["limit_train"] == 200
