"""PNG plots of a reproduction: learning curves per method, the α ablation, init support-size histograms."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sembridge_ray.outputs import atomic_path
from sembridge_ray.reproduce.cells import Cell, cell_paths


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _label(cell: Cell) -> str:
    return f"{cell.method} α={cell.alpha_label}" if cell.alpha_label else cell.method


def _steps(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def learning_curves(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], rows: list[dict[str, Any]], plots: Path
) -> list[Path]:
    """Per (model, language, dataset): training loss vs step and nDCG@10 at step 0 and after fine-tuning."""
    ndcg = {(r["cell"], r["dataset"], r["stage"]): float(r["ndcg@10"]) for r in rows}
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in cells:
        groups[(cell.model, cell.language)].append(cell)
    written = []
    for (model, lang), members in groups.items():
        for dataset in datasets:
            fig, (ax_loss, ax_ndcg) = plt.subplots(1, 2, figsize=(11, 4))
            drawn = False
            for cell in members:
                history = _steps(cell_paths(output, cell).finetune(dataset) / "metrics.jsonl")
                if history:
                    ax_loss.plot([h["step"] for h in history], [h["loss"] for h in history], label=_label(cell))
                    drawn = True
                points = [(0, ndcg.get((cell.name, dataset, "zero_shot")))]
                if history:
                    points.append((history[-1]["step"], ndcg.get((cell.name, dataset, "finetuned"))))
                points = [(s, v) for s, v in points if v is not None]
                if points:
                    ax_ndcg.plot(*zip(*points, strict=True), marker="o", label=_label(cell))
                    drawn = True
            if not drawn:
                plt.close(fig)
                continue
            ax_loss.set(title="training loss", xlabel="step", ylabel="InfoNCE + FLOPs")
            ax_ndcg.set(title="nDCG@10 (step 0 = zero-shot)", xlabel="step", ylabel="nDCG@10")
            ax_loss.legend(fontsize=7)
            ax_ndcg.legend(fontsize=7)
            fig.suptitle(f"{model} → {lang} on {dataset}")
            written.append(_save(fig, plots / f"learning_{Path(model).name}_{lang}_{dataset}.png"))
    return written


def alpha_ablation(rows: list[dict[str, Any]], plots: Path) -> list[Path]:
    """nDCG@10 of SemBridge against α (softmax = α 1), one line per (model, language, dataset, stage)."""
    series: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["method"] == "sembridge" and r["alpha"]:
            alpha = 1.0 if r["alpha"] == "softmax" else float(r["alpha"])
            series[(Path(r["model"]).name, r["language"], r["dataset"], r["stage"])].append(
                (alpha, float(r["ndcg@10"]))
            )
    if not any(len(points) > 1 for points in series.values()):
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, points in sorted(series.items()):
        ax.plot(*zip(*sorted(points), strict=True), marker="o", label=" / ".join(key))
    ax.set(title="SemBridge α ablation (α=1: softmax)", xlabel="α", ylabel="nDCG@10")
    ax.legend(fontsize=6)
    return [_save(fig, plots / "alpha_ablation.png")]


def support_histograms(output: Path, cells: Sequence[Cell], plots: Path) -> list[Path]:
    """Non-zero weights per bridged token, from each cell's init_report.json, overlaid per method."""
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for cell in cells:
        report = cell_paths(output, cell).init / "init_report.json"
        hist = json.loads(report.read_text()).get("support_histogram", {}) if report.is_file() else {}
        if hist:
            sizes = sorted(int(k) for k in hist)
            # markers: a method with one support size (wechsel: always top_k) is a single point
            ax.step(
                sizes,
                [hist[str(s)] for s in sizes],
                where="mid",
                marker="o",
                markersize=3,
                label=f"{_label(cell)} ({cell.language})",
            )
            drawn = True
    if not drawn:
        plt.close(fig)
        return []
    ax.set(
        title="init support sizes", xlabel="source tokens with non-zero weight", ylabel="bridged tokens", xscale="log"
    )
    ax.legend(fontsize=6)
    return [_save(fig, plots / "support_sizes.png")]
