"""The single-purpose benchmarks the docs name (``python -m jobs.bench_*``) run, at tiny sizes, as a
user runs them (a child process from the checkout), and what each prints holds against its own
oracle: statsmodels' leave-one-out error, a float64 solve, the one-process search, plain pooling's
gradients, PyTorch fp32's ranking. Minutes in all (Ray starts twice): marker ``slow``, run by CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def bench(module: str, *args: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The JSON the script printed: one object per line, or one indented object."""
    done = subprocess.run(
        [sys.executable, "-m", f"jobs.{module}", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**_env(), "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    objects, decoder, at = [], json.JSONDecoder(), out.find("{")
    while at >= 0:
        obj, end = decoder.raw_decode(out, at)
        objects.append(obj)
        at = out.find("{", end)
    assert objects, out[-2000:]
    return objects


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_calibration_search_is_no_worse_than_statsmodels(tmp_path: Path) -> None:
    (line,) = bench("bench_calibration", "--n", "300", tmp_path=tmp_path)
    assert line["n"] == 300
    # statsmodels' own cv_loo scores both bandwidths
    assert line["loo_mse_ours"] <= line["loo_mse_statsmodels"] * (1 + 1e-9)
    assert line["bandwidth_ours"] == pytest.approx(line["bandwidth_statsmodels"], rel=1e-3)


def test_bridge_weights_match_a_float64_solve(tmp_path: Path) -> None:
    args = ("--new", "200", "--source", "2000", "--dim", "32", "--ref-rows", "5")
    (line,) = bench("bench_init", *args, "--memory-rows", "50", tmp_path=tmp_path)
    assert (line["new_tokens"], line["source_tokens"], line["dim"]) == (200, 2000, 32)
    assert line["max_abs_err_vs_float64"]["ours"] < 1e-6
    assert 1 <= line["support"]["mean"] <= line["support"]["max"]


def test_sharded_search_returns_the_one_process_top_k(tmp_path: Path) -> None:
    args = ("--docs", "2000", "--queries", "20", "--workers", "1")
    report = bench("bench_retrieval", *args, tmp_path=tmp_path)[0]
    assert report["identical_top_k"] is True
    assert report["scipy_product_identical"] is True
    assert sum(a["docs"] for a in report["actors"]) == 2000


def test_chunked_pooling_gradients_equal_plain_pooling(tmp_path: Path) -> None:
    report = bench(
        "bench_train", "--memory", "--memory-batch", "2", "--chunk", "8", tmp_path=tmp_path
    )
    memory = report[0]["memory"]
    assert memory["case"]["batch"] == 2
    for key in ("grads_fp32", "grads_float64_batch8"):
        assert memory[key]["tensors_within_1e-5"] == memory[key]["tensors"] > 0


def test_train_overhead_measures_both_loops(tmp_path: Path) -> None:
    args = ("--overhead", "--steps", "10", "--batch", "4")
    overhead = bench("bench_train", *args, tmp_path=tmp_path)[0]["overhead"]
    assert (overhead["steps"], overhead["batch"]) == (10, 4)
    assert overhead["plain_examples_per_s"] > 0 and overhead["ray_examples_per_s"] > 0


def test_export_benchmark_ranks_as_pytorch(tmp_path: Path) -> None:
    args = ("--docs", "30", "--queries", "5", "--sides", "exact,torch-fp32,onnx")
    lines = bench("bench_export", *args, tmp_path=tmp_path)
    sides = {line["side"]: line for line in lines if "side" in line}
    assert set(sides) == {"exact", "torch-fp32", "onnx"}
    assert sides["onnx"]["docs"] == 30
    # ONNX Runtime's vectors rank the judged queries' top 10 as PyTorch fp32's do (float noise may
    # swap ties)
    assert sides["onnx"]["overlap@10"] >= 0.9
    assert sides["onnx"]["ndcg@10_target"] == pytest.approx(
        sides["onnx"]["ndcg@10_exact"], abs=0.05
    )


def test_export_benchmark_refuses_an_unknown_side_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobs.bench_export", "--sides", "exact,bogus"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=_env(),
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith("bench_export: error: --sides: unknown bogus")
