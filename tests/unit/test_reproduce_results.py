"""Results tables and paired comparisons of the reproduction, on hand-made stage directories (no
Ray)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.outputs import write_success
from sembridge_ray.reproduce import compare, results
from sembridge_ray.reproduce.cells import cell_paths, expand


def test_paired_p_value_equals_exact_sign_flip_enumeration() -> None:
    method = np.array([0.9, 0.5, 0.7, 0.2, 1.0, 0.4, 0.6, 0.3])
    reference = np.array([0.6, 0.5, 0.4, 0.3, 0.7, 0.1, 0.6, 0.2])
    diff = method - reference
    flips = [np.mean(np.array(s) * diff) for s in itertools.product((-1, 1), repeat=len(diff))]
    # 2^8 = 256 < resamples: scipy enumerates
    exact = np.mean(np.abs(flips) >= abs(diff.mean()) - 1e-12)
    got = compare.paired_test(method, reference)
    assert got["p_value"] == pytest.approx(exact)
    assert (
        got["mean_diff"] == pytest.approx(diff.mean())
        and got["ci_low"] <= diff.mean() <= got["ci_high"]
    )
    assert compare.paired_test(reference, reference) == {
        "mean_diff": 0.0,
        "ci_low": 0.0,
        "ci_high": 0.0,
        "p_value": 1.0,
    }


def test_large_consistent_gain_has_an_interval_above_zero() -> None:
    rng = np.random.default_rng(1)
    reference = rng.uniform(0, 0.8, 400)
    got = compare.paired_test(reference + 0.05 + rng.normal(0, 0.02, 400), reference)
    assert got["ci_low"] > 0 and got["p_value"] < 0.001


def _stage(folder: Path, ndcg: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(
        json.dumps({"nDCG@10": float(np.mean(list(ndcg.values()))), "R@100": 0.5, "RR@10": 0.4})
    )
    lines = ["query_id\tnDCG@10"] + [f"{q}\t{v!r}" for q, v in sorted(ndcg.items())]
    (folder / "per_query.tsv").write_text("\n".join(lines) + "\n")
    write_success(folder)


def test_tables_and_comparisons_from_stage_directories(tmp_path: Path) -> None:
    cells = expand(("m",), ("ko",), ("sembridge", "mean"), ("4", "2"))
    scores = {
        "m__ko__sembridge__a4": [0.8, 0.6, 0.4],
        "m__ko__sembridge__a2": [0.7, 0.6, 0.4],
        "m__ko__mean": [0.1, 0.0, 0.2],
    }
    for cell in cells:
        _stage(
            cell_paths(tmp_path, cell).eval("miracl", "zero_shot"),
            dict(zip("abc", scores[cell.name], strict=True)),
        )
    rows = results.collect(tmp_path, cells, ["miracl"])
    assert [(r["method"], r["alpha"], r["stage"]) for r in rows] == [
        ("sembridge", "4", "zero_shot"),
        ("sembridge", "2", "zero_shot"),
        ("mean", "", "zero_shot"),
    ]
    table = results.markdown(rows, ["ko"])
    assert (
        "| m | sembridge (α=4) | 0.600 | 0.600 |" in table
        and "| m | mean | 0.100 | 0.100 |" in table
    )
    paired = compare.comparisons(tmp_path, cells, ["miracl"])
    assert [(r["method"], r["alpha"], r["reference"]) for r in paired] == [
        ("sembridge", "2", "m__ko__sembridge__a4"),
        ("mean", "", "m__ko__sembridge__a4"),
    ]
    assert paired[1]["mean_diff"] == pytest.approx(np.mean([0.1 - 0.8, 0.0 - 0.6, 0.2 - 0.4]))
    assert "| miracl | zero-shot | m | ko | mean | -0.500 |" in compare.markdown(paired)


def test_a_method_compared_in_several_languages_is_also_tested_over_all_their_queries(
    tmp_path: Path,
) -> None:
    """The pooled row tests the concatenated per-query differences, each against its own language's
    reference."""
    cells = expand(("m",), ("ko", "ru"), ("sembridge", "mean"), ("4",))
    scores = {
        "m__ko__sembridge__a4": {"a": 0.8, "b": 0.6},
        "m__ko__mean": {"a": 0.1, "b": 0.7},
        "m__ru__sembridge__a4": {"x": 0.5, "y": 0.2, "z": 0.9},
        "m__ru__mean": {"x": 0.4, "y": 0.2, "z": 0.3},
    }
    for cell in cells:
        _stage(cell_paths(tmp_path, cell).eval("xquad", "zero_shot"), scores[cell.name])
    rows = {r["language"]: r for r in compare.comparisons(tmp_path, cells, ["xquad"])}
    assert sorted(rows) == ["all", "ko", "ru"]
    diffs = np.array([0.1 - 0.8, 0.7 - 0.6, 0.4 - 0.5, 0.0, 0.3 - 0.9])
    assert rows["all"]["n_queries"] == 5
    assert rows["all"]["mean_diff"] == pytest.approx(diffs.mean())
    expect = compare.paired_test(diffs, np.zeros(5))
    assert (rows["all"]["ci_low"], rows["all"]["ci_high"]) == pytest.approx(
        (expect["ci_low"], expect["ci_high"])
    )
    assert rows["ko"]["mean_diff"] == pytest.approx(np.mean([0.1 - 0.8, 0.7 - 0.6]))


OLD_COLUMNS = [
    "model", "language", "dataset", "method", "alpha", "stage", "ndcg@10", "r@100", "rr@10", "active_dims_q",
    "active_dims_d", "flops", "train_seconds", "train_steps", "cell",
]  # fmt: skip


def test_results_csv_carries_the_dev_curves_figures_after_the_old_columns(tmp_path: Path) -> None:
    cells = expand(("m",), ("ko",), ("sembridge", "focus"), ("4",))
    tuned, plain = cells
    # sembridge selected its best step on dev; focus was fine-tuned without a development set
    summaries = {
        tuned: {
            "steps": 300,
            "seconds": 12.5,
            "select": "best",
            "best": {"step": 240, "dev_nDCG@10": 0.71, "reason": "highest dev nDCG@10"},
            "convergence": {"final": 0.7, "steps_to_95": 90, "auc": 0.6125, "evaluations": 11},
        },
        plain: {"steps": 300, "seconds": 11.0, "select": "last", "best": {}, "convergence": {}},
    }
    for cell, summary in summaries.items():
        paths = cell_paths(tmp_path, cell)
        for stage in ("zero_shot", "finetuned"):
            _stage(paths.eval("sick", stage), {"a": 0.5, "b": 0.7})
        paths.finetune("sick").mkdir(parents=True)
        (paths.finetune("sick") / results.FINETUNE_SUMMARY).write_text(json.dumps(summary))
    results.write_csv(results.collect(tmp_path, cells, ["sick"]), tmp_path / "results.csv")
    header, *lines = (tmp_path / "results.csv").read_text().splitlines()
    assert header.split(",") == [*OLD_COLUMNS, "dev_final", "steps_to_95", "dev_auc", "best_step"]
    got = {(r[14], r[5]): r[15:] for r in (line.split(",") for line in lines)}
    assert got == {
        ("m__ko__sembridge__a4", "zero_shot"): ["", "", "", ""],
        ("m__ko__sembridge__a4", "finetuned"): ["0.7", "90", "0.6125", "240"],
        ("m__ko__focus", "zero_shot"): ["", "", "", ""],
        ("m__ko__focus", "finetuned"): ["", "", "", ""],
    }


def test_convergence_columns_leave_out_what_is_not_a_figure() -> None:
    nothing = {"final": float("nan"), "steps_to_95": None, "auc": float("nan"), "evaluations": 0}
    assert results.convergence_columns({"convergence": nothing}) == dict.fromkeys(
        ("dev_final", "steps_to_95", "dev_auc", "best_step"), ""
    )
    # one evaluation: reached at step 0
    flat = {"final": 0.5, "steps_to_95": 0, "auc": 0.5, "evaluations": 1}
    # best is recorded, last is published
    last = {"select": "last", "best": {"step": 20}, "convergence": flat}
    assert results.convergence_columns(last) == {
        "dev_final": 0.5,
        "steps_to_95": 0,
        "dev_auc": 0.5,
        "best_step": "",
    }


def test_the_convergence_table_shows_each_languages_dev_curve_figures_and_their_mean_auc() -> None:
    def row(
        lang: str, method: str, final: float, steps: int | str, auc: float
    ) -> dict[str, str | float]:
        figures = {"dev_final": final, "steps_to_95": steps, "dev_auc": auc}
        return {
            "dataset": "xquad",
            "model": "m",
            "language": lang,
            "method": method,
            "alpha": "",
            **figures,
        }

    rows = [
        row("ko", "mean", 0.5, 8, 0.4) | {"stage": "finetuned"},
        row("ru", "mean", 0.3, 0, 0.2) | {"stage": "finetuned"},
        row("ko", "focus", 0.6, 4, 0.55) | {"stage": "finetuned"},
        row("ko", "focus", 0.1, 0, 0.1) | {"stage": "zero_shot"},  # not a fine-tuning: no curve
    ]
    table = results.convergence_markdown(rows, ["ko", "ru"])
    assert "| mean | 0.500 · 8 · 0.400 | 0.300 · 0 · 0.200 | 0.300 |" in table
    # a mean over some languages would mislead
    assert "| focus | 0.600 · 4 · 0.550 | – | – |" in table
    assert results.convergence_markdown([r | {"dev_auc": ""} for r in rows], ["ko", "ru"]) == ""
