"""Reproduction plots at paper scale: one panel per method, CIs from the per-query scores,
degenerate baselines off the scale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sembridge_ray.recipes.reproduce import plots
from sembridge_ray.recipes.reproduce.cells import Cell, cell_paths, expand, source_dev_path
from sembridge_ray.recipes.reproduce.compare import PER_QUERY
from sembridge_ray.runtime.outputs import write_success

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
    # two methods: nothing to compare against
    assert plots.degenerate({"a": 0.6, "mean": 0.0}) == set()


def _paper_scale(root: Path) -> list[Cell]:
    cells = expand(MODELS, LANGS, ("sembridge", "focus", "wechsel", "mean", "random"), ("4",))
    rng = np.random.default_rng(0)
    for cell in cells:
        paths = cell_paths(root, cell)
        level = 0.01 if cell.method == "mean" else 0.6
        for stage in ("zero_shot", "finetuned"):
            out = paths.eval("miracl", stage)
            out.mkdir(parents=True)
            rows = "".join(
                f"q{i}\t{min(1.0, level * rng.uniform(0.5, 1.5)):.4f}\n" for i in range(50)
            )
            (out / PER_QUERY).write_text("query_id\tnDCG@10\n" + rows)
        paths.init.mkdir(parents=True)
        hist = {"1": 10, "2": 30, "3": 5} if cell.method == "sembridge" else {"10": 45}
        (paths.init / "init_report.json").write_text(json.dumps({"support_histogram": hist}))
    return cells


def test_paper_scale_plots_have_one_entry_per_method(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells = _paper_scale(tmp_path)
    figures: dict[str, Any] = {}
    monkeypatch.setattr(
        plots, "_save", lambda fig, path: figures.setdefault(Path(path).name, fig) and path
    )

    assert [p.name for p in plots.support_histograms(tmp_path, cells, tmp_path / "plots")] == [
        "support_sizes.png"
    ]
    panels = figures["support_sizes.png"].axes
    # one per method, whatever the number of cells (here 100, 20 per method)
    assert len(panels) == 5
    sembridge = next(ax for ax in panels if ax.get_title().startswith("sembridge α=4"))
    # 20 cells × (10, 30, 5): median 2, 90th percentile 3
    assert "median 2, p90 3" in sembridge.get_title()
    assert [round(b.get_height()) for b in sembridge.patches] == [200, 600, 100]

    assert [
        p.name for p in plots.before_after(tmp_path, cells, ["miracl"], tmp_path / "plots")
    ] == ["before_after_miracl.png"]
    fig = figures["before_after_miracl.png"]
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "sembridge α=4",
        "focus",
        "wechsel",
        "random",
    ]
    assert ax.get_ylim()[0] > 0.2  # the degenerate `mean` baseline does not squash the scale
    assert any("off scale (degenerate): mean:" in t.get_text() for t in fig.texts)
    # error bars: one (zero-shot, fine-tuned) pair per shown method, each around its pooled mean
    assert len(ax.containers) == 2 and all(len(c.lines[0].get_xdata()) == 4 for c in ax.containers)


def test_alpha_ablation_at_paper_scale_draws_a_mean_per_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def _dev_run(root: Path, cell: Cell, curve: list[tuple[int, float]]) -> None:
    """A fine-tuning's metrics.jsonl: loss lines every 10 steps, the dev keys on the evaluated
    steps' lines."""
    folder = cell_paths(root, cell).finetune("sick")
    folder.mkdir(parents=True)
    dev = dict(curve)
    lines = [{"step": 0, "dev_nDCG@10": dev[0], "dev_active_dims_q": 30.0}] if 0 in dev else []
    for step in range(10, max(dev) + 1, 10):
        line: dict[str, float] = {"step": step, "loss": 1.0 / step}
        if step in dev:
            line |= {"dev_nDCG@10": dev[step], "dev_active_dims_q": 30.0, "dev_active_dims_d": 40.0}
        lines.append(line)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_band_is_mean_min_max_over_the_curves_holding_each_step() -> None:
    steps, mean, low, high = plots.band([[(0, 0.2), (10, 0.5), (20, 0.6)], [(0, 0.4), (10, 0.7)]])
    assert steps == [0, 10, 20]
    assert (
        mean == pytest.approx([0.3, 0.6, 0.6])
        and low == [0.2, 0.5, 0.6]
        and high == [0.4, 0.7, 0.6]
    )


