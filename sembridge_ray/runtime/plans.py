"""The dry run's plan, one schema for every job that has one (``init --dry-run``, ``reproduce
--dry-run``): cells, the stages of each with whether their output is already complete, and a
GPU-hour estimate with its source.

``--dry-run`` prints :func:`plan_table` (a summary a person reads); ``--dry-run --json`` prints the
plan itself as JSON, in the key order of :class:`Plan`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, TypedDict

StageState = Literal["done", "todo", "refused"]
"""``done``: complete on disk (a rerun checks its checksums and skips it); ``todo``: to run (or
redo, with ``--overwrite``); ``refused``: its output holds a run with other settings, so the run
(without ``--overwrite``) refuses to start. Predicted from the settings alone: a changed input is
found when the run identifies it."""


class PlannedCell(TypedDict):
    """One cell of the plan."""

    cell: str
    model: str
    language: str
    method: str
    alpha: str
    target_tokenizer: str
    bridge_model: str
    datasets: dict[str, str]
    """Dataset -> what it loads from the hub for the cell's language."""
    stages: dict[str, StageState]
    """Stage -> ``done``, ``todo`` or ``refused`` (:data:`StageState`)."""
    refusals: dict[str, str]
    """Stage -> the settings that differ from its output's run (old → new), for the ``refused``
    ones."""
    estimate_gpu_hours: float
    """The ``todo`` stages' estimate."""


class Assumptions(TypedDict):
    bridge_strings_per_s: float
    docs_per_s: float
    seconds_per_step: float
    note: str


class Plan(TypedDict):
    """A dry run's plan (``--dry-run --json`` prints it, in this key order)."""

    job: str
    cells: list[PlannedCell]
    total_cells: int
    stages_done: int
    stages_todo: int
    stages_refused: int
    estimate_gpu_hours: float
    """GPU-hours of the stages still to run."""
    estimate_wall_hours_at_concurrency: dict[str, float]
    """Concurrent cells (as a string) -> wall-clock hours."""
    figures_source: str
    """Where the throughputs behind the estimate come from (the GPU check's measured figures, or
    built-in ones)."""
    assumptions: Assumptions


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """What a dry run returns: the plan, and whether to print it as JSON."""

    plan: Plan
    json: bool = False


def render_plan(result: PlanResult) -> str:
    return json.dumps(result.plan, indent=2) if result.json else plan_table(result.plan)


def plan_table(plan: Plan) -> str:
    """The plan as a person reads it: one row per cell, then the totals and where the estimate comes
    from."""
    rows = [["cell", "language", "method", "α", "stages done/todo", "GPU-h"]]
    for c in plan["cells"]:
        done = sum(state == "done" for state in c["stages"].values())
        counts, hours = f"{done}/{len(c['stages']) - done}", f"{c['estimate_gpu_hours']:.2f}"
        rows.append(
            [c["cell"], c["language"] or "-", c["method"], c["alpha"] or "-", counts, hours]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = 4  # text columns; the counts are right-aligned

    def line(row: list[str]) -> str:
        cells = enumerate(zip(row, widths, strict=True))
        return "  ".join(v.ljust(w) if i < left else v.rjust(w) for i, (v, w) in cells)

    lines = [line(r) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    (concurrent, wall), *_ = plan["estimate_wall_hours_at_concurrency"].items() or [("1", 0.0)]
    a = plan["assumptions"]
    lines += [
        "",
        f"{plan['job']} plan: {plan['total_cells']} cell(s), {plan['stages_done']} stage(s) done, "
        f"{plan['stages_todo']} to run"
        + (f", {plan['stages_refused']} refused" if plan["stages_refused"] else ""),
        f"estimate: {plan['estimate_gpu_hours']:g} GPU-hours to run, ~{wall:g} h wall at {concurrent} cell(s) at once "
        f"({a['note']})",
        f"figures: {plan['figures_source']} (bridge {a['bridge_strings_per_s']:g} strings/s, "
        f"{a['docs_per_s']:g} docs/s, {a['seconds_per_step']:g} s/step)",
        "nothing ran; --json prints every field (hub ids per cell), drop --dry-run to run",
    ]
    refused = [
        (c["cell"], stage, why) for c in plan["cells"] for stage, why in c["refusals"].items()
    ]
    if refused:
        lines += [
            "",
            "a run would refuse (their outputs hold runs with other settings; --overwrite redoes them):",
        ]
        lines += [f"  {cell}/{stage}: {why}" for cell, stage, why in refused[:10]]
        if len(refused) > 10:
            lines.append(f"  and {len(refused) - 10} more (--json lists them)")
    return "\n".join(lines)
