"""PNG plots of a reproduction: nDCG@10 before/after fine-tuning with CIs, learning curves, dev-set
convergence, the α ablation, init support sizes per method."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sembridge_ray.recipes.reproduce.cells import STAGES, Cell, cell_paths, source_dev_path
from sembridge_ray.recipes.reproduce.compare import PER_QUERY, percentile_ci, read_per_query
from sembridge_ray.runtime.outputs import atomic_path, is_complete
from sembridge_ray.sparse.convergence import dev_curve

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DEGENERATE_RATIO = 0.25
MAX_LINES = 8
"""More series than this are summarised (mean and range) instead of drawn one by one."""
PANEL_COLUMNS = 4
Curve = list[tuple[int, float]]
"""A dev curve: (step, dev nDCG@10) at each evaluated step, in step order."""
Panel = tuple[str, str, str]
"""One setting of the convergence plot: (model, language, dataset)."""
X = TypeVar("X", int, float)


def _save(fig: Figure, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _label(cell: Cell) -> str:
    return f"{cell.variant} α={cell.alpha_label}" if cell.alpha_label else cell.variant


def _steps(path: Path) -> list[dict[str, float]]:
    """The fine-tuning's metrics.jsonl: one row of numbers per logged step ([] before it has
    one)."""
    if not path.is_file():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def learning_curves(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], plots: Path
) -> list[Path]:
    """Per (model, language, dataset): training loss against step, one line per method (nDCG@10
    before and after is :func:`before_after`)."""
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in cells:
        groups[(cell.model, cell.language)].append(cell)
    written = []
    for (model, lang), members in groups.items():
        for dataset in datasets:
            fig, ax = plt.subplots(figsize=(6, 4))
            for cell in members:
                history = _steps(cell_paths(output, cell).finetune(dataset) / "metrics.jsonl")
                # not step 0's line: dev scores before training
                history = [h for h in history if "loss" in h]
                if history:
                    ax.plot(
                        [h["step"] for h in history],
                        [h["loss"] for h in history],
                        label=_label(cell),
                    )
            if not ax.lines:
                plt.close(fig)
                continue
            ax.set(
                title=f"{model} → {lang} on {dataset}",
                xlabel="step",
                ylabel="training loss (InfoNCE + FLOPs)",
            )
            ax.legend(fontsize=7)
            written.append(_save(fig, plots / f"learning_{Path(model).name}_{lang}_{dataset}.png"))
    return written


def dev_curves(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str]
) -> dict[Panel, dict[str, list[Curve]]]:
    """Per setting (model, language, dataset), in cell order: method label -> the dev curves of its
    fine-tunings (one per cell today; several where runs of one method share a setting, e.g. seeds).
    Runs without a scored development set are left out, and so is a setting with none."""
    panels: dict[Panel, dict[str, list[Curve]]] = {}
    for cell in cells:
        for seed in range(cell.seeds):
            for dataset in datasets:
                folder = cell_paths(output, cell, seed).finetune(dataset)
                curve = dev_curve(_steps(folder / "metrics.jsonl"))
                if curve:
                    panels.setdefault((cell.model, cell.language, dataset), {}).setdefault(
                        _label(cell), []
                    ).append(curve)
    return panels


def band(
    curves: Sequence[Sequence[tuple[X, float]]],
) -> tuple[list[X], list[float], list[float], list[float]]:
    """Every step (or α) any curve evaluated, with the mean, min and max over the curves that hold
    that step."""
    at: dict[X, list[float]] = defaultdict(list)
    for curve in curves:
        for step, score in curve:
            at[step].append(score)
    steps = sorted(at)
    return (
        steps,
        [float(np.mean(at[s])) for s in steps],
        [min(at[s]) for s in steps],
        [max(at[s]) for s in steps],
    )


def finished_ndcg(folder: Path) -> float | None:
    """The nDCG@10 of the evaluation (or BM25 run) in ``folder``, None until it has finished."""
    if not is_complete(folder):
        return None
    return float(json.loads((folder / "metrics.json").read_text(encoding="utf-8"))["nDCG@10"])


def source_dev_score(output: Path, model: str) -> float | None:
    """The source model's own dev nDCG@10 (:func:`~sembridge_ray.recipes.reproduce.cells.source_dev_path`),
    None until that evaluation has finished."""
    return finished_ndcg(source_dev_path(output, model))


def convergence(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], plots: Path
) -> list[Path]:
    """``convergence.png``: dev nDCG@10 against the step, one panel per setting, one line per method
    (several runs of a method: their mean with the min–max band), the source model's own dev score
    as a dashed line."""
    panels = dev_curves(output, cells, datasets)
    if not panels:
        return []
    columns = min(len(panels), PANEL_COLUMNS)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for ax, ((model, lang, dataset), methods) in zip(axes.flat, panels.items(), strict=False):
        for label, curves in methods.items():
            steps, mean, low, high = band(curves)
            if len(curves) == 1:
                ax.plot(steps, mean, marker=".", label=label)
            else:
                (line,) = ax.plot(
                    steps, mean, marker=".", label=f"{label} (mean of {len(curves)}, min–max)"
                )
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
        if (score := source_dev_score(output, model)) is not None:
            ax.axhline(
                score,
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"source, own tokenizer ({score:.3f})",
            )
        ax.set(
            title=f"{Path(model).name} → {lang} on {dataset}", xlabel="step", ylabel="dev nDCG@10"
        )
        ax.legend(fontsize=6)
    for ax in axes.flat[len(panels) :]:
        ax.remove()
    fig.tight_layout()
    return [_save(fig, plots / "convergence.png")]


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Mean per-query nDCG@10 of one method and stage over every cell and query, with a 95%
    bootstrap interval."""

    mean: float
    low: float
    high: float
    queries: int


