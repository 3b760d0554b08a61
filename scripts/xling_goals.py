"""The verdict on a cross-lingual recipe's goals, from a finished (or partly finished) xling grid: one
method (``sembridge_x`` by default) against every other method of the grid and against BM25, per
language, on the test split, seeds averaged, each difference with the grid's paired 95% CI over
seeds and queries (``reproduce.compare.paired_test``).

    python scripts/xling_goals.py --grid outputs/xling
    python scripts/xling_goals.py --grid DIR --method sembridge_x languages=sw target_tokenizers=sw=TOK xquad_dir=X

The trailing ``key=value`` settings are the preset's overrides the grid ran with (they name its
cells). The goals, per language: zero-shot, the method against each other method (the mean and
whether the CI's lower end is >= 0); fine-tuned, its mean against the best other method's - 0.005;
the fusion of its fine-tuned model with BM25 against BM25 alone (+0.02); its fine-tuned model
against BM25. And over the languages: the zero-shot mean as a share of the source's English test
score. A cell that has not finished is left out and said so."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sembridge_ray.cli import parse_config
from sembridge_ray.recipes.reproduce.cells import (
    STAGES,
    Cell,
    bm25_path,
    config_cells,
    source_test_path,
)
from sembridge_ray.recipes.reproduce.compare import (
    PER_QUERY,
    paired_test,
    read_per_query,
    seed_folders,
    seed_matrix,
    seed_scores,
)
from sembridge_ray.recipes.reproduce.config import ReproduceConfig

FINETUNED_MARGIN = 0.005
FUSION_GAIN = 0.02
RECOVERY = 0.70


def scores(
    grid: Path, cell: Cell, dataset: str, stage: str, fused: bool = False
) -> np.ndarray | None:
    """(seeds, queries) of one cell at ``stage`` in query-id order, or None until every seed has
    finished."""
    found = seed_scores(seed_folders(grid, cell, dataset, stage, fused))
    return None if found is None else seed_matrix(found, sorted(found))


def bm25_scores(grid: Path, language: str, dataset: str) -> np.ndarray | None:
    found = seed_scores([bm25_path(grid, language, dataset, "test")])
    return None if found is None else seed_matrix(found, sorted(found))


def label(cell: Cell) -> str:
    """A cell as the tables name it: its variant, and its α where it has one."""
    return cell.variant + ("" if cell.alpha is None else f" α={cell.alpha:g}")


def _test(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    found = paired_test(a, b)
    return {"diff": found["mean_diff"], "low": found["ci_low"], "high": found["ci_high"]}


def language_goals(
    grid: Path, cells: Sequence[Cell], method: str, dataset: str
) -> dict[str, object]:
    """One language's (one model's) figures: ``cells`` are its cells, ``method`` the variant judged."""
    (mine,) = [c for c in cells if c.variant == method][:1]  # at the grid's first α
    others = [c for c in cells if c != mine]
    found: dict[str, object] = {"language": mine.language, "model": mine.model}
    missing: list[str] = []
    for stage in STAGES:
        own = scores(grid, mine, dataset, stage)
        if own is None:
            missing.append(f"{method}/{stage}")
            continue
        rows: dict[str, dict[str, float]] = {}
        for other in others:
            theirs = scores(grid, other, dataset, stage)
            if theirs is None or theirs.shape[1] != own.shape[1]:
                missing.append(f"{label(other)}/{stage}")
                continue
            rows[label(other)] = {"mean": float(theirs.mean()), **_test(own, theirs)}
        found[stage] = {"mean": float(own.mean()), "seeds": len(own), "against": rows}
    bm25 = bm25_scores(grid, mine.language, dataset)
    tuned = scores(grid, mine, dataset, STAGES[1])
    fused = scores(grid, mine, dataset, STAGES[1], fused=True)
    if bm25 is None or tuned is None or fused is None:
        missing.append("bm25 or the fine-tuned fusion")
    else:
        found["bm25"] = float(bm25.mean())
        found["fused_vs_bm25"] = _test(fused, bm25)
        found["finetuned_vs_bm25"] = _test(tuned, bm25)
    found["missing"] = missing
    return found


def verdicts(per_language: Sequence[dict[str, object]], english: float | None) -> dict[str, object]:
    """The goals over the languages, from :func:`language_goals`' figures (a goal whose figures are
    missing in a language is ``None``)."""

    def every(check: object) -> bool | None:
        values = [check(f) for f in per_language]  # type: ignore[operator]
        return None if None in values or not values else all(values)

    def zero_shot(f: dict) -> bool | None:
        z = f.get("zero_shot")
        return None if z is None else all(r["low"] >= 0 for r in z["against"].values())

    def finetuned(f: dict) -> bool | None:
        t = f.get("finetuned")
        if t is None or not t["against"]:
            return None
        return t["mean"] >= max(r["mean"] for r in t["against"].values()) - FINETUNED_MARGIN

    def fusion(f: dict) -> bool | None:
        g = f.get("fused_vs_bm25")
        return None if g is None else g["diff"] >= FUSION_GAIN

    zs = [f["zero_shot"]["mean"] for f in per_language if "zero_shot" in f]  # type: ignore[index]
    reaches = [
        f["finetuned_vs_bm25"]["diff"] >= 0  # type: ignore[index]
        for f in per_language
        if "finetuned_vs_bm25" in f
    ]
    recovery = statistics.fmean(zs) / english if zs and english else None
    return {
        "zero_shot_ci_not_below_0_every_language": every(zero_shot),
        "finetuned_within_0.005_of_best_every_language": every(finetuned),
        "fusion_gains_0.02_every_language": every(fusion),
        "finetuned_reaches_bm25_languages": sum(reaches),
        "recovery_of_english": recovery,
        "recovery_goal_met": None if recovery is None else recovery >= RECOVERY,
    }


def english_score(grid: Path, model: str) -> float | None:
    path = source_test_path(grid, model) / PER_QUERY
    return statistics.fmean(read_per_query(path).values()) if path.is_file() else None


def markdown(method: str, per_language: Sequence[dict], goals: dict[str, object]) -> str:
    lines = [f"| {method} against | " + " | ".join(f["language"] for f in per_language) + " |"]
    lines.append("|---|" + "---|" * len(per_language))
    for stage in STAGES:
        names = sorted({n for f in per_language for n in f.get(stage, {}).get("against", {})})
        lines.append(
            f"| **{stage}: {method}** | "
            + " | ".join(f"{f[stage]['mean']:.3f}" if stage in f else "–" for f in per_language)
            + " |"
        )
        for name in names:
            cells = []
            for f in per_language:
                r = f.get(stage, {}).get("against", {}).get(name)
                cells.append(
                    "–"
                    if r is None
                    else f"{r['mean']:.3f}: {r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]"
                )
            lines.append(f"| {stage}: {name} | " + " | ".join(cells) + " |")
    for key, label in (
        ("finetuned_vs_bm25", "fine-tuned − BM25"),
        ("fused_vs_bm25", "fine-tuned + BM25 − BM25"),
    ):
        cells = [
            "–"
            if key not in f
            else f"{f[key]['diff']:+.3f} [{f[key]['low']:+.3f}, {f[key]['high']:+.3f}]"
            for f in per_language
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| BM25 | "
        + " | ".join(f"{f['bm25']:.3f}" if "bm25" in f else "–" for f in per_language)
        + " |"
    )
    return "\n".join(lines) + "\n\n" + json.dumps(goals)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, required=True, help="the xling grid's --output")
    parser.add_argument(
        "--method", default="sembridge_x", help="the variant judged (a cell's name part)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "overrides", nargs="*", help="the preset's key=value overrides the grid ran with"
    )
    args = parser.parse_args(argv)
    cfg, _ = parse_config(
        ReproduceConfig,
        ["--preset", "xling", *args.overrides],
        job="reproduce",
    )
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in config_cells(cfg):
        groups.setdefault((cell.model, cell.language), []).append(cell)
    dataset = cfg.datasets[0]
    for model in cfg.models:
        per_language = [
            language_goals(args.grid, members, args.method, dataset)
            for (m, _), members in groups.items()
            if m == model and any(c.variant == args.method for c in members)
        ]
        if not per_language:
            parser.error(f"--method {args.method}: no cell of the grid's {model} runs it")
        goals = verdicts(per_language, english_score(args.grid, model))
        print(f"## {model}\n\n" + markdown(args.method, per_language, goals) + "\n")
        for f in per_language:
            if missing := f["missing"]:
                print(f"{f['language']}: not finished: {', '.join(map(str, missing))}")  # type: ignore[call-overload]
        if args.json:
            args.json.write_text(json.dumps({"languages": per_language, "goals": goals}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
