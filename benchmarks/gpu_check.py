"""The prepared GPU check's plain parts (no Ray, no I/O beyond reading a model's weights): the
tolerances, the comparisons of a GPU stage with the same stage on the CPU, the
one-JSON-line-per-stage schema, and the measured figures the reproduction plan reads when given
them. The driver is ``benchmarks.distributed_gpu_check``; the command is ``bash cluster/local.sh
gpu-check`` (or ``python -m jobs.gpu_check``)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Container, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NotRequired, TypedDict, cast

import torch

from sembridge_ray.json_types import JSONValue

WEIGHT_ATOL = 1e-5
"""Init weights: largest absolute difference between the GPU's and the CPU's model tensors."""
NDCG_ATOL = 0.005
"""nDCG@10 of the same model evaluated on the GPU and on the CPU."""
BF16_EPS = 2.0**-8
"""bf16's unit roundoff (8 significand bits)."""
LOSS_RTOL = 8 * BF16_EPS
"""Loss curves, bf16 autocast vs fp32 on the same GPU: autocast rounds every matmul input to bf16
(relative error up to BF16_EPS each); over a short run the rounding compounds through the updates to
a few units of it."""

STAGES = (
    "init",
    "evaluate_zero_shot",
    "finetune_1w_fp32",
    "finetune_1w_bf16",
    "finetune_2w_fp32",
    "finetune_2w_bf16",
    "evaluate_finetuned",
)
"""In the order they run; ``finetune_<workers>w_<dtype>`` (the 2-worker pair only where there are 2
GPUs)."""
THROUGHPUT_UNITS = {
    "init": "bridge_strings/s",
    "evaluate": "docs/s",
    "finetune": "train_examples/s",
}
LINE_FIELDS = (
    "stage",
    "device",
    "dtype",
    "wall_s",
    "throughput",
    "throughput_unit",
    "peak_gpu_mem_mib",
    "compare",
)
COMPARISON_FIELDS = ("against", "metric", "value", "reference", "diff", "tolerance", "ok")


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One stage measured against its reference: ``ok`` when ``diff <= tolerance``."""

    against: str
    """What the reference is (``cpu``, ``fp32 on the same GPU``)."""
    metric: str
    value: float | None
    reference: float | None
    diff: float
    tolerance: float
    ok: bool


@dataclass(frozen=True, kw_only=True)
class StageLine:
    """What the check prints for one stage (one JSON line)."""

    stage: str
    device: str
    dtype: str
    wall_s: float
    throughput: float
    throughput_unit: str
    peak_gpu_mem_mib: float | None
    """Peak memory in use on the busiest GPU while the stage ran (sampled with nvidia-smi); None
    without one."""
    compare: Comparison | None = None
    extra: dict[str, JSONValue] = field(default_factory=dict)

    def to_json(self) -> str:
        """Strict JSON: a non-finite number (curves that cannot be compared) is written as null."""
        return json.dumps(_finite(asdict(self)), allow_nan=False)


def _finite(value: object) -> object:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


class Reference(TypedDict):
    """The CPU reference pass's ``reference.json``: what the comparisons need, and its own printed
    lines."""

    init_model: str
    """The CPU's init output model."""
    ndcg: dict[str, float]
    """Evaluate stage -> nDCG@10 of the main pass's model of that stage, evaluated on the CPU."""
    lines: NotRequired[list[JSONValue]]


