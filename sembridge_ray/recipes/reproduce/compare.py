"""Paired comparisons of methods on the same queries: is a difference in nDCG@10 more than the noise
of sampling queries, and seeds?

Within one (model, language, dataset, stage), every cell is compared with the reference cell
(SemBridge's released rule at α=4, or at the first α of the run without one) on the per-query
nDCG@10 that the evaluation job writes to ``per_query.tsv``, and every fusion with BM25 is compared
with BM25 alone: the mean difference, a 95% bootstrap interval and a two-sided paired randomisation
p-value (``scipy.stats.permutation_test`` flipping the sign of each query's difference of the seed
means). With one seed on each side the interval is ``scipy.stats.bootstrap``'s paired one over
queries; with several, a two-level bootstrap (:func:`seed_query_bootstrap`) resamples each side's
seeds and the queries, so the interval also holds the spread between seeds."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
from scipy import stats

from sembridge_ray.recipes.reproduce.cells import BM25, FUSED, STAGES, Cell, bm25_path, cell_paths

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
    "seeds",
    "reference_seeds",
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
    seeds: int
    reference_seeds: int


def read_per_query(path: Path, measure: str = MEASURE) -> dict[str, float]:
    with open(path, encoding="utf-8", newline="") as fh:
        return {row["query_id"]: float(row[measure]) for row in csv.DictReader(fh, delimiter="\t")}


def paired_test(
    method: np.ndarray, reference: np.ndarray, resamples: int = 10_000, seed: int = 0
) -> PairedTest:
    """Mean of ``method - reference``, its 95% bootstrap CI, and the sign-flip randomisation
    p-value. Each side is (queries,) or (seeds, queries); the queries are the same on both sides."""
    method, reference = np.atleast_2d(method), np.atleast_2d(reference)
    diff = method.mean(axis=0, dtype=np.float64) - reference.mean(axis=0, dtype=np.float64)
    mean = float(diff.mean())
    if not np.any(method[:, None, :] != reference[None, :, :]):
        return {"mean_diff": 0.0, "ci_low": 0.0, "ci_high": 0.0, "p_value": 1.0}
    rng = np.random.default_rng(seed)
    if len(method) == len(reference) == 1:
        low, high = percentile_ci(diff, resamples, rng, batch=1000)
    else:
        low, high = seed_query_bootstrap(method, reference, resamples, rng)
    perm = stats.permutation_test(
        (diff,),
        np.mean,
        permutation_type="samples",
        n_resamples=resamples,
        alternative="two-sided",
        random_state=rng,
        batch=1000,
    )
    return {"mean_diff": mean, "ci_low": low, "ci_high": high, "p_value": float(perm.pvalue)}


def percentile_ci(
    values: np.ndarray, resamples: int, rng: np.random.Generator, batch: int | None = None
) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of ``values`` (``scipy.stats.bootstrap``,
    ``batch`` resamples at a time; None: all at once)."""
    ci = stats.bootstrap(
        (values,),
        np.mean,
        n_resamples=resamples,
        confidence_level=0.95,
        method="percentile",
        random_state=rng,
        batch=batch,
    ).confidence_interval
    return float(ci.low), float(ci.high)


def seed_query_bootstrap(
    method: np.ndarray,
    reference: np.ndarray,
    resamples: int,
    rng: np.random.Generator,
    batch: int = 500,
) -> tuple[float, float]:
    """The 95% percentile interval of the mean difference when each resample draws each side's
    seeds (with replacement, independently: the seeds of two methods are not paired) and the queries
    (with replacement, the same for both sides: they are paired). ``method`` (S_m, Q), ``reference``
    (S_r, Q). Written here because ``scipy.stats.bootstrap`` resamples one level (independent
    samples, or paired observations), not seeds nested with paired queries. Resamples are drawn
    ``batch`` at a time: per batch the seeds of each side, then the queries."""
    found = []
    queries = method.shape[1]
    for start in range(0, resamples, batch):
        n = min(batch, resamples - start)
        pick_m = rng.integers(0, len(method), (n, len(method)))
        pick_r = rng.integers(0, len(reference), (n, len(reference)))
        pick_q = rng.integers(0, queries, (n, queries))
        per_query = method[pick_m].mean(axis=1) - reference[pick_r].mean(axis=1)  # (n, Q)
        found.append(np.take_along_axis(per_query, pick_q, axis=1).mean(axis=1))
    low, high = np.percentile(np.concatenate(found), [2.5, 97.5])
    return float(low), float(high)


Pair = tuple["PairedRow", np.ndarray, np.ndarray]
"""A compared row with its two sides' scores, (seeds, queries) each, on the same queries."""


