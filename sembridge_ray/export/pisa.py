"""PISA (pyterrier-pisa): a learned-sparse index of quantised impacts. Each document weight w
becomes the integer ``int(w * SCALE)`` (pyterrier-pisa's ``toks_indexer``; the scale is recorded in
the report and in ``<output>/pisa/sembridge_export.json``); queries are scaled the same way and
searched exhaustively (``ranked_or``), so the only loss is the quantisation's, measured in
``docs/export.md``. Terms are the decimal term ids; documents keep their ids (``docno``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sembridge_ray.export.base import Hits, Package, Tally, Tolerance, Vectors, untallied
from sembridge_ray.export.engine import EngineTarget
from sembridge_ray.export.seismic import quiet

SCALE = 100.0
ALGORITHM = "ranked_or"


def toks(vectors: Vectors, i: int) -> dict[str, float]:
    terms, weights = vectors.row(i)
    return dict(zip(map(str, terms.tolist()), weights.tolist(), strict=True))


def _counted(docs: Vectors, tally: Tally) -> Iterator[dict[str, object]]:
    """The documents as the indexer reads them, counted as it takes them."""
    for i in range(len(docs)):
        yield {"docno": docs.ids[i], "toks": toks(docs, i)}
        tally(1)


LOCATION = "pisa"
"""What it writes under the output directory (embedded)."""


class PisaEngine:
    def __init__(self, index: Any) -> None:
        self.index = index

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits:
        import pandas as pd

        frame = pd.DataFrame(
            {
                "qid": [str(i) for i in range(len(queries))],
                "query_toks": [toks(queries, i) for i in range(len(queries))],
            }
        )
        with quiet():
            retriever = self.index.quantized(
                num_results=k, threads=1, query_algorithm=ALGORITHM, toks_scale=SCALE
            )
            found = retriever.transform(frame)
        tally(len(queries))
        by_query = found.sort_values(["qid", "rank"]).groupby("qid")["docno"].apply(list).to_dict()
        return [[str(d) for d in by_query.get(str(i), [])] for i in range(len(queries))]

    def close(self) -> None:
        pass


def build(
    out: Path, docs: Vectors, url: str = "", tally: Tally = untallied
) -> tuple[PisaEngine, dict[str, object]]:
    from pyterrier_pisa import PisaIndex

    folder = out / LOCATION
    index = PisaIndex(str(folder), stemmer="none", threads=1, overwrite=True)
    with quiet():
        index.toks_indexer(scale=SCALE).index(_counted(docs, tally))
    details = {
        "index": LOCATION,  # under the output: the report names no absolute path
        "scale": SCALE,
        "algorithm": ALGORITHM,
        "impact": "int(weight * scale)",
    }
    (folder / "sembridge_export.json").write_text(
        json.dumps(details, indent=2) + "\n", encoding="utf-8"
    )
    return PisaEngine(index), details


TARGET = EngineTarget(
    name="pisa",
    summary="PISA quantised impacts (pyterrier-pisa), scale recorded",
    package=Package("pyterrier_pisa", "pyterrier-pisa"),
    build=build,
    location=LOCATION,
    tolerance=Tolerance.within(min_overlap=0.95, max_ndcg_loss=0.02),
)