def mean_ci(values: np.ndarray, resamples: int = 2000, seed: int = 0) -> Estimate:
    """The mean of ``values`` with its 95% percentile bootstrap interval (scipy)."""
    values = np.asarray(values, np.float64)
    if len(values) < 2 or np.all(values == values[0]):
        mean = float(values.mean()) if len(values) else float("nan")
        return Estimate(mean=mean, low=mean, high=mean, queries=len(values))
    low, high = percentile_ci(values, resamples, np.random.default_rng(seed))
    return Estimate(mean=float(values.mean()), low=low, high=high, queries=len(values))


def degenerate(means: dict[str, float], ratio: float = DEGENERATE_RATIO) -> set[str]:
    """Methods whose every estimate is below ``ratio`` × the median of all methods' estimates (the
    ``mean`` baseline scores ~0): drawn off the scale and named under the axis, so they do not
    squash the others."""
    if len(means) < 3:
        return set()
    floor = ratio * float(np.median(list(means.values())))
    return {label for label, value in means.items() if value < floor}


def before_after(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], plots: Path
) -> list[Path]:
    """Per dataset: nDCG@10 zero-shot and after fine-tuning per method (pooled over the models and
    languages that ran), each with its 95% bootstrap interval over queries; degenerate baselines
    listed off the scale."""
    written = []
    labels = list(dict.fromkeys(_label(c) for c in cells))  # in cell order
    for dataset in datasets:
        estimates = _stage_estimates(output, cells, labels, dataset)
        if not estimates:
            continue
        best = {
            label: max(e.mean for (lb, _), e in estimates.items() if lb == label)
            for label, _ in estimates
        }
        off = degenerate(best)
        shown = [label for label in labels if label in best and label not in off]
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(shown) + 1.5), 4))
        for k, stage in enumerate(STAGES):
            _stage_errorbars(ax, k, stage, shown, estimates)
        ax.set_xticks(range(len(shown)), shown, rotation=30, ha="right")
        ax.set(title=f"nDCG@10 on {dataset}, 95% CI over queries", ylabel="nDCG@10")
        ax.legend(fontsize=8)
        if off:
            shift = {
                label: [
                    f"{estimates[(label, s)].mean:.3f}" for s in STAGES if (label, s) in estimates
                ]
                for label in off
            }
            note = "; ".join(
                f"{label}: {' → '.join(values)}" for label, values in sorted(shift.items())
            )
            fig.text(0.01, -0.1, f"off scale (degenerate): {note}", fontsize=7, va="top")
        written.append(_save(fig, plots / f"before_after_{dataset}.png"))
    return written


