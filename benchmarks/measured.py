"""The figures the cost model can divide by, as measured by ``jobs.bench_peers``, and how CPU
figures are scaled. The reproduction plan reads them only when given the file: ``reproduce --dry-run
--figures measured.json`` (its format: ``sembridge_ray.recipes.reproduce.figures``).

``measured.json`` holds ``{source, device, docs_per_s, train_examples_per_s, bridge_strings_per_s,
gpu_scale, scaling}``: throughputs at the paper's shapes (documents of 256 tokens; training pairs of
64 + 256 tokens) on one device. A GPU run (``device`` "cuda") writes ``gpu_scale`` 1. A CPU run
measures the bundled MiniLM SPLADE and writes the assumption that turns it into one A100-class GPU
running BERT-base (``scaling``):

- token counts: a rate at n tokens per item is converted to the paper's length in proportion to
  tokens (attention's quadratic part is ignored: it is small next to the vocabulary projection at
  these lengths);
- FLOPs: GPU rate = CPU rate × (A100 bf16 peak 312 TFLOP/s × 40% utilisation ÷ this CPU's measured
  fp32 GEMM rate) × (MiniLM FLOPs per token ÷ BERT-base FLOPs per token);
- the bridge: the benchmark embeds with the MiniLM bridge, the paper with BGE-M3 (XLM-R large: 24
  layers of 1024, no vocabulary projection), so its rate is further multiplied by
  :data:`BRIDGE_VS_ENCODERS` before it is written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypedDict

import torch

from sembridge_ray.recipes.reproduce.figures import RATES

MEASURED_JSON = Path("~/.cache/sembridge_ray/measured.json").expanduser()
"""Where ``jobs.bench_peers`` writes by default (``--measured``)."""
GPU_EFFECTIVE_FLOPS = 312e12 * 0.4


class Rates(TypedDict, total=False):
    """Throughputs at the paper's shapes, each where it was measured."""

    bridge_strings_per_s: float
    docs_per_s: float
    train_examples_per_s: float


class MeasuredRecord(Rates, total=False):
    """``measured.json``: ``source``, ``device``, the rates, then ``gpu_scale`` and ``scaling`` (the
    assumption that turns them into one GPU's)."""

    source: str
    device: str
    gpu_scale: float
    scaling: str


def flops_per_token(layers: int, hidden: int, vocab: int = 30_522) -> float:
    """Forward FLOPs per token of a BERT MLM: 12 h² weights per layer (attention 4 h², MLP 8 h²) +
    the projection."""
    return 2 * (layers * 12 * hidden**2 + hidden * vocab)


BRIDGE_VS_ENCODERS = (flops_per_token(6, 384, vocab=0) / flops_per_token(24, 1024, vocab=0)) / (
    flops_per_token(6, 384) / flops_per_token(12, 768)
)
"""(MiniLM-L6 ÷ BGE-M3 encoder FLOPs per token) ÷ (MiniLM-L6 ÷ BERT-base MLM): about 0.17."""


def cpu_gemm_flops(size: int = 1024, repeats: int = 5) -> float:
    """This process's fp32 GEMM rate (FLOP/s), median of ``repeats`` square products."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / sorted(times)[len(times) // 2]


def gpu_scale(cpu_flops: float) -> tuple[float, str]:
    model_ratio = flops_per_token(6, 384) / flops_per_token(12, 768)  # MiniLM-L6 / BERT-base
    scale = GPU_EFFECTIVE_FLOPS / cpu_flops * model_ratio
    text = (
        f"CPU figures x {scale:.0f} = (312 TFLOP/s bf16 x 40% utilisation) / (measured fp32 GEMM "
        f"{cpu_flops / 1e9:.0f} GFLOP/s) x (MiniLM-L6 / BERT-base FLOPs per token = {model_ratio:.3f}); "
        "rates converted to the paper's lengths in proportion to tokens"
    )
    return scale, text


def measured_record(device: str, source: str, rates: Rates) -> MeasuredRecord:
    """The JSON written for the cost model (``rates`` already at the paper's lengths, on
    ``device``)."""
    if device == "cuda":
        return {
            "source": source,
            "device": device,
            **rates,
            "gpu_scale": 1.0,
            "scaling": "measured on the GPU itself",
        }
    scale, text = gpu_scale(cpu_gemm_flops())
    if "bridge_strings_per_s" in rates:
        rates = {
            **rates,
            "bridge_strings_per_s": rates["bridge_strings_per_s"] * BRIDGE_VS_ENCODERS,
        }
        text += f"; the bridge's rate also x {BRIDGE_VS_ENCODERS:.3f} (MiniLM-L6 -> BGE-M3 FLOPs per token)"
    return {"source": source, "device": device, **rates, "gpu_scale": scale, "scaling": text}


def write_measured(path: str | Path, record: MeasuredRecord) -> None:
    """Merge ``record`` into ``path`` (rates measured by earlier runs stay unless re-measured),
    atomically. A kept rate is re-expressed at the new ``gpu_scale`` (the CPU GEMM rate is measured
    again each run), so its scaled, GPU-equivalent value does not move."""
    import json

    from sembridge_ray.runtime.outputs import atomic_write_json

    path = Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {}
    factor = float(old.get("gpu_scale", 1.0)) / float(record.get("gpu_scale", 1.0))
    keep: dict[str, float] = {k: old[k] * factor for k in RATES if k in old and k not in record}
    path.parent.mkdir(parents=True, exist_ok=True)
    merged: dict[str, object] = {**record, **keep}
    atomic_write_json(path, merged)