def test_convergence_plot_has_a_panel_per_setting_a_line_per_method_and_the_source_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells = expand(
        ("src",), ("en-bpe", "en-roberta", "en-kobigbird"), ("sembridge", "focus"), ("4",)
    )
    curves = {
        "sembridge": [(0, 0.3), (10, 0.6), (20, 0.65)],
        "focus": [(0, 0.25), (10, 0.5), (20, 0.62)],
    }
    for cell in cells:
        if cell.language != "en-kobigbird":  # fine-tuned without a development set: no panel
            _dev_run(tmp_path, cell, curves[cell.method])
    source = source_dev_path(tmp_path, "src")
    source.mkdir(parents=True)
    (source / "metrics.json").write_text(json.dumps({"nDCG@10": 0.72}))
    write_success(source)
    panels = plots.dev_curves(tmp_path, cells, ["sick"])
    assert list(panels) == [("src", "en-bpe", "sick"), ("src", "en-roberta", "sick")]
    assert panels[("src", "en-bpe", "sick")] == {
        "sembridge α=4": [curves["sembridge"]],
        "focus": [curves["focus"]],
    }

    figures: dict[str, Any] = {}
    monkeypatch.setattr(
        plots, "_save", lambda fig, path: figures.setdefault(Path(path).name, fig) and path
    )
    assert [p.name for p in plots.convergence(tmp_path, cells, ["sick"], tmp_path / "plots")] == [
        "convergence.png"
    ]
    axes = figures["convergence.png"].axes
    assert [ax.get_title() for ax in axes] == ["src → en-bpe on sick", "src → en-roberta on sick"]
    lines = {line.get_label(): line for line in axes[0].get_lines()}
    assert sorted(lines) == ["focus", "sembridge α=4", "source, own tokenizer (0.720)"]
    assert list(lines["focus"].get_xdata()) == [0, 10, 20] and list(lines["focus"].get_ydata()) == [
        0.25,
        0.5,
        0.62,
    ]
    assert list(lines["source, own tokenizer (0.720)"].get_ydata()) == [0.72, 0.72]  # horizontal
    assert not axes[0].collections  # one run per method: no band
    # step 0's line holds dev keys, no loss
    plots.learning_curves(tmp_path, cells, ["sick"], tmp_path / "plots")
    (loss,) = figures["learning_src_en-bpe_sick.png"].axes
    assert [list(line.get_xdata()) for line in loss.get_lines()] == [[10, 20], [10, 20]]


def test_several_runs_of_a_method_in_a_setting_are_a_mean_with_its_band(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [[(0, 0.2), (10, 0.5)], [(0, 0.4), (10, 0.7)], [(0, 0.3), (10, 0.6)]]  # e.g. three seeds
    monkeypatch.setattr(
        plots, "dev_curves", lambda *_: {("src", "ko", "sick"): {"sembridge α=4": runs}}
    )
    figures: dict[str, Any] = {}
    monkeypatch.setattr(
        plots, "_save", lambda fig, path: figures.setdefault(Path(path).name, fig) and path
    )
    plots.convergence(tmp_path, [], ["sick"], tmp_path)
    (ax,) = figures["convergence.png"].axes
    (line,) = ax.get_lines()
    assert line.get_label() == "sembridge α=4 (mean of 3, min–max)"
    assert list(line.get_ydata()) == pytest.approx([0.3, 0.6])
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.2) and ys.max() == pytest.approx(0.7)
