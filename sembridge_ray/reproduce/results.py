"""results.csv and results.md, rebuilt from the finished stage directories (so they are always
consistent)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from sembridge_ray.outputs import atomic_write_text, is_complete
from sembridge_ray.reproduce.cells import STAGES, Cell, cell_paths

COLUMNS = [
    "model",
    "language",
    "dataset",
    "method",
    "alpha",
    "stage",
    "ndcg@10",
    "r@100",
    "rr@10",
    "active_dims_q",
    "active_dims_d",
    "flops",
    "train_seconds",
    "train_steps",
    "cell",
    "dev_final",
    "steps_to_95",
    "dev_auc",
    "best_step",
]
"""The columns of results.csv; new ones are appended, so a reader of the older columns by position
still works."""
CONVERGENCE_KEYS = {"dev_final": "final", "steps_to_95": "steps_to_95", "dev_auc": "auc"}
"""results.csv column -> key of finetune.json's ``convergence`` (the dev curve's figures,
sparse.convergence)."""
METRIC_KEYS = {
    "ndcg@10": "nDCG@10",
    "r@100": "R@100",
    "rr@10": "RR@10",
    "active_dims_q": "mean_active_dims_query",
    "active_dims_d": "mean_active_dims_doc",
    "flops": "flops_per_pair",
}
FINETUNE_SUMMARY = "finetune.json"
Row = dict[str, str | float]
"""One line of results.csv: column -> value ("" where a stage recorded none)."""


def _json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _value(record: Mapping[str, object], key: str, default: str | float = "") -> str | float:
    """A number (or text) a stage's JSON records under ``key``: the evaluate job's metrics, the
    fine-tuning's summary hold plain numbers there."""
    return cast("str | float", record.get(key, default))


def collect(output: Path, cells: Sequence[Cell], datasets: Sequence[str]) -> list[Row]:
    """One row per finished (cell, dataset, stage)."""
    rows: list[Row] = []
    for cell in cells:
        paths = cell_paths(output, cell)
        for dataset in datasets:
            for stage in STAGES:
                folder = paths.eval(dataset, stage)
                if not is_complete(folder):
                    continue
                metrics = _json(folder / "metrics.json")
                train = (
                    _json(paths.finetune(dataset) / FINETUNE_SUMMARY)
                    if stage == "finetuned"
                    else {}
                )
                rows.append(
                    {
                        "model": cell.model,
                        "language": cell.language,
                        "dataset": dataset,
                        "method": cell.variant,
                        "alpha": cell.alpha_label,
                        "stage": stage,
                        **{col: _value(metrics, key) for col, key in METRIC_KEYS.items()},
                        "train_seconds": _value(train, "train_seconds", _value(train, "seconds")),
                        "train_steps": _value(train, "steps"),
                        "cell": cell.name,
                        **convergence_columns(train),
                    }
                )
    return rows


def convergence_columns(summary: Mapping[str, object]) -> Row:
    """A fine-tuning summary's dev-curve figures as results.csv columns: ``dev_final``,
    ``steps_to_95``, ``dev_auc`` (all "" without a scored development set) and ``best_step`` (the
    published step under ``select: best``, else "")."""
    figures = summary.get("convergence")
    figures = figures if isinstance(figures, Mapping) and figures.get("evaluations") else {}
    row: Row = {col: _number(figures.get(key)) for col, key in CONVERGENCE_KEYS.items()}
    best = summary.get("best")
    chosen = (
        best.get("step") if summary.get("select") == "best" and isinstance(best, Mapping) else None
    )
    return row | {"best_step": _number(chosen)}


def _number(value: object) -> str | float:
    """A recorded figure, or "" for none (absent, null, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return ""
    return value


def write_csv(
    rows: Sequence[Mapping[str, object]], path: Path, columns: Sequence[str] = COLUMNS
) -> None:
    """``rows`` as CSV with a header of ``columns``, written atomically."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) and not math.isnan(value) else "–"


def markdown(
    rows: Sequence[Mapping[str, str | float]],
    languages: Sequence[str],
    failures: dict[str, str] | None = None,
) -> str:
    """Paper-style tables: one per (dataset, stage); rows model x method(α); columns languages +
    average."""
    out = ["# Results (nDCG@10)", ""]
    groups: dict[tuple[str, str], dict[tuple[str, str, str], dict[str, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in rows:
        group = groups[(str(r["dataset"]), str(r["stage"]))]
        group[(str(r["model"]), str(r["method"]), str(r["alpha"]))][str(r["language"])] = float(
            r["ndcg@10"]
        )
    for (dataset, stage), table in sorted(
        groups.items(), key=lambda kv: (kv[0][0], STAGES.index(kv[0][1]))
    ):
        out += [
            f"## {dataset} — {stage.replace('_', '-')}",
            "",
            "| model | method | " + " | ".join(languages) + " | avg |",
            "|---|---|" + "---:|" * (len(languages) + 1),
        ]
        for (model, method, alpha), scores in sorted(table.items()):
            values = [scores.get(lang, math.nan) for lang in languages]
            done = [v for v in values if not math.isnan(v)]
            avg = sum(done) / len(done) if len(done) == len(values) else math.nan
            label = f"{method} (α={alpha})" if alpha else method
            out.append(
                f"| {model} | {label} | "
                + " | ".join(_fmt(v) for v in values)
                + f" | {_fmt(avg)} |"
            )
        out.append("")
    if failures:
        out += (
            ["## Failed cells", ""]
            + [f"- `{name}`: {err}" for name, err in sorted(failures.items())]
            + [""]
        )
    return "\n".join(out)


def convergence_markdown(
    rows: Sequence[Mapping[str, str | float]], languages: Sequence[str]
) -> str:
    """A results.md section where fine-tuning was scored on a development set as it trained: per
    dataset and model, rows method(α), columns languages, each cell ``final · steps to 95% · AUC``
    of the dev curve, and the mean AUC (the mean dev score across training: higher = better and
    sooner)."""
    tuned = [r for r in rows if r["stage"] == STAGES[1] and r.get("dev_auc") not in ("", None)]
    if not tuned:
        return ""
    out = [
        "## Convergence (development nDCG@10 while fine-tuning: final · steps to 95% of final · AUC)",
        "",
    ]
    groups: dict[tuple[str, str], dict[tuple[str, str], dict[str, Mapping[str, str | float]]]] = (
        defaultdict(lambda: defaultdict(dict))
    )
    for r in tuned:
        groups[(str(r["dataset"]), str(r["model"]))][(str(r["method"]), str(r["alpha"]))][
            str(r["language"])
        ] = r
    for (dataset, model), table in sorted(groups.items()):
        out += [
            f"### {dataset} — {model}",
            "",
            "| method | " + " | ".join(languages) + " | mean AUC |",
            "|---|" + "---|" * len(languages) + "---:|",
        ]
        for (method, alpha), by_lang in sorted(table.items()):
            cells, aucs = [], []
            for lang in languages:
                found = by_lang.get(lang)
                if found is None:
                    cells.append("–")
                    continue
                aucs.append(float(found["dev_auc"]))
                steps = found["steps_to_95"]
                cells.append(
                    f"{_fmt(float(found['dev_final']))} · {steps if steps != '' else '–'} · {_fmt(aucs[-1])}"
                )
            mean = sum(aucs) / len(aucs) if len(aucs) == len(languages) else math.nan
            label = f"{method} (α={alpha})" if alpha else method
            out.append(f"| {label} | " + " | ".join(cells) + f" | {_fmt(mean)} |")
        out.append("")
    return "\n".join(out)
