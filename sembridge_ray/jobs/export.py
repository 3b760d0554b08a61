"""The ``export`` job's contract: write one fine-tuning checkpoint as a SparseEncoder directory, so any step can be
evaluated (``jobs.evaluate --model <output>``) or served.

    python -m jobs.export --checkpoint /shared/ft/ar/checkpoints/finetune-<run>/step_00000400 --output /tmp/step400
    sembridge export --checkpoint ... --output ... --select best    # the best evaluated weights it carries

The checkpoint must verify (every rank's manifest and checksums); the written model is the one ``jobs.finetune``
would have published from those weights (same lengths, pooling and model card). An existing output is refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from sembridge_ray.config import Config
from sembridge_ray.errors import InputError
from sembridge_ray.jobs import Flag, JobSpec


@dataclass(frozen=True, kw_only=True)
class ExportConfig(Config):
    """Write a fine-tuning checkpoint's weights as a SparseEncoder directory."""

    checkpoint: str = ""
    """A checkpoint directory of a fine-tuning run (``<storage>/<run>/step_<n>``)."""
    output: str = ""
    """The SparseEncoder directory to write (must not exist)."""
    select: Literal["last", "best"] = "last"
    """``last``: the checkpoint's own weights; ``best``: the best evaluated weights up to its step."""

    def require_inputs(self) -> None:
        for name in ("checkpoint", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required")


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    output: str
    step: int
    """The step whose weights were written."""
    checkpoint: str


FLAGS = (
    Flag(name="--checkpoint", key="checkpoint", required=True),
    Flag(name="--output", key="output", required=True),
    Flag(name="--select", key="select"),
)


def report(result: ExportResult) -> str:
    return json.dumps(asdict(result), indent=2) + f"\nmodel (step {result.step}): {result.output}"


JOB = JobSpec(
    name="export",
    summary="write a fine-tuning checkpoint as a SparseEncoder directory",
    entry="export",
    config=ExportConfig,
    flags=FLAGS,
    driver="sembridge_ray.distributed.finetune:run_export",
    report=report,
    description=__doc__ or "",
)
