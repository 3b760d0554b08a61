"""Reproduction plots at paper scale: one panel per method, CIs from the per-query scores, degenerate baselines off
the scale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sembridge_ray.reproduce import plots
from sembridge_ray.reproduce.cells import Cell, cell_paths, expand
from sembridge_ray.reproduce.compare import PER_QUERY

MODELS = ("m1", "m2", "m3", "m4")
LANGS = ("ar", "ko", "ru", "hi", "zh")


def test_mean_ci_is_the_mean_inside_a_percentile_interval() -> None:
    rng = np.random.default_rng(3)
    values = rng.uniform(0, 1, 400)
    est = plots.mean_ci(values)
    assert est.mean == pytest.approx(values.mean()) and est.queries == 400
    # the bootstrap interval of a mean: about mean ± 1.96 standard errors
    se = values.std(ddof=1) / np.sqrt(len(values))
    assert est.low == pytest.approx(values.mean() - 1.96 * se, abs=0.25 * se)
    assert est.high == pytest.approx(values.mean() + 1.96 * se, abs=0.25 * se)
    flat = plots.mean_ci(np.full(5, 0.5))
    assert (flat.low, flat.mean, flat.high) == (0.5, 0.5, 0.5)


def test_degenerate_is_far_below_the_median() -> None:
    assert plots.degenerate({"a": 0.65, "b": 0.64, "c": 0.60, "mean": 0.008}) == {"mean"}
    assert plots.degenerate({"a": 0.65, "b": 0.30, "c": 0.60}) == set()  # 0.30 > 0.25 × 0.60
    assert plots.degenerate({"a": 0.6, "mean": 0.0}) == set()  # two methods: nothing to compare against


def _paper_scale(root: Path) -> list[Cell]:
    cells = expand(MODELS, LANGS, ("sembridge", "focus", "wechsel", "mean", "random"), ("4",))
    rng = np.random.default_rng(0)
    for cell in cells:
        paths = cell_paths(root, cell)
        level = 0.01 if cell.method == "mean" else 0.6
        for stage in ("zero_shot", "finetuned"):
            out = paths.eval("miracl", stage)
            out.mkdir(parents=True)
            rows = "".join(f"q{i}\t{min(1.0, level * rng.uniform(0.5, 1.5)):.4f}\n" for i in range(50))
            (out / PER_QUERY).write_text("query_id\tnDCG@10\n" + rows)
        paths.init.mkdir(parents=True)
        hist = {"1": 10, "2": 30, "3": 5} if cell.method == "sembridge" else {"10": 45}
        (paths.init / "init_report.json").write_text(json.dumps({"support_histogram": hist}))
    return cells


def test_paper_scale_plots_have_one_entry_per_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = _paper_scale(tmp_path)
    figures: dict[str, Any] = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.setdefault(Path(path).name, fig) and path)

    assert [p.name for p in plots.support_histograms(tmp_path, cells, tmp_path / "plots")] == ["support_sizes.png"]
    panels = figures["support_sizes.png"].axes
    assert len(panels) == 5  # one per method, whatever the number of cells (here 100, 20 per method)
    sembridge = next(ax for ax in panels if ax.get_title().startswith("sembridge α=4"))
    assert "median 2, p90 3" in sembridge.get_title()  # 20 cells × (10, 30, 5): median 2, 90th percentile 3
    assert [round(b.get_height()) for b in sembridge.patches] == [200, 600, 100]

    assert [p.name for p in plots.before_after(tmp_path, cells, ["miracl"], tmp_path / "plots")] == [
        "before_after_miracl.png"
    ]
    fig = figures["before_after_miracl.png"]
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["sembridge α=4", "focus", "wechsel", "random"]
    assert ax.get_ylim()[0] > 0.2  # the degenerate `mean` baseline does not squash the scale
    assert any("off scale (degenerate): mean:" in t.get_text() for t in fig.texts)
    # error bars: one (zero-shot, fine-tuned) pair per shown method, each around its pooled mean
    assert len(ax.containers) == 2 and all(len(c.lines[0].get_xdata()) == 4 for c in ax.containers)


def test_alpha_ablation_at_paper_scale_draws_a_mean_per_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures: list[Any] = []

    def save(fig: Any, path: Path) -> Path:
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", save)
    rng = np.random.default_rng(1)
    rows = [
        {"method": "sembridge", "alpha": a, "model": m, "language": lang, "dataset": "miracl", "stage": stage,
         "ndcg@10": f"{rng.uniform(0.3, 0.7):.4f}"}
        for m in MODELS for lang in LANGS for stage in ("zero_shot", "finetuned") for a in ("2", "4", "softmax")
    ]  # fmt: skip
    plots.alpha_ablation(rows, tmp_path)
    (ax,) = figures[0].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["finetuned: mean", "zero_shot: mean"]  # not 40 lines
    zero = [float(r["ndcg@10"]) for r in rows if r["stage"] == "zero_shot" and r["alpha"] == "4"]
    x, y = lines["zero_shot: mean"].get_data()
    assert list(x) == [1.0, 2.0, 4.0] and y[2] == pytest.approx(np.mean(zero))
