"""The reproduction's tables, rebuilt from the finished stage directories (so they are always
consistent): results.csv and results.md here; with them (:func:`rebuild`) the convergence protocol's
(:mod:`.protocol`), the paired comparisons (:mod:`.compare`) and the plots (:mod:`.plots`)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sembridge_ray import catalog
from sembridge_ray.recipes.reproduce import compare, plots, protocol
from sembridge_ray.recipes.reproduce.cells import (
    BM25,
    FUSED,
    STAGES,
    Cell,
    CellPaths,
    bm25_path,
    cell_paths,
    config_cells,
    source_test_path,
)
from sembridge_ray.runtime.outputs import atomic_write_text, is_complete
from sembridge_ray.sparse.convergence import QUERY_DIMS_BAND, query_collapse

if TYPE_CHECKING:
    from sembridge_ray.recipes.reproduce.config import ReproduceConfig

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
    "seed",
    "empty_share_q",
    "empty_share_d",
    "collapsed",
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
    "empty_share_q": "empty_share_query",
    "empty_share_d": "empty_share_doc",
}
MODEL_COLUMNS = ("active_dims_q", "active_dims_d", "flops", "empty_share_q", "empty_share_d")
"""Figures of a model's vectors: blank on a BM25 or fusion row."""
FINETUNE_SUMMARY = "finetune.json"
Row = dict[str, str | float]
"""One line of results.csv: column -> value ("" where a stage recorded none)."""


def _json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _value(record: Mapping[str, object], key: str, default: str | float = "") -> str | float:
    """What a stage's JSON (metrics, fine-tuning summary) records under ``key``."""
    return cast("str | float", record.get(key, default))


def collect(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], split: str = "test"
) -> list[Row]:
    """One row per finished (cell, seed, dataset, stage), one per finished fusion of it with BM25
    (``<method>+bm25``), and BM25's rows (``bm25``, the same figures at each stage of each model, so
    every stage's table is whole)."""
    rows: list[Row] = []
    for cell in cells:
        for seed in range(cell.seeds):
            paths = cell_paths(output, cell, seed)
            for dataset in datasets:
                for stage in STAGES:
                    rows += _stage_rows(cell, seed, paths, dataset, stage)
    for model, language in sorted({(c.model, c.language) for c in cells}):
        for dataset in datasets:
            folder = bm25_path(output, language, dataset, split)
            if is_complete(folder):
                rows += [_row(folder, model, language, dataset, BM25, "", s) for s in STAGES]
    return rows


def _stage_rows(cell: Cell, seed: int, paths: CellPaths, dataset: str, stage: str) -> list[Row]:
    """The rows of one seed's stage: the model's, and its fusion with BM25's."""
    folder, fused = paths.eval(dataset, stage), paths.fusion(dataset, stage)
    if not is_complete(folder):
        return []
    head = (cell.model, cell.language, dataset)
    train = _json(paths.finetune(dataset) / FINETUNE_SUMMARY) if stage == STAGES[1] else {}
    found = _row(folder, *head, cell.variant, cell.alpha_label, stage, vectors=True)
    dims = found["active_dims_q"]  # outside QUERY_DIMS_BAND: collapsed
    found |= {
        "train_seconds": _value(train, "train_seconds", _value(train, "seconds")),
        "train_steps": _value(train, "steps"),
        "cell": cell.name,
        **convergence_columns(train),
        "seed": seed,
        "collapsed": int(query_collapse(dims) is not None) if isinstance(dims, int | float) else "",
    }
    if not is_complete(fused):
        return [found]
    fusion = _row(fused, *head, cell.variant + FUSED, cell.alpha_label, stage)
    return [found, fusion | {"cell": cell.name, "seed": seed}]


def _row(folder: Path, *head: str, vectors: bool = False) -> Row:
    """The columns ``model`` .. ``stage`` (``head``), then the figures of ``folder``'s metrics; the
    figures of a model's vectors blank without one behind the row (BM25, a fusion)."""
    metrics = _json(folder / "metrics.json")
    row: Row = dict(zip(COLUMNS, head, strict=False))
    row |= {col: _value(metrics, key) for col, key in METRIC_KEYS.items()}
    return row if vectors else row | dict.fromkeys(MODEL_COLUMNS, "")


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