def comparisons(
    output: Path, cells: Sequence[Cell], datasets: Sequence[str], split: str = "test"
) -> list[PairedRow]:
    """One row per non-reference cell with a finished evaluation whose reference is finished too,
    and one per fusion with BM25 against BM25 alone; where a method is compared in more than one
    language, one pooled row (language :data:`POOLED`) over all their queries."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.model, cell.language), []).append(cell)
    rows: list[PairedRow] = []
    for dataset in datasets:
        for stage in STAGES:
            for fused in (False, True):  # each cell against the reference, then fusions vs BM25
                pairs: list[Pair] = []
                for (_, language), members in groups.items():
                    bm25 = bm25_path(output, language, dataset, split) if fused else None
                    pairs += _against(output, members, dataset, stage, bm25)
                rows += [row for row, _, _ in pairs] + _pooled(pairs)
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


def seed_scores(folders: Sequence[Path]) -> dict[str, list[float]] | None:
    """{query: its score at each seed} of the seeds' evaluations (their ``per_query.tsv``); None
    unless every one has finished with the same queries."""
    found = [read_per_query(f / PER_QUERY) for f in folders if (f / PER_QUERY).is_file()]
    if not found or len(found) != len(folders) or any(f.keys() != found[0].keys() for f in found):
        return None
    return {q: [f[q] for f in found] for q in found[0]}


def seed_matrix(scores: dict[str, list[float]], qids: list[str]) -> np.ndarray:
    """(seeds, queries) in ``qids``' order."""
    return np.array([scores[q] for q in qids], np.float64).T


def seed_folders(
    output: Path, cell: Cell, dataset: str, stage: str, fused: bool = False
) -> list[Path]:
    """The evaluation (or its fusion with BM25) of each of the cell's seeds at ``stage``."""
    paths = [cell_paths(output, cell, seed) for seed in range(cell.seeds)]
    return [p.fusion(dataset, stage) if fused else p.eval(dataset, stage) for p in paths]


def _against(
    output: Path, members: list[Cell], dataset: str, stage: str, bm25: Path | None = None
) -> list[Pair]:
    """Every cell of one (model, language) against :func:`reference_cell` on one dataset and stage,
    or, given ``bm25`` (its evaluation), every cell's fusion with BM25 against BM25 alone (what a
    BM25 user gains by adding the model): its row and both sides' scores, on the same queries."""
    reference = reference_cell(members) if bm25 is None else None
    folders = [bm25] if bm25 else reference and seed_folders(output, reference, dataset, stage)
    ref = seed_scores(folders) if folders else None
    if ref is None:
        return []
    qids = sorted(ref)
    b = seed_matrix(ref, qids)
    found: list[Pair] = []
    for cell in members:
        if cell == reference:
            continue
        other = seed_scores(seed_folders(output, cell, dataset, stage, fused=bool(bm25)))
        if other is None or sorted(other) != qids:  # unfinished, or other qrels: nothing to pair
            continue
        a = seed_matrix(other, qids)
        row: PairedRow = {
            "model": cell.model,
            "language": cell.language,
            "dataset": dataset,
            "stage": stage,
            "method": cell.variant + FUSED if bm25 else cell.variant,
            "alpha": cell.alpha_label,
            "reference": reference.name if reference else BM25,
            "n_queries": a.shape[1],
            **paired_test(a, b),
            "seeds": len(a),
            "reference_seeds": len(b),
        }
        found.append((row, a, b))
    return found


def _pooled(found: list[Pair]) -> list[PairedRow]:
    """Per (model, method, α) compared in more than one language: the test over every compared query
    of all of them (each against its own language's reference), seeds kept as they are."""
    by_variant: dict[tuple[str, str, str], list[Pair]] = {}
    for pair in found:
        key = pair[0]["model"], pair[0]["method"], pair[0]["alpha"]
        by_variant.setdefault(key, []).append(pair)
    pooled: list[PairedRow] = []
    for members in by_variant.values():
        if len(members) < 2:
            continue
        method = np.concatenate([a for _, a, _ in members], axis=1)
        reference = np.concatenate([b for _, _, b in members], axis=1)
        first = members[0][0]
        row: PairedRow = {
            **first,
            "language": POOLED,
            "reference": ("the reference of each language" if first["reference"] != BM25 else BM25),
            "n_queries": method.shape[1],
            **paired_test(method, reference),
        }
        pooled.append(row)
    return pooled


def markdown(rows: Sequence[PairedRow]) -> str:
    """A results.md section: each method against the reference (SemBridge's released rule, or BM25
    for a fusion with it), per dataset, stage, model and language."""
    if not rows:
        return ""
    out = [
        "## Paired comparisons (nDCG@10 per query: method − SemBridge reference; fusion − BM25)",
        "",
        "| dataset | stage | model | language | method | against | seeds | Δ | 95% CI | p |",
        "|---|---|---|---|---|---|---|---:|---|---:|",
    ]
    for r in rows:
        label = f"{r['method']} (α={r['alpha']})" if r["alpha"] else r["method"]
        against = BM25 if r["reference"] == BM25 else "reference"
        out.append(
            f"| {r['dataset']} | {r['stage'].replace('_', '-')} | {r['model']} | {r['language']} | {label} | "
            f"{against} | {r['seeds']}/{r['reference_seeds']} | {r['mean_diff']:+.3f} | "
            f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['p_value']:.3f} |"
        )
    out += [
        "",
        "Reference: SemBridge's released rule at α=4 (or the run's first α); a fusion is compared with BM25 "
        f"alone. {rows[0]['n_queries']} queries in the first row. Seeds: the method's / the reference's. "
        "Bootstrap: 10,000 resamples of the queries (paired), and of each side's seeds where there are "
        "several; p: two-sided sign-flip randomisation test on the per-query differences of the seed "
        "means.",
        "",
    ]
    return "\n".join(out)
