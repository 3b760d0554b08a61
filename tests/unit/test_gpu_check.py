"""The GPU check's plain parts on CPU tensors (no Ray): the comparisons against hand-computed cases,
the JSON line schema, the measured figures the reproduction plan reads, and the skip path of
``local.sh gpu-check``."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from benchmarks import gpu_check as gc
from jobs import reproduce
from sembridge_ray.recipes.reproduce import figures
from sembridge_ray.runtime.errors import InputError
from tests.conftest import REPO


def line(stage: str = "init", compare: gc.Comparison | None = None) -> gc.StageLine:
    unit = gc.THROUGHPUT_UNITS[stage.split("_")[0]]
    return gc.StageLine(
        stage=stage, device="cuda", dtype="float32", wall_s=1.5, throughput=10.0, throughput_unit=unit,
        peak_gpu_mem_mib=812.0, compare=compare,
    )  # fmt: skip


def test_weights_within_and_outside_1e_5() -> None:
    cpu = {"emb": torch.zeros(2, 3), "bias": torch.ones(3)}
    near = {"emb": torch.tensor([[0.0, 9e-6, 0.0], [0.0, 0.0, -9e-6]]), "bias": torch.ones(3)}
    far = {"emb": torch.zeros(2, 3), "bias": torch.tensor([1.0, 1.0, 1.00002])}
    assert gc.compare_weights(cpu, cpu).diff == 0.0
    ok = gc.compare_weights(near, cpu)
    assert ok.ok and ok.diff == pytest.approx(9e-6, rel=1e-6)
    bad = gc.compare_weights(far, cpu)
    # float32 spacing at 1 is 1.2e-7
    assert not bad.ok and bad.diff == pytest.approx(2e-5, rel=1e-2)


def test_weights_with_other_names_or_shapes_differ() -> None:
    cpu = {"emb": torch.zeros(2, 3)}
    assert not gc.compare_weights({"other": torch.zeros(2, 3)}, cpu).ok
    shaped = gc.compare_weights({"emb": torch.zeros(3, 2)}, cpu)
    assert not shaped.ok and shaped.diff == float("inf")


def test_ndcg_within_and_outside_0_005() -> None:
    assert gc.compare_ndcg(0.700, 0.696).ok  # 0.004
    assert gc.compare_ndcg(0.696, 0.700).ok
    bad = gc.compare_ndcg(0.700, 0.694)  # 0.006
    assert not bad.ok and bad.diff == pytest.approx(0.006)
    assert (bad.value, bad.reference, bad.tolerance) == (0.700, 0.694, gc.NDCG_ATOL)


def test_loss_curve_difference_by_hand() -> None:
    assert gc.LOSS_RTOL == 8 * 2**-8 == 0.03125
    # step 1: |2.0 - 2.02| / 2.02 = 0.0099; step 2: 0; step 3 (below 1, absolute): |0.5 - 0.49| =
    # 0.01
    assert gc.loss_curve_diff([2.0, 1.5, 0.5], [2.02, 1.5, 0.49]) == pytest.approx(0.01)
    assert gc.compare_losses([2.0, 1.5, 0.5], [2.02, 1.5, 0.49]).ok
    assert gc.compare_losses([0.01], [0.04]).ok  # 0.03 absolute, under 0.03125
    assert not gc.compare_losses([2.0, 1.0], [2.1, 1.0]).ok  # 0.1 / 2.1 = 0.048
    assert not gc.compare_losses([1.0, 0.9], [1.0]).ok  # lengths differ
    assert gc.loss_curve_diff([], []) == float("inf")


def toy_losses(bf16: bool, lr: float = 0.5, steps: int = 6) -> list[float]:
    """A seeded softmax regression trained by SGD, the matmul under bf16 autocast or in fp32."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 32, generator=gen), torch.randint(0, 8, (64,), generator=gen)
    w = (0.1 * torch.randn(32, 8, generator=gen)).requires_grad_()
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = x @ w
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w -= lr * grad
        losses.append(float(loss.detach()))
    return losses


def test_bf16_autocast_curve_is_within_tolerance_of_fp32_and_a_different_run_is_not() -> None:
    fp32 = toy_losses(bf16=False)
    bf16 = toy_losses(bf16=True)
    assert bf16 != fp32 and gc.compare_losses(bf16, fp32).ok
    # other hyper-parameters: a real change
    assert not gc.compare_losses(toy_losses(bf16=False, lr=2.0), fp32).ok


