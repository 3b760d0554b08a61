"""The MaLSTM report: metrics, prediction TSVs (read back for the metrics, so they recompute
exactly), report.md beside the paper's rows, and the two plots."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

# the columns, re-exported (``X as X``): callers read them as ``report.GOLD``, ...
from sembridge_ray.data.schema import CALIBRATED as CALIBRATED
from sembridge_ray.data.schema import GOLD as GOLD
from sembridge_ray.data.schema import PAIR_ID
from sembridge_ray.data.schema import RAW as RAW
from sembridge_ray.runtime.outputs import atomic_path
from sembridge_ray.siamese.records import Metrics, Report, SplitMetrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PAPER: dict[str, Metrics] = {
    "MaLSTM": {"pearson": 0.8822, "spearman": 0.8345, "mse": 0.2286},
    "Tree-LSTM": {"pearson": 0.8676},
    "ConvNet": {"pearson": 0.8686},
    "skip-thought": {"pearson": 0.8655},
}
"""Mueller & Thyagarajan (AAAI 2016), Table 1: SICK test."""


def metrics(pred: np.ndarray, gold: np.ndarray) -> Metrics:
    """pred (n,), gold (n,) -> Pearson r, Spearman ρ and MSE."""
    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    return {
        "pearson": float(stats.pearsonr(pred, gold)[0]),
        "spearman": float(stats.spearmanr(pred, gold)[0]),
        "mse": float(np.mean((pred - gold) ** 2)),
    }


def write_tsv(path: Path, pair_ids: Sequence[str], columns: Mapping[str, np.ndarray]) -> None:
    """``pair_ID`` then ``columns``; floats as ``repr`` (the shortest text that reads back as the
    same float64)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow([PAIR_ID, *columns])
        for i, pid in enumerate(pair_ids):
            writer.writerow([pid, *(repr(float(col[i])) for col in columns.values())])


def read_tsv(path: Path) -> tuple[list[str], dict[str, np.ndarray]]:
    """(pair ids, column name -> float64 values) of a file written by :func:`write_tsv`."""
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    header, body = rows[0], rows[1:]
    return [r[0] for r in body], {
        name: np.array([float(r[i]) for r in body])
        for i, name in enumerate(header)
        if name != PAIR_ID
    }


def split_metrics(columns: Mapping[str, np.ndarray]) -> SplitMetrics:
    """{raw: metrics, calibrated: metrics (when the column is there)} against the gold column."""
    return {
        name: metrics(columns[name], columns[GOLD]) for name in (RAW, CALIBRATED) if name in columns
    }


def mean_std(values: Sequence[float]) -> Metrics:
    arr = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
        "n": len(arr),
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    text = f"{value:.4f}"
    return text[1:] if text.startswith("0.") else text


def _row(name: str, m: Mapping[str, float]) -> str:
    return (
        f"| {name} | {_fmt(m.get('pearson'))} | {_fmt(m.get('spearman'))} | {_fmt(m.get('mse'))} |"
    )


def render_markdown(report: Report) -> str:
    """report.md: this run's rows next to the paper's, then the data counts and the calibration (when
    a calibrator was fitted)."""
    lines = [
        "# MaLSTM on SICK 2014 (test, 4,927 pairs)",
        "",
        "| model | Pearson r | Spearman ρ | MSE |",
        "|---|---|---|---|",
        *(_row(f"{name} (paper)", m) for name, m in PAPER.items()),
        *_run_rows(report),
    ]
    lines += [
        "",
        "Validation (30% of SICK train+trial, never trained on; its calibrated figures are the calibrator's "
        "in-sample fit, its leave-one-out MSE is under Calibration): "
        + "; ".join(
            f"{k} r {_fmt(v['pearson'])}, MSE {_fmt(v['mse'])}"
            for k, v in report["validation"].items()
        ),
        "",
    ]
    if report.get("vectors"):
        lines += ["## Word vectors", "", *(f"- {k}: {v}" for k, v in report["vectors"].items()), ""]
    lines += ["## Data", "", *(f"- {k}: {v}" for k, v in report["data"].items()), ""]
    if (cal := report["calibration"]).get("bandwidth") is not None:
        lines += [
            "## Calibration",
            "",
            f"statsmodels KernelReg (local linear, Gaussian kernel) on {cal['n']} "
            f"validation predictions; bandwidth {cal['bandwidth']:.5f} ({cal['method']}), leave-one-out MSE "
            f"{cal['loo_mse']:.5f}; test predictions clipped to [1, 5].",
            "",
            "![calibration](calibration.png)",
            "",
        ]
    lines += ["![scatter](scatter.png)", ""]
    return "\n".join(lines)


def _run_rows(report: Report) -> list[str]:
    """This run's table rows: the best restart, the mean ± std over the restarts, the ensemble if
    any."""
    n_seeds = len(report["seeds"])
    lines = [
        _row(
            f"this run, {kind}: restart seed {report['best_seed']}, best of {n_seeds} by validation MSE",
            m,
        )
        for kind, m in report["test"].items()
    ]
    for kind in report["test"]:
        cells = [report["seed_summary"][f"test_{kind}_{k}"] for k in ("pearson", "spearman", "mse")]
        lines.append(
            f"| mean ± std over {n_seeds} restarts, {kind} | "
            + " | ".join(f"{_fmt(c['mean'])} ± {c['std']:.4f}" for c in cells)
            + " |"
        )
    if ensemble := report.get("ensemble"):
        lines.append(
            _row(
                "mean of the restarts' predictions, calibrated (not the paper's method)",
                ensemble["test"][CALIBRATED],
            )
        )
    return lines


def plot_calibration(
    path: Path, raw: np.ndarray, gold: np.ndarray, curve_x: np.ndarray, curve_y: np.ndarray
) -> None:
    """Validation raw scores vs gold, with the fitted calibration curve."""
    fig, ax = _figure()
    ax.scatter(raw, gold, s=4, alpha=0.3, label="validation pairs")
    ax.plot(curve_x, curve_y, color="C3", lw=2, label="calibration (KernelReg ll)")
    ax.plot([1, 5], [1, 5], color="grey", lw=1, ls="--", label="identity")
    ax.set(
        xlabel="raw MaLSTM score",
        ylabel="gold relatedness",
        title="Calibration on the validation split",
    )
    ax.legend(loc="upper left")
    _save(fig, path)


def plot_scatter(path: Path, gold: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
    """Test predictions (raw, calibrated) against gold."""
    fig, ax = _figure()
    for i, (name, pred) in enumerate(columns.items()):
        ax.scatter(
            gold,
            pred,
            s=4,
            alpha=0.3,
            color=f"C{i}",
            label=f"{name} (r {metrics(pred, gold)['pearson']:.4f})",
        )
    ax.plot([1, 5], [1, 5], color="grey", lw=1, ls="--")
    ax.set(xlabel="gold relatedness", ylabel="prediction", title="SICK test: prediction vs gold")
    ax.legend(loc="upper left")
    _save(fig, path)


def _figure() -> tuple[Figure, Axes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 5), dpi=110)


def _save(fig: Figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
