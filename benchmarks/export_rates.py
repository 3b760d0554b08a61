"""How fast the embedded engines build and search at a given vector density: the measurement behind
the rates each adapter of :mod:`sembridge_ray.export` states (``RATES``), which the export job's
advance notice of a slow build reads.

    python benchmarks/export_rates.py qdrant milvus seismic      # a few minutes on 2 CPUs

Each case builds a fresh index of ``docs`` random sparse vectors of ``postings`` distinct terms
(uniform over a 30,000-term vocabulary, weights uniform in [0.05, 3]: the near-dense regime of an
untrained or lightly trained transferred model), then searches ``queries`` vectors of a quarter as
many terms through the adapter's own ``build`` and ``search``, timed apart. One JSON line per case:
seconds, and the rates per document, per posting and per (query, document) pair."""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sembridge_ray.export.base import Vectors

VOCAB = 30_000
CASES = {
    "qdrant": [(300, 100, 20), (300, 1200, 10)],
    "milvus": [(300, 100, 20), (300, 1200, 10)],
    "seismic": [(500, 100, 10), (300, 400, 10), (200, 1200, 10)],
}
"""Engine -> (documents, postings per document, queries) per case."""


def random_vectors(rows: int, postings: int, rng: np.random.Generator, prefix: str) -> Vectors:
    terms = [np.sort(rng.choice(VOCAB, postings, replace=False)) for _ in range(rows)]
    weights = [rng.uniform(0.05, 3, postings).astype(np.float32) for _ in range(rows)]
    return Vectors.from_rows([f"{prefix}{i}" for i in range(rows)], terms, weights)


def measure(engine: str, docs: int, postings: int, queries: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    d = random_vectors(docs, postings, rng, "d")
    q = random_vectors(queries, max(1, postings // 4), rng, "q")
    adapter = importlib.import_module(f"sembridge_ray.export.{engine}")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        index, _ = adapter.build(Path(tmp), d)
        built = time.perf_counter()
        index.search(q, 10)
        searched = time.perf_counter()
        index.close()
    build_s, search_s = built - start, searched - built
    return {
        "docs": docs,
        "postings_per_doc": postings,
        "queries": queries,
        "build_s": round(build_s, 3),
        "search_s": round(search_s, 3),
        "build_s_per_doc": build_s / docs,
        "search_s_per_pair": search_s / (docs * queries),
        "merged_postings_per_s": (queries * d.postings + docs * q.postings) / search_s,
    }


def main(argv: list[str] | None = None) -> int:
    for engine in argv if argv is not None else sys.argv[1:] or list(CASES):
        for case in CASES[engine]:
            print(json.dumps({"engine": engine, **measure(engine, *case)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
