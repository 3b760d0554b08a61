"""The throughputs the reproduction plan divides by, in this order of preference:

1. measured on a GPU by ``bash cluster/local.sh gpu-check``: :data:`DEFAULT_PATH` (or ``SEMBRIDGE_GPU_FIGURES``);
2. measured on this machine's CPU by ``python -m jobs.bench_peers`` and scaled to one A100-class GPU by the
   assumption the file writes down (:data:`BENCH_PATH`, see :mod:`sembridge_ray.bench.measured`);
3. rough built-in figures.

The plan prints which figures it used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    from sembridge_ray.gpu_check import GpuFigures

ENV = "SEMBRIDGE_GPU_FIGURES"
DEFAULT_PATH = Path("~/.cache/sembridge_ray/gpu_figures.json")
BENCH_PATH = Path("~/.cache/sembridge_ray/measured.json")
RateName = Literal["bridge_strings_per_s", "docs_per_s", "train_examples_per_s"]
RATES: tuple[RateName, ...] = ("bridge_strings_per_s", "docs_per_s", "train_examples_per_s")


class Rates(TypedDict, total=False):
    """Throughputs at the paper's shapes, each where it was measured."""

    bridge_strings_per_s: float
    docs_per_s: float
    train_examples_per_s: float


class MeasuredRecord(Rates, total=False):
    """``measured.json`` (written by ``jobs.bench_peers``, see :mod:`sembridge_ray.bench.measured`): ``source``,
    ``device``, the rates, then ``gpu_scale`` and ``scaling`` (the assumption that turns them into one GPU's)."""

    source: str
    device: str
    gpu_scale: float
    scaling: str


@dataclass(frozen=True, kw_only=True)
class Figures:
    bridge_strings_per_s: float
    docs_per_s: float
    seconds_per_step: float
    """At the plan's batch size."""
    source: str
    """Where the figures come from, printed with the plan."""


# One modern GPU (A100-class, bf16), rough: BGE-M3 on short token strings; BERT-base SPLADE at 256 tokens;
# batch 64 x (64 + 256) tokens, BERT-base, bf16, incl. the FLOPs regulariser.
BUILT_IN = Figures(
    bridge_strings_per_s=3_000, docs_per_s=1_000, seconds_per_step=0.35, source="built-in rough figures (A100-class)"
)


def figures_path() -> Path:
    """``SEMBRIDGE_GPU_FIGURES`` when set, else :data:`DEFAULT_PATH`."""
    return Path(os.environ.get(ENV) or DEFAULT_PATH).expanduser()


def from_measured(data: GpuFigures, batch: int, path: Path) -> Figures:
    """A GPU check's file -> the plan's figures (seconds per step at ``batch`` from examples/s). These are the
    throughputs of the check's miniature (all-MiniLM-L6-v2 on SICK sentences), so they run faster than the
    paper's models would: the source line says so."""
    rates = {k: float(data[k]) for k in RATES}
    if min(rates.values()) <= 0:
        raise ValueError(f"{path}: every throughput must be > 0 ({rates})")
    return Figures(
        bridge_strings_per_s=rates["bridge_strings_per_s"],
        docs_per_s=rates["docs_per_s"],
        seconds_per_step=batch / rates["train_examples_per_s"],
        source=f"measured by the GPU check on {data['gpu']} with {data['model']} ({path}); the paper's larger "
        "models are slower",
    )


def from_bench(data: MeasuredRecord, batch: int, path: Path) -> Figures:
    """``jobs.bench_peers``'s file -> the plan's figures: each rate times its ``gpu_scale`` (1 when measured on a
    GPU); a rate the file lacks keeps the built-in figure, and the source line says which."""
    scale = float(data.get("gpu_scale", 1.0))
    rates = {k: float(data[k]) * scale for k in RATES if k in data}
    if any(v <= 0 for v in rates.values()):
        raise ValueError(f"{path}: every throughput must be > 0 ({rates})")
    source = f"{data.get('source', 'bench_peers')} on {data.get('device', '?')} ({path})"
    if scale != 1.0:
        source += f"; {data.get('scaling', f'scaled x {scale:g}')}"
    if missing := [k for k in RATES if k not in rates]:
        source += f"; built-in: {', '.join(missing)}"
    return Figures(
        bridge_strings_per_s=rates.get("bridge_strings_per_s", BUILT_IN.bridge_strings_per_s),
        docs_per_s=rates.get("docs_per_s", BUILT_IN.docs_per_s),
        seconds_per_step=batch / rates["train_examples_per_s"]
        if "train_examples_per_s" in rates
        else BUILT_IN.seconds_per_step,
        source=source,
    )


def load_figures(batch: int, path: Path | None = None, bench: Path | None = None) -> Figures:
    """The GPU check's figures at ``path`` (default :func:`figures_path`), else ``jobs.bench_peers``'s at ``bench``
    (default :data:`BENCH_PATH`), else :data:`BUILT_IN`. A file that exists but cannot be read is an error naming
    it, never silently replaced."""
    path = figures_path() if path is None else path
    for candidate, convert in ((path, from_measured), (Path(bench or BENCH_PATH).expanduser(), from_bench)):
        if candidate.is_file():
            try:
                return convert(json.loads(candidate.read_text(encoding="utf-8")), batch, candidate)
            except (KeyError, TypeError, json.JSONDecodeError) as err:
                raise ValueError(f"{candidate}: not a figures file ({type(err).__name__}: {err})") from err
    return BUILT_IN