def test_line_schema() -> None:
    printed = json.loads(line("evaluate_zero_shot", gc.compare_ndcg(0.7, 0.69)).to_json())
    assert list(printed)[: len(gc.LINE_FIELDS)] == list(gc.LINE_FIELDS)
    assert gc.check_line(printed) == [] and set(printed["compare"]) == set(gc.COMPARISON_FIELDS)
    assert printed["throughput_unit"] == "docs/s" and printed["compare"]["ok"] is False
    assert gc.check_line(json.loads(line("finetune_1w_bf16").to_json())) == []
    missing = {k: v for k, v in printed.items() if k != "dtype"}
    assert gc.check_line(missing) == ["missing dtype"]
    assert gc.check_line({**printed, "stage": "warmup"}) == ["unknown stage 'warmup'"]
    assert gc.check_line({**printed, "compare": {"ok": True}})[0].startswith("compare: missing")


def test_uncomparable_curves_print_strict_json() -> None:
    text = line("finetune_1w_bf16", gc.compare_losses([1.0], [1.0, 0.9])).to_json()
    assert "Infinity" not in text and json.loads(text)["compare"]["diff"] is None


def save_model(path: Path, emb: torch.Tensor) -> Path:
    path.mkdir(parents=True)
    save_file({"emb": emb}, str(path / "model.safetensors"))
    return path


def test_each_stage_gets_its_comparison(tmp_path: Path) -> None:
    gpu = save_model(tmp_path / "gpu", torch.tensor([1.0, 2.0]))
    cpu = save_model(tmp_path / "cpu", torch.tensor([1.0, 2.0 + 2e-5]))
    done = [
        gc.Measured(line=line("init"), model=gpu),
        gc.Measured(line=line("evaluate_zero_shot"), ndcg=0.70),
        gc.Measured(line=line("finetune_1w_fp32"), losses=(2.0, 1.0)),
        gc.Measured(line=line("finetune_1w_bf16"), losses=(2.01, 1.0)),
        gc.Measured(line=line("evaluate_finetuned"), ndcg=0.75),
    ]
    ref = {
        "init_model": str(cpu),
        "ndcg": {"evaluate_zero_shot": 0.699, "evaluate_finetuned": 0.74},
    }
    got = {x.stage: x.compare for x in gc.with_comparisons(done, ref)}
    assert (
        got["init"] is not None
        and not got["init"].ok
        and got["init"].metric == "max_abs_weight_diff"
    )
    assert got["evaluate_zero_shot"] is not None and got["evaluate_zero_shot"].ok
    assert got["evaluate_finetuned"] is not None and not got["evaluate_finetuned"].ok  # 0.01
    assert got["finetune_1w_fp32"] is None
    assert got["finetune_1w_bf16"] is not None and got["finetune_1w_bf16"].diff == pytest.approx(
        0.005
    )


def test_measured_figures_feed_the_plan_when_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        line("init"),
        line("evaluate_zero_shot"),
        line("finetune_1w_bf16"),
        line("evaluate_finetuned"),
    ]
    lines = [
        replace(x, throughput=t)
        for x, t in zip(lines, (5000.0, 2000.0, 640.0, 2500.0), strict=True)
    ]
    measured = gc.measured_figures(lines, "NVIDIA H200", 1, "MiniLM")
    path = tmp_path / "figures.json"
    gc.write_figures(measured, path)
    got = figures.read_figures(path, batch=64)
    assert (got.bridge_strings_per_s, got.docs_per_s, got.seconds_per_step) == (5000.0, 2500.0, 0.1)
    assert "NVIDIA H200" in got.source and str(path) in got.source

    argv = ["--preset", "paper", "--dry-run", "--json", "--output", str(tmp_path / "plan")]
    assert reproduce.main([*argv, "--figures", str(path)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (
        "NVIDIA H200" in plan["figures_source"] and plan["assumptions"]["seconds_per_step"] == 0.1
    )

    assert reproduce.main(argv) == 0  # no file given: the built-in figures
    plan = json.loads(capsys.readouterr().out)
    assert (
        plan["figures_source"] == figures.BUILT_IN.source
        and plan["assumptions"]["docs_per_s"] == 1000
    )


def test_a_broken_figures_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "figures.json"
    path.write_text('{"gpu": "x"}')
    with pytest.raises(InputError, match=r"figures\.json"):
        figures.read_figures(path, batch=64)
    # no evaluate or fine-tune stage ran
    gc.write_figures(gc.measured_figures([line("init")], "G", 1, "M"), path)
    with pytest.raises(InputError, match=r"figures\.json: docs_per_s must be a number > 0"):
        figures.read_figures(path, batch=64)


@pytest.mark.parametrize("smi", ["missing", "no devices"])
def test_local_sh_gpu_check_skips_with_one_line_and_installs_nothing(
    tmp_path: Path, smi: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi == "no devices":  # what nvidia-smi says on a machine with the driver but no GPU
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    # PYTHON=false: any set-up (venv, pip) would fail, so exit 0 proves the skip came first.
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": "false"}
    done = subprocess.run(
        ["bash", str(REPO / "cluster" / "local.sh"), "gpu-check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.count("\n") == 1 and "skipped: no CUDA GPU" in done.stdout and done.stderr == ""
    )
