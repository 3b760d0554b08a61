"""Results tables and paired comparisons of the reproduction, on hand-made stage directories (no
Ray)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.recipes.reproduce import compare, results
from sembridge_ray.recipes.reproduce.cells import cell_paths, expand
from sembridge_ray.runtime.outputs import write_success


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
    assert "| miracl | zero-shot | m | ko | mean | reference | 1/1 | -0.500 |" in compare.markdown(
        paired
    )


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
    convergence = ["dev_final", "steps_to_95", "dev_auc", "best_step"]
    health = ["seed", "empty_share_q", "empty_share_d", "collapsed"]
    assert header.split(",") == [*OLD_COLUMNS, *convergence, *health]
    got = {(r[14], r[5]): r[15:19] for r in (line.split(",") for line in lines)}
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


def _curve(folder: Path, curve: list[tuple[int, float]]) -> None:
    """A fine-tuning's metrics.jsonl holding ``curve`` as its dev scores."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "dev_nDCG@10": v}) + "\n" for s, v in curve]
    (folder / "metrics.jsonl").write_text("".join(lines))


def test_the_convergence_protocol_reads_seed_means_against_common_targets(tmp_path: Path) -> None:
    from sembridge_ray.recipes.reproduce import protocol
    from sembridge_ray.recipes.reproduce.cells import bm25_path

    steps = [0, 1, 2, 4]
    cells = expand(("m",), ("ko",), ("sembridge", "random"), ("4",), seeds=lambda e: 2)
    sembridge, random = cells
    curves = {
        (sembridge, 0): [0.40, 0.50, 0.60, 0.70],
        (sembridge, 1): [0.40, 0.50, 0.60, 0.70],  # a deterministic init: the same start
        (random, 0): [0.10, 0.20, 0.50, 0.80],
        (random, 1): [0.10, 0.30, 0.40, 0.60],
    }
    for (cell, seed), scores in curves.items():
        _curve(
            cell_paths(tmp_path, cell, seed).finetune("xquad"),
            list(zip(steps, scores, strict=True)),
        )
    _stage(bm25_path(tmp_path, "ko", "dev", "dev"), {"a": 0.55, "b": 0.55})
    rows = {r["method"]: r for r in protocol.protocol_rows(tmp_path, cells, ["xquad"], "dev")}
    # the best final mean is random's 0.70 (= sembridge's 0.70): the target is 0.95 x 0.70
    for row in rows.values():
        assert row["target_95"] == pytest.approx(0.665) and row["bm25_dev"] == pytest.approx(0.55)
    ours, theirs = rows["sembridge α=4"], rows["random"]
    assert (ours["steps_to_95"], ours["steps_to_bm25"]) == (4, 2)
    # random's mean curve: 0.10, 0.25, 0.45, 0.70
    assert (theirs["steps_to_95"], theirs["steps_to_bm25"]) == (4, 4)
    assert theirs["final_sd"] == pytest.approx(math.sqrt(0.02))  # finals 0.8 and 0.6
    assert ours["final_sd"] == 0 and ours["seeds"] == 2
    # the log-step area by hand: x = log2(1 + step) = 0, 1, log2(3), log2(5)
    x = [0.0, 1.0, math.log2(3), math.log2(5)]
    y = [0.40, 0.50, 0.60, 0.70]
    area = sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(3)) / x[-1]
    assert ours["auc_log_mean"] == pytest.approx(area)
    short = [(0, 0.1), (1, 0.2)]
    assert protocol.log_auc(short) == pytest.approx(0.15)
    assert protocol.first_step([0, 1], [0.1, 0.2], 0.5) == protocol.NEVER
    table = protocol.markdown(list(rows.values()), ["ko", "ru"])
    assert "| random | 0.700 ±0.141 · 4 / 4 · " in table and "| – |" in table
    assert "ko: 95% target 0.665, BM25 0.550" in table


def test_the_seed_and_query_bootstrap_is_the_naive_two_level_resampling() -> None:
    """The vectorised two-level bootstrap against a plain loop over the same draws (each side's
    seeds independently, the queries paired), and its point estimate against the mean of means."""
    rng = np.random.default_rng(3)
    method, reference = rng.random((3, 40)), rng.random((2, 40))
    low, high = compare.seed_query_bootstrap(method, reference, 600, np.random.default_rng(9), 200)
    draws = np.random.default_rng(9)
    found = []
    for _ in range(3):  # the same blocks of 200 resamples
        pm = draws.integers(0, 3, (200, 3))
        pr = draws.integers(0, 2, (200, 2))
        pq = draws.integers(0, 40, (200, 40))
        for b in range(200):
            m = np.mean([method[s] for s in pm[b]], axis=0)
            r = np.mean([reference[s] for s in pr[b]], axis=0)
            found.append(np.mean([m[q] - r[q] for q in pq[b]]))
    assert (low, high) == pytest.approx(tuple(np.percentile(found, [2.5, 97.5])), abs=1e-12)
    test = compare.paired_test(method, reference)
    assert test["mean_diff"] == pytest.approx(method.mean() - reference.mean())


def test_seeds_that_disagree_widen_the_interval_that_queries_alone_would_give() -> None:
    """Two seeds of a method: one 0.1 above the reference on every query, one 0.1 below. Their mean
    is the reference's, per query; queries alone would call the difference exactly 0, the seeds
    make it uncertain."""
    reference = np.linspace(0.2, 0.8, 50)[None, :]
    method = np.vstack([reference[0] + 0.1, reference[0] - 0.1])
    test = compare.paired_test(method, reference)
    assert test["mean_diff"] == pytest.approx(0.0, abs=1e-12)
    assert test["ci_low"] < -0.05 and test["ci_high"] > 0.05


def test_each_fusion_is_compared_with_bm25_alone_on_the_same_queries(tmp_path: Path) -> None:
    from sembridge_ray.recipes.reproduce.cells import bm25_path

    (cell,) = expand(("m",), ("ko",), ("sembridge",), ("4",))
    paths = cell_paths(tmp_path, cell)
    _stage(paths.eval("xquad", "zero_shot"), {"a": 0.1, "b": 0.2, "c": 0.3})
    _stage(paths.fusion("xquad", "zero_shot"), {"a": 0.6, "b": 0.7, "c": 0.9})
    _stage(bm25_path(tmp_path, "ko", "xquad", "test"), {"a": 0.5, "b": 0.5, "c": 0.5})
    rows = compare.comparisons(tmp_path, [cell], ["xquad"])
    (fused,) = [r for r in rows if r["reference"] == "bm25"]
    assert (fused["method"], fused["stage"], fused["n_queries"]) == (
        "sembridge+bm25",
        "zero_shot",
        3,
    )
    assert fused["mean_diff"] == pytest.approx((0.1 + 0.2 + 0.4) / 3)
    csv_rows = results.collect(tmp_path, [cell], ["xquad"])
    methods = {(r["method"], r["stage"]) for r in csv_rows}
    assert {
        ("sembridge", "zero_shot"),
        ("sembridge+bm25", "zero_shot"),
        ("bm25", "zero_shot"),
    } <= methods
    bm25_row = next(r for r in csv_rows if r["method"] == "bm25")
    assert bm25_row["active_dims_q"] == "" and bm25_row["ndcg@10"] == pytest.approx(0.5)
