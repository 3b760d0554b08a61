"""The measurement code: benchmarks (``python -m jobs.bench_*``) and the GPU check (``python -m
jobs.gpu_check``). It lives in the checkout beside ``sembridge_ray/`` and is not installed with the
package; run it from the checkout's root."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The checkout's root (it holds ``benchmarks/`` and ``sembridge_ray/``)."""


def child_env() -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH``: a child ``python -m
    benchmarks.…`` imports the same benchmarks and package as its parent, whatever its working
    directory."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
