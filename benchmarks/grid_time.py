"""Where a reproduction grid's time went, per stage kind and language, from its ``timings.jsonl``
(one line per stage the driver ran: ``sembridge_ray.recipes.reproduce.run.run_stage``).

    python -m benchmarks.grid_time outputs/xling          # a table, then one JSON line of totals

Stages skipped because they had finished before count 0 s and are left out. The kinds: ``init``,
``zero-shot`` and ``fine-tuned`` evaluation, ``fine-tune`` (training and its development scores),
``fusion`` with BM25, and the once-per-grid ones (sources, BM25 baselines). A cell name's second
part is its language (``<model>__<language>__<method>``)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

TIMINGS = "timings.jsonl"


def kind(stage: str, job: str) -> str:
    """The kind of a stage from its name (``seed-1/xquad/finetuned+bm25`` -> ``fusion``)."""
    last = stage.rpartition("/")[2]
    if job == "fusion":
        return "fusion"
    if job == "bm25":
        return "bm25"
    if job == "init" or last == "init":
        return "init"
    if job == "finetune":
        return "fine-tune"
    return {"zero_shot": "zero-shot eval", "finetuned": "fine-tuned eval"}.get(last, "other")


def read(root: Path) -> list[dict[str, object]]:
    """The stages that ran (not skipped) in the grid at ``root``."""
    path = Path(root) / TIMINGS
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [r for r in (json.loads(line) for line in lines if line.strip()) if not r["skipped"]]


def table(rows: Iterable[dict[str, object]]) -> tuple[str, dict[str, float]]:
    """A Markdown table (rows: stage kinds, columns: languages, cells ``total s (n × median s)``)
    and the totals per kind."""
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        cell = str(r["cell"])
        language = cell.split("__")[1] if cell.count("__") >= 2 else "once per grid"
        by[(kind(str(r["stage"]), str(r["job"])), language)].append(float(str(r["seconds"])))
    kinds = sorted({k for k, _ in by})
    languages = sorted({lang for _, lang in by}, key=lambda x: (x == "once per grid", x))
    out = [
        "| stage | " + " | ".join(languages) + " | total |",
        "|---|" + "---:|" * (len(languages) + 1),
    ]
    totals = {}
    for k in kinds:
        cells = []
        for lang in languages:
            found = by.get((k, lang), [])
            cells.append(
                f"{sum(found):.0f} s ({len(found)} × {statistics.median(found):.1f})"
                if found
                else "–"
            )
        totals[k] = sum(sum(v) for (kk, _), v in by.items() if kk == k)
        out.append(f"| {k} | " + " | ".join(cells) + f" | {totals[k] / 60:.1f} min |")
    return "\n".join(out), totals


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the grid's --output")
    args = parser.parse_args(argv)
    rows = read(args.root)
    if not rows:
        print(f"error: no timed stages in {args.root / TIMINGS}", file=sys.stderr)
        return 2
    text, totals = table(rows)
    print(text)
    summary = {"stages": len(rows), "minutes": round(sum(totals.values()) / 60, 1)}
    summary |= {k: round(v / 60, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