def _line(key: tuple[str, str, str], cells: Sequence[str]) -> str:
    """A table's row: the model, the method (with its α), ``cells``."""
    model, method, alpha = key
    return "| " + " | ".join([model, f"{method} (α={alpha})" if alpha else method, *cells]) + " |"


def _head(level: str, dataset: str, stage: str, columns: Sequence[str], rule: str) -> list[str]:
    """A (dataset, stage) table's heading, its header (model, method, ``columns``) and rule."""
    return [
        f"{level} {dataset} — {stage.replace('_', '-')}",
        "",
        _line(("model", "method", ""), columns),
        "|---|---|" + rule * len(columns),
    ]


def _order(key: tuple[str, str, str]) -> tuple[str, int, str, str]:
    """Per model: its methods first, then their fusions with BM25, then BM25."""
    model, method, alpha = key
    return model, 2 if method == BM25 else 1 if method.endswith(FUSED) else 0, method, alpha


def _mean_sd(values: Sequence[float]) -> str:
    """The mean, and with more than one seed its sample standard deviation."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return _fmt(mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.3f} ±{sd:.3f}"


Table = dict[tuple[str, str, str], dict[str, list[Mapping[str, str | float]]]]
"""(model, method, α) -> language -> the rows of its seeds."""


def _tables(rows: Sequence[Mapping[str, str | float]]) -> list[tuple[tuple[str, str], Table]]:
    """The rows per (dataset, stage), datasets in name order and stages in ``STAGES``'s."""
    groups: dict[tuple[str, str], Table] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in rows:
        key = (str(r["model"]), str(r["method"]), str(r["alpha"]))
        groups[(str(r["dataset"]), str(r["stage"]))][key][str(r["language"])].append(r)
    return sorted(groups.items(), key=lambda kv: (kv[0][0], STAGES.index(kv[0][1])))


def markdown(
    rows: Sequence[Mapping[str, str | float]],
    languages: Sequence[str],
    failures: dict[str, str] | None = None,
) -> str:
    """Paper-style tables: one per (dataset, stage); rows model × method(α) (each model's fusions
    with BM25, then BM25, after its methods); columns languages + average; a method run with several
    seeds shows their mean ± standard deviation. Then the health of every model."""
    out = ["# Results (nDCG@10)", ""]
    seeded = any(str(r.get("seed", "")) not in ("", "0") for r in rows)
    for (dataset, stage), table in _tables(rows):
        out += _head("##", dataset, stage, [*languages, "avg"], "---:|")
        out += [_score_row(key, table[key], languages) for key in sorted(table, key=_order)]
        out.append("")
    if seeded:
        out += ["Several seeds: mean ± standard deviation over seeds (BM25 has none).", ""]
    out += health_markdown(rows, languages)
    if failures:
        out += ["## Failed cells", ""]
        out += [f"- `{name}`: {err}" for name, err in sorted(failures.items())] + [""]
    return "\n".join(out)


def _score_row(
    key: tuple[str, str, str],
    by_lang: Mapping[str, Sequence[Mapping[str, str | float]]],
    languages: Sequence[str],
) -> str:
    """One (model, method, α) row: per language the mean nDCG@10 over seeds (± sd), and the average
    of the means when every language has one."""
    scores = {
        lang: [float(r["ndcg@10"]) for r in by_lang[lang]]
        for lang in languages
        if by_lang.get(lang)
    }
    means = [sum(found) / len(found) for found in scores.values()]
    avg = sum(means) / len(means) if len(means) == len(languages) else math.nan
    shown = [_mean_sd(scores[lang]) if lang in scores else "–" for lang in languages]
    return _line(key, [*shown, _fmt(avg)])