class GpuFigures(TypedDict):
    """The measured figures file (``figures.json``), in its key order: a figures file the
    reproduction plan reads when given it (``reproduce --dry-run --figures FILE``; the format:
    ``sembridge_ray.recipes.reproduce.figures``)."""

    source: str
    gpu: str
    gpus: int
    model: str
    torch: str
    bridge_strings_per_s: float
    docs_per_s: float
    train_examples_per_s: float


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One stage as it ran: its line without the comparison, and what the comparison needs."""

    line: StageLine
    model: Path | None = None
    ndcg: float | None = None
    losses: tuple[float, ...] = ()


def compare_weights(
    gpu: Mapping[str, torch.Tensor], cpu: Mapping[str, torch.Tensor], atol: float = WEIGHT_ATOL
) -> Comparison:
    """Largest |gpu - cpu| over every tensor of two state dicts (other names or shapes: infinitely
    different)."""
    diff = math.inf
    if gpu.keys() == cpu.keys() and all(gpu[k].shape == cpu[k].shape for k in gpu):
        diffs = (
            float((gpu[k].double() - cpu[k].double()).abs().max()) for k in gpu if gpu[k].numel()
        )
        diff = max(diffs, default=0.0)
    return Comparison(
        against="cpu",
        metric="max_abs_weight_diff",
        value=diff,
        reference=0.0,
        diff=diff,
        tolerance=atol,
        ok=diff <= atol,
    )


def compare_ndcg(gpu: float, cpu: float, atol: float = NDCG_ATOL) -> Comparison:
    """nDCG@10 of the same model on the GPU and on the CPU."""
    diff = abs(gpu - cpu)
    return Comparison(
        against="cpu",
        metric="nDCG@10",
        value=gpu,
        reference=cpu,
        diff=diff,
        tolerance=atol,
        ok=diff <= atol,
    )


def loss_curve_diff(curve: Sequence[float], reference: Sequence[float]) -> float:
    """max_i |curve_i - reference_i| / max(|reference_i|, 1): relative for losses above 1, absolute
    below (a loss near 0 has no meaningful relative error). Curves of different lengths (or empty
    ones) differ infinitely."""
    if len(curve) != len(reference) or not curve:
        return math.inf
    return max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(curve, reference, strict=True))


def compare_losses(
    bf16: Sequence[float], fp32: Sequence[float], rtol: float = LOSS_RTOL
) -> Comparison:
    """A bf16-autocast loss curve against the fp32 curve of the same run on the same GPU."""
    diff = loss_curve_diff(bf16, fp32)
    return Comparison(
        against="fp32 on the same device",
        metric="loss_curve_rel_diff",
        value=bf16[-1] if bf16 else None,
        reference=fp32[-1] if fp32 else None,
        diff=diff,
        tolerance=rtol,
        ok=diff <= rtol,
    )


def with_comparisons(done: list[Measured], reference: Mapping[str, object]) -> list[StageLine]:
    """Each stage's line with its comparison: init weights and nDCG@10 against the CPU, bf16 loss
    curves against the fp32 run with the same workers on the same device. ``reference`` is the CPU
    pass's :class:`Reference`."""
    ref = cast(Reference, reference)
    curves = {m.line.stage: m.losses for m in done}
    lines = []
    for m in done:
        stage, cmp = m.line.stage, None
        if stage == "init" and m.model is not None:
            cmp = compare_weights(read_weights(m.model), read_weights(Path(ref["init_model"])))
        elif stage in ref["ndcg"] and m.ndcg is not None:
            cmp = compare_ndcg(m.ndcg, float(ref["ndcg"][stage]))
        elif stage.endswith("_bf16"):
            cmp = compare_losses(m.losses, curves[stage.replace("_bf16", "_fp32")])
        lines.append(replace(m.line, compare=cmp))
    return lines


def check_line(line: Mapping[str, object]) -> list[str]:
    """Problems with one printed line (parsed JSON, not yet trusted) against the schema (empty when
    it conforms)."""
    problems = [f"missing {k}" for k in LINE_FIELDS if k not in line]
    if problems:
        return problems
    if line["stage"] not in STAGES:
        problems.append(f"unknown stage {line['stage']!r}")
    wall_s, throughput, peak, compare = (
        line["wall_s"],
        line["throughput"],
        line["peak_gpu_mem_mib"],
        line["compare"],
    )
    if not isinstance(wall_s, int | float) or wall_s < 0:
        problems.append("wall_s must be a number >= 0")
    if not isinstance(throughput, int | float) or throughput < 0:
        problems.append("throughput must be a number >= 0")
    if line["throughput_unit"] not in THROUGHPUT_UNITS.values():
        problems.append(f"unknown throughput_unit {line['throughput_unit']!r}")
    if peak is not None and not isinstance(peak, int | float):
        problems.append("peak_gpu_mem_mib must be a number or null")
    if compare is not None:
        fields = cast(Container[str], compare)  # a printed comparison is an object
        problems += [f"compare: missing {k}" for k in COMPARISON_FIELDS if k not in fields]
    return problems


def measured_figures(lines: Sequence[StageLine], gpu: str, gpus: int, model: str) -> GpuFigures:
    """The throughputs the reproduction plan can divide by (``sembridge_ray.recipes.reproduce.figures``),
    the GPU beside them. They are the check's miniature's (all-MiniLM-L6-v2 on SICK sentences): the
    source line says the paper's models run slower."""
    by_stage = {line.stage: line.throughput for line in lines}
    evals = [v for k, v in by_stage.items() if k.startswith("evaluate")]
    return {
        "source": f"measured by the GPU check on {gpu} with {model} (the paper's larger models are slower)",
        "gpu": gpu,
        "gpus": gpus,
        "model": model,
        "torch": torch.__version__,
        "bridge_strings_per_s": by_stage.get("init", 0.0),
        "docs_per_s": max(evals, default=0.0),
        "train_examples_per_s": by_stage.get("finetune_1w_bf16", 0.0),
    }


def nvidia_gpus() -> list[str]:
    """The GPU models ``nvidia-smi -L`` lists (empty without the tool or a GPU)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        line.split(":", 1)[1].split("(UUID")[0].strip()
        for line in out.splitlines()
        if line.startswith("GPU ")
    ]


def cuda_ready() -> bool:
    """torch can compute on a CUDA GPU (a CPU build, or a driver it cannot use, says no)."""
    return bool(torch.cuda.is_available())


def write_figures(figures: GpuFigures, path: Path) -> None:
    from sembridge_ray.runtime.outputs import atomic_write_json

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(path), dict(figures))


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved model directory's safetensors files."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).rglob("*.safetensors")):
        tensors |= {
            f"{path.relative_to(model_dir)}:{k}": v for k, v in load_file(str(path)).items()
        }
    return tensors
