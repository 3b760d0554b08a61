"""Paired comparisons of methods on the same queries: is a difference in nDCG@10 more than query
sampling noise?

Within one (model, language, dataset, stage), every cell is compared with the reference cell
(SemBridge's released rule at α=4, or at the first α of the run without one) on the per-query
nDCG@10 that the evaluation job writes to ``per_query.tsv``: the mean difference, a 95% paired
bootstrap interval (``scipy.stats.bootstrap``) and a two-sided paired randomisation p-value
(``scipy.stats.permutation_test`` flipping the sign of each query's difference)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
from scipy import stats

from sembridge_ray.reproduce.cells import STAGES, Cell, cell_paths

COLUMNS = [
    "model",
    "language",
    "dataset",
    "stage",
    "method",
    "alpha",
    "reference",
    "n_queries",
    "mean_diff",
    "ci_low",
    "ci_high",
    "p_value",
]
PER_QUERY, MEASURE = "per_query.tsv", "nDCG@10"


class PairedTest(TypedDict):
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float


class PairedRow(PairedTest):
    """One line of comparisons.csv (:data:`COLUMNS`, in order)."""

    model: str
    language: str
    dataset: str
    stage: str
    method: str
    alpha: str
    reference: str
    n_queries: int


def read_per_query(path: Path, measure: str = MEASURE) -> dict[str, float]:
    with open(path, encoding="utf-8", newline="") as fh:
        return {row["query_id"]: float(row[measure]) for row in csv.DictReader(fh, delimiter="\t")}


def paired_test(
    method: np.ndarray, reference: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> PairedTest:
    """Mean of ``method - reference``, its 95% paired bootstrap CI, and the sign-flip randomisation
    p-value."""
    diff = np.asarray(method, np.float64) - np.asarray(reference, np.float64)
    mean = float(diff.mean())
    if not np.any(diff):
        return {"mean_diff": 0.0, "ci_low": 0.0, "ci_high": 0.0, "p_value": 1.0}
    rng = np.random.default_rng(seed)
    ci = stats.bootstrap(
        (diff,),
        np.mean,
        n_resamples=resamples,
        confidence_level=0.95,
        method="percentile",
        random_state=rng,
        batch=1000,
    ).confidence_interval
    perm = stats.permutation_test(
        (diff,),
        np.mean,
        permutation_type="samples",
        n_resamples=resamples,
        alternative="two-sided",
        random_state=rng,
        batch=1000,
    )
    return {
        "mean_diff": mean,
        "ci_low": float(ci.low),
        "ci_high": float(ci.high),
        "p_value": float(perm.pvalue),
    }


def comparisons(output: Path, cells: Sequence[Cell], datasets: Sequence[str]) -> list[PairedRow]:
    """One row per non-reference cell with a finished evaluation whose reference is finished too;
    and where a method is compared in more than one language, one pooled row (language
    :data:`POOLED`) over all their queries."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.model, cell.language), []).append(cell)
    rows: list[PairedRow] = []
    for dataset in datasets:
        for stage in STAGES:
            found = [
                pair
                for members in groups.values()
                for pair in _against_reference(output, members, dataset, stage)
            ]
            rows += [row for row, _ in found] + _pooled(found)
    return rows


POOLED = "all"
"""The ``language`` of a row that pools a model's languages: every compared query of each,
together."""


def reference_cell(members: Sequence[Cell]) -> Cell | None:
    """The released rule of a (model, language): a SemBridge cell with the released string rule (not
    ``+pa``) and the grid's bridge, at α=4 (the paper's) where there is one, else the first."""
    released = [
        c for c in members if c.method == "sembridge" and not c.position_aware and not c.bridge
    ]
    return next((c for c in released if c.alpha == 4), released[0] if released else None)


def _against_reference(
    output: Path, members: list[Cell], dataset: str, stage: str
) -> list[tuple[PairedRow, np.ndarray]]:
    """Every cell of one (model, language) against :func:`reference_cell`, on one dataset and stage:
    its row and its per-query differences."""
    reference = reference_cell(members)
    if (
        reference is None
        or not (
            ref_file := cell_paths(output, reference).eval(dataset, stage) / PER_QUERY
        ).is_file()
    ):
        return []
    ref = read_per_query(ref_file)
    qids = sorted(ref)
    found: list[tuple[PairedRow, np.ndarray]] = []
    for cell in members:
        path = cell_paths(output, cell).eval(dataset, stage) / PER_QUERY
        if cell == reference or not path.is_file():
            continue
        other = read_per_query(path)
        if sorted(other) != qids:  # different qrels: nothing to pair
            continue
        diff = np.array([other[q] - ref[q] for q in qids])
        row: PairedRow = {
            "model": cell.model,
            "language": cell.language,
            "dataset": dataset,
            "stage": stage,
            "method": cell.variant,
            "alpha": cell.alpha_label,
            "reference": reference.name,
            "n_queries": len(qids),
            **paired_test(diff, np.zeros_like(diff)),
        }
        found.append((row, diff))
    return found


def _pooled(found: list[tuple[PairedRow, np.ndarray]]) -> list[PairedRow]:
    """Per (model, method, α) compared in more than one language: the test over the differences of
    every compared query of all of them (each against its own language's reference)."""
    by_variant: dict[tuple[str, str, str], list[tuple[PairedRow, np.ndarray]]] = {}
    for compared, diff in found:
        by_variant.setdefault(
            (compared["model"], compared["method"], compared["alpha"]), []
        ).append((compared, diff))
    pooled: list[PairedRow] = []
    for members in by_variant.values():
        if len(members) < 2:
            continue
        diff = np.concatenate([d for _, d in members])
        first = members[0][0]
        row: PairedRow = {
            **first,
            "language": POOLED,
            "reference": "the reference of each language",
            "n_queries": len(diff),
            **paired_test(diff, np.zeros_like(diff)),
        }
        pooled.append(row)
    return pooled


def markdown(rows: Sequence[PairedRow]) -> str:
    """A results.md section: each method against the reference, per dataset, stage, model and
    language."""
    if not rows:
        return ""
    out = [
        "## Paired comparisons (nDCG@10, method − SemBridge reference, per query)",
        "",
        "| dataset | stage | model | language | method | Δ | 95% CI | p |",
        "|---|---|---|---|---|---:|---|---:|",
    ]
    for r in rows:
        label = f"{r['method']} (α={r['alpha']})" if r["alpha"] else r["method"]
        out.append(
            f"| {r['dataset']} | {r['stage'].replace('_', '-')} | {r['model']} | {r['language']} | {label} | "
            f"{r['mean_diff']:+.3f} | [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['p_value']:.3f} |"
        )
    out += [
        "",
        f"Reference: SemBridge's released rule at α=4 (or the run's first α); {rows[0]['n_queries']} queries in the "
        "first row. "
        "Bootstrap: 10,000 paired resamples; p: two-sided sign-flip randomisation test.",
        "",
    ]
    return "\n".join(out)