def health_markdown(
    rows: Sequence[Mapping[str, str | float]], languages: Sequence[str]
) -> list[str]:
    """results.md's health of every model, per (dataset, stage): mean active dimensions of queries /
    documents, the share of empty query vectors where any, and ⚠ where the queries are outside
    ``QUERY_DIMS_BAND`` (means over seeds; any seed outside flags the cell)."""
    models = [r for r in rows if r.get("active_dims_q") not in ("", None)]
    if not models:
        return []
    low, high = QUERY_DIMS_BAND
    out = [
        "## Health (mean active dimensions, queries / documents; empty queries; ⚠ collapsed)",
        "",
        f"A model is flagged ⚠ collapsed when its queries fire on fewer than {low:g} or more than {high:g} "
        "terms on average (a healthy SPLADE fires on a few tens).",
        "",
    ]
    for (dataset, stage), table in _tables(models):
        out += _head("###", dataset, stage, languages, "---|")
        for key, by_lang in sorted(table.items()):
            out.append(_line(key, [_health_cell(by_lang.get(lang, [])) for lang in languages]))
        out.append("")
    return out


def _health_cell(found: Sequence[Mapping[str, str | float]]) -> str:
    if not found:
        return "–"

    def mean(key: str) -> float:
        values = [float(r[key]) for r in found if r.get(key) not in ("", None)]
        return sum(values) / len(values) if values else math.nan

    cell = f"{mean('active_dims_q'):.0f} / {mean('active_dims_d'):.0f}"
    empty = mean("empty_share_q")
    if empty > 0:
        cell += f" · {empty:.1%} empty"
    if any(r.get("collapsed") == 1 for r in found):
        cell += " ⚠"
    return cell


def reference_lines(output: Path, cfg: ReproduceConfig) -> str:
    """results.md's closing lines: each source model with its own tokenizer (before the swap) on
    the test split and on the development set, and English BM25 (the cross-lingual miniature)."""
    where = (
        "on English XQuAD test (the same questions, in English)"
        if cfg.assets == "xling"
        else "here"
    )
    text = ""
    for model in cfg.models:
        folder = source_test_path(output, model)
        if is_complete(folder):
            ndcg = float(_value(_json(folder / "metrics.json"), "nDCG@10", math.nan))
            text += (
                f"\nSource {catalog.slug(model)} with its own tokenizer (before the swap) scores "
                f"nDCG@10 {ndcg:.3f} {where}.\n"
            )
        if (dev := plots.source_dev_score(output, model)) is not None:
            text += f"\nSource {catalog.slug(model)} on the development set (its own tokenizer): nDCG@10 {dev:.3f}.\n"
    english = bm25_path(output, "en", "xquad", cfg.eval_split)
    if cfg.assets == "xling" and is_complete(english):
        ndcg = float(_value(_json(english / "metrics.json"), "nDCG@10", math.nan))
        text += (
            f"\nBM25 (k1 {cfg.bm25.k1:g}, b {cfg.bm25.b:g}) over the source's own tokenizer scores "
            f"nDCG@10 {ndcg:.3f} {where}.\n"
        )
    return text


def rebuild(
    cfg: ReproduceConfig, failures: dict[str, str] | None = None, final: bool = False
) -> list[Row]:
    """Rewrite results.csv / results.md (at the end also comparisons.csv and the plots) from the
    finished stages."""
    out = Path(cfg.output)
    cells = config_cells(cfg)
    if failures is None:
        failures = cast("dict[str, str]", _json(out / "failures.json"))
    rows = collect(out, cells, cfg.datasets, cfg.eval_split)
    write_csv(rows, out / "results.csv")
    curves = protocol.protocol_rows(out, cells, cfg.datasets, cfg.finetune.eval_split)
    write_csv(curves, out / "convergence.csv", protocol.COLUMNS)
    text = markdown(rows, cfg.languages, failures) + protocol.markdown(curves, cfg.languages)
    if final:
        paired = compare.comparisons(out, cells, cfg.datasets, cfg.eval_split)
        write_csv(paired, out / "comparisons.csv", compare.COLUMNS)
        text += "\n" + compare.markdown(paired)
        for draw in (plots.before_after, plots.learning_curves, plots.convergence):
            draw(out, cells, cfg.datasets, out / "plots")
        plots.alpha_ablation(rows, out / "plots")
        plots.support_histograms(out, cells, out / "plots")
    text += reference_lines(out, cfg)
    atomic_write_text(out / "results.md", text)
    return rows
