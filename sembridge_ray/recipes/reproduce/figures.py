"""The throughputs the dry run's GPU-hour estimate divides by (``reproduce --dry-run``, ``init
--dry-run``): the built-in rough figures (:data:`BUILT_IN`), or those of a figures file given
explicitly (``--figures FILE``, the ``figures`` key); never a file a benchmark happened to leave
somewhere. The plan prints which it used.

A figures file is a JSON object holding the throughputs at the paper's shapes on one GPU,
``bridge_strings_per_s`` (bridge-encoder strings), ``docs_per_s`` (documents of 256 tokens encoded)
and ``train_examples_per_s`` (pairs of 64 + 256 tokens trained), each a number > 0; a throughput the
file lacks keeps its built-in figure, and the plan's source line names it. Optional: ``source``
(what measured them, printed with the plan), ``gpu_scale`` (a number > 0 every throughput is
multiplied by: a CPU measurement scaled to one GPU) and ``scaling`` (the assumption behind it). The
checkout's GPU check (``bash cluster/local.sh gpu-check``) and ``python -m jobs.bench_peers`` write
such files."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from sembridge_ray.runtime.errors import InputError

RATES = ("bridge_strings_per_s", "docs_per_s", "train_examples_per_s")


@dataclass(frozen=True, kw_only=True)
class Figures:
    bridge_strings_per_s: float
    docs_per_s: float
    seconds_per_step: float
    """At the plan's batch size."""
    source: str
    """Where the figures come from, printed with the plan."""


# One modern GPU (A100-class, bf16), rough: BGE-M3 on short token strings; BERT-base SPLADE at 256
# tokens; batch 64 x (64 + 256) tokens, BERT-base, bf16, incl. the FLOPs regulariser.
BUILT_IN = Figures(
    bridge_strings_per_s=3_000,
    docs_per_s=1_000,
    seconds_per_step=0.35,
    source="built-in rough figures (A100-class)",
)


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def read_figures(path: str | Path, batch: int) -> Figures:
    """The figures file at ``path`` (see the module docstring) -> the plan's figures, seconds per
    step at ``batch``. A file that is missing or is not a figures file is an
    :class:`~sembridge_ray.runtime.errors.InputError` naming it."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"figures {path}: cannot read it ({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise InputError(f"figures {path}: not JSON (not UTF-8 text: {err.reason})") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"figures {path}: not JSON ({err})") from err
    if not isinstance(data, dict) or not any(k in data for k in RATES):
        raise InputError(
            f"figures {path}: not a figures file (a JSON object with {', '.join(RATES)} expected)"
        )
    for key in (*RATES, "gpu_scale"):
        if key in data and not _positive(data[key]):
            raise InputError(f"figures {path}: {key} must be a number > 0, not {data[key]!r}")
    scale = float(data.get("gpu_scale", 1.0))
    rates = {k: float(data[k]) * scale for k in RATES if k in data}
    source = f"{data.get('source') or 'figures'} ({path})"
    if scale != 1.0:
        source += f"; {data.get('scaling') or f'scaled x {scale:g}'}"
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


def plan_figures(path: str, batch: int) -> Figures:
    """The figures a dry run divides by: the file at ``path`` when one is given, else
    :data:`BUILT_IN`."""
    return read_figures(path, batch) if path else BUILT_IN
