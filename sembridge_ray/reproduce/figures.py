"""The throughputs the reproduction plan divides by: rough built-in figures, or the ones a GPU check measured.

``bash cluster/local.sh gpu-check`` writes its measurements to :data:`DEFAULT_PATH` (or to the file named by
``SEMBRIDGE_GPU_FIGURES``); the plan reads that file when it exists and says which figures it used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "SEMBRIDGE_GPU_FIGURES"
DEFAULT_PATH = Path("~/.cache/sembridge_ray/gpu_figures.json")


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


def from_measured(data: dict[str, Any], batch: int, path: Path) -> Figures:
    """A GPU check's file -> the plan's figures (seconds per step at ``batch`` from examples/s). These are the
    throughputs of the check's miniature (all-MiniLM-L6-v2 on SICK sentences), so they run faster than the
    paper's models would: the source line says so."""
    rates = {k: float(data[k]) for k in ("bridge_strings_per_s", "docs_per_s", "train_examples_per_s")}
    if min(rates.values()) <= 0:
        raise ValueError(f"{path}: every throughput must be > 0 ({rates})")
    return Figures(
        bridge_strings_per_s=rates["bridge_strings_per_s"],
        docs_per_s=rates["docs_per_s"],
        seconds_per_step=batch / rates["train_examples_per_s"],
        source=f"measured by the GPU check on {data['gpu']} with {data['model']} ({path}); the paper's larger "
        "models are slower",
    )


def load_figures(batch: int, path: Path | None = None) -> Figures:
    """The measured figures at ``path`` (default :func:`figures_path`) when that file exists, else :data:`BUILT_IN`.
    A file that exists but cannot be read is an error naming it, never silently replaced."""
    path = figures_path() if path is None else path
    if not path.is_file():
        return BUILT_IN
    try:
        return from_measured(json.loads(path.read_text(encoding="utf-8")), batch, path)
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a GPU check's figures file ({type(err).__name__}: {err})") from err
