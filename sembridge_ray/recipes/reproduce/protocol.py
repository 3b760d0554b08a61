"""The convergence protocol: can the grid answer "faster and more stable convergence"?

Every fine-tuning is scored on its language's development set at log-spaced steps (the preset's
``finetune.eval_at``, e.g. 0, 1, 2, 4, 8, 16, 32), over several seeds. Per (model, language,
dataset) and method, from the seed-mean dev curve:

- **two targets fixed before the run and common to every method**: 0.95 of the best method's final
  mean (the highest seed-mean final score of any method in that setting), and BM25's score on the
  same development queries; the first evaluated step at which the method's seed-mean curve reaches
  each ("never" where it does not);
- **the area under the curve** on the log-step axis (trapezoids over ``log2(1 + step)``, divided by
  the span): the mean dev score across training with every log-spaced interval weighed alike, so
  the first steps count as much as the last ones;
- **the spread across seeds**: the standard deviation of the final score and of the area.

``convergence.csv`` holds one row per method and setting; results.md shows them."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from sembridge_ray.recipes.reproduce.cells import Cell, bm25_path
from sembridge_ray.recipes.reproduce.plots import Curve, band, dev_curves, finished_ndcg

SHARE = 0.95
NEVER = "never"
COLUMNS = [
    "model",
    "language",
    "dataset",
    "method",
    "seeds",
    "steps",
    "curve",
    "final_mean",
    "final_sd",
    "auc_log_mean",
    "auc_log_sd",
    "target_95",
    "steps_to_95",
    "bm25_dev",
    "steps_to_bm25",
]
Row = dict[str, str | float | int]


def log_auc(curve: Curve) -> float:
    """The mean score of ``curve`` over ``log2(1 + step)`` (trapezoids / span; one point: its
    score)."""
    if len(curve) == 1:
        return curve[0][1]
    xs = [math.log2(1 + step) for step, _ in curve]
    pairs = itertools.pairwise(zip(xs, (score for _, score in curve), strict=True))
    return sum((x1 - x0) * (a + b) / 2 for (x0, a), (x1, b) in pairs) / (xs[-1] - xs[0])


def first_step(steps: Sequence[int], scores: Sequence[float], target: float) -> int | str:
    """The first step whose score reaches ``target``; :data:`NEVER` when none does."""
    return next((s for s, v in zip(steps, scores, strict=True) if v >= target), NEVER)


def _sd(values: Sequence[float]) -> float | str:
    return statistics.stdev(values) if len(values) > 1 else ""


def protocol_rows(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], dev_split: str
) -> list[Row]:
    """One row per (model, language, dataset, method) whose fine-tunings were scored on a
    development set (see the module docstring)."""
    rows: list[Row] = []
    for (model, language, dataset), methods in dev_curves(output, cells, datasets).items():
        means = {label: band(curves) for label, curves in methods.items()}
        target = SHARE * max(mean[-1] for _, mean, _, _ in means.values())
        # BM25 on the language's development queries (the ones fine-tuning scores), once it has run
        bm25 = finished_ndcg(bm25_path(output, language, "dev", dev_split))
        for label, curves in methods.items():
            steps, mean, _, _ = means[label]
            finals, areas = [c[-1][1] for c in curves], [log_auc(c) for c in curves]
            rows.append(
                {
                    "model": model,
                    "language": language,
                    "dataset": dataset,
                    "method": label,
                    "seeds": len(curves),
                    "steps": ",".join(map(str, steps)),
                    "curve": ",".join(f"{v:.4f}" for v in mean),
                    "final_mean": statistics.fmean(finals),
                    "final_sd": _sd(finals),
                    "auc_log_mean": statistics.fmean(areas),
                    "auc_log_sd": _sd(areas),
                    "target_95": target,
                    "steps_to_95": first_step(steps, mean, target),
                    "bm25_dev": "" if bm25 is None else bm25,
                    "steps_to_bm25": "" if bm25 is None else first_step(steps, mean, bm25),
                }
            )
    return rows


def markdown(rows: Sequence[Mapping[str, str | float | int]], languages: Sequence[str]) -> str:
    """results.md's convergence section: per (dataset, model), rows method, columns languages, each
    cell ``final ±sd · steps to 95% of the best final / to BM25 · log-step AUC ±sd``."""
    if not rows:
        return ""
    out = [
        "## Convergence (development nDCG@10 at log-spaced steps, seed means)",
        "",
        "Each cell: final ±sd over seeds · the first step reaching 95% of the best method's final mean / "
        "reaching BM25 on the same development queries (never: not within the run) · area under the "
        "curve on the log-step axis ±sd. Targets are common to every method of a language.",
        "",
    ]
    groups: dict[tuple[str, str], dict[str, dict[str, Mapping[str, str | float | int]]]] = {}
    for r in rows:
        key = (str(r["dataset"]), str(r["model"]))
        groups.setdefault(key, {}).setdefault(str(r["method"]), {})[str(r["language"])] = r
    for (dataset, model), table in sorted(groups.items()):
        out += [
            f"### {dataset} — {model}",
            "",
            "| method | " + " | ".join(languages) + " |",
            "|---|" + "---|" * len(languages),
        ]
        for method, by_lang in sorted(table.items()):
            out.append(
                f"| {method} | " + " | ".join(_cell(by_lang.get(lang)) for lang in languages) + " |"
            )
        targets = []
        for lang in languages:
            found = [t[lang] for t in table.values() if lang in t]
            if found:
                bm25 = found[0]["bm25_dev"]
                targets.append(
                    f"{lang}: 95% target {float(found[0]['target_95']):.3f}"
                    + (f", BM25 {float(bm25):.3f}" if bm25 != "" else "")
                )
        out += ["", "Targets: " + "; ".join(targets) + ".", ""]
    return "\n".join(out)


def _cell(row: Mapping[str, str | float | int] | None) -> str:
    if row is None:
        return "–"

    def pm(mean: str, sd: str) -> str:
        value = f"{float(row[mean]):.3f}"
        return value + (f" ±{float(row[sd]):.3f}" if row[sd] != "" else "")

    reached = (
        f"{row['steps_to_95']} / {row['steps_to_bm25'] if row['steps_to_bm25'] != '' else '–'}"
    )
    return f"{pm('final_mean', 'final_sd')} · {reached} · {pm('auc_log_mean', 'auc_log_sd')}"