def _stage_estimates(
    output: Path, cells: Sequence[Cell], labels: Sequence[str], dataset: str
) -> dict[tuple[str, str], Estimate]:
    """(method label, stage) -> its estimate on ``dataset``, pooled over the cells whose per-query
    scores exist."""
    estimates: dict[tuple[str, str], Estimate] = {}
    for label in labels:
        for stage in STAGES:
            files = [
                cell_paths(output, c).eval(dataset, stage) / PER_QUERY
                for c in cells
                if _label(c) == label
            ]
            values = [v for f in files if f.is_file() for v in read_per_query(f).values()]
            if values:
                estimates[(label, stage)] = mean_ci(np.array(values))
    return estimates


def _stage_errorbars(
    ax: Axes,
    k: int,
    stage: str,
    shown: Sequence[str],
    estimates: Mapping[tuple[str, str], Estimate],
) -> None:
    """The ``k``-th stage's means and intervals, one point per shown method (offset within the
    method's slot)."""
    found = [(i, e) for i, label in enumerate(shown) if (e := estimates.get((label, stage)))]
    xs = [i + (k - 0.5) * 0.25 for i, _ in found]
    ys = [e.mean for _, e in found]
    errs = [[e.mean - e.low for _, e in found], [e.high - e.mean for _, e in found]]
    ax.errorbar(xs, ys, yerr=errs, fmt="o", capsize=3, label=stage.replace("_", "-"))


def alpha_ablation(rows: Sequence[Mapping[str, str | float]], plots: Path) -> list[Path]:
    """nDCG@10 of SemBridge against α (softmax = α 1): one line per (model, language, dataset,
    stage), or beyond ``MAX_LINES`` of them one line per stage (the mean) with the range shaded."""
    series: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["method"] == "sembridge" and r["alpha"]:
            alpha = 1.0 if r["alpha"] == "softmax" else float(r["alpha"])
            series[
                (Path(str(r["model"])).name, str(r["language"]), str(r["dataset"]), str(r["stage"]))
            ].append((alpha, float(r["ndcg@10"])))
    if not any(len(points) > 1 for points in series.values()):
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    if len(series) <= MAX_LINES:
        for key, points in sorted(series.items()):
            ax.plot(*zip(*sorted(points), strict=True), marker="o", label=" / ".join(key))
    # paper scale: per stage, the mean over (model, language, dataset) and the range, not 80 lines
    else:
        for stage in sorted({key[-1] for key in series}):
            alphas, mean, low, high = band([p for key, p in series.items() if key[-1] == stage])
            ax.plot(alphas, mean, marker="o", label=f"{stage}: mean")
            ax.fill_between(alphas, low, high, alpha=0.2)
    ax.set(title="SemBridge α ablation (α=1: softmax)", xlabel="α", ylabel="nDCG@10")
    ax.legend(fontsize=6)
    return [_save(fig, plots / "alpha_ablation.png")]


def support_histograms(output: Path, cells: Sequence[Cell], plots: Path) -> list[Path]:
    """Non-zero weights per bridged token, one panel per method (summed over that method's cells,
    however many models and languages ran), with the median and 90th percentile; readable at 1 cell
    or 100."""
    by_label: dict[str, dict[int, int]] = {}
    for cell in cells:
        report = cell_paths(output, cell).init / "init_report.json"
        hist = (
            json.loads(report.read_text()).get("support_histogram", {}) if report.is_file() else {}
        )
        if hist:
            total = by_label.setdefault(_label(cell), {})
            for size, count in hist.items():
                total[int(size)] = total.get(int(size), 0) + int(count)
    if not by_label:
        return []
    fig, axes = plt.subplots(
        1, len(by_label), figsize=(3.2 * len(by_label), 3), sharey=False, squeeze=False
    )
    for ax, (label, hist) in zip(axes[0], by_label.items(), strict=True):
        sizes = np.array(sorted(hist))
        counts = np.array([hist[s] for s in sizes])
        cum = np.cumsum(counts) / counts.sum()
        median, p90 = (int(sizes[np.searchsorted(cum, q)]) for q in (0.5, 0.9))
        ax.bar(range(len(sizes)), counts, color="tab:blue")
        ticks = np.unique(np.linspace(0, len(sizes) - 1, min(len(sizes), 6)).astype(int))
        ax.set_xticks(ticks, [str(sizes[t]) for t in ticks])
        ax.set(title=f"{label}\nmedian {median}, p90 {p90}", xlabel="support size")
    axes[0][0].set_ylabel("bridged tokens")
    fig.suptitle("source tokens with non-zero weight, per bridged target token", fontsize=9)
    fig.tight_layout()
    return [_save(fig, plots / "support_sizes.png")]
