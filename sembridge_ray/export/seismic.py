"""Seismic (pyseismic-lsr): its approximate learned-sparse index (``SeismicIndex``: pruned posting
lists, clustered blocks with summaries), saved as ``<output>/sembridge.index.seismic``
(``SeismicIndex.load`` reads it). Terms are Seismic strings (the decimal term id) and documents keep
their ids. The search is approximate (``query_cut``, ``heap_factor`` below): its loss is measured
(``docs/export.md``), not assumed."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sembridge_ray.export.base import Hits, Vectors

QUERY_CUT, HEAP_FACTOR = 20, 0.9
"""Search settings: the query's largest terms kept, and the heap factor (1 = no approximation in the
blocks)."""


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """File descriptors 1 and 2 to /dev/null: Seismic's (and PISA's) native code prints progress
    there."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    with open(os.devnull, "wb") as null:
        for fd in (1, 2):
            os.dup2(null.fileno(), fd)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def terms_of(vectors: Vectors, i: int) -> tuple[np.ndarray, np.ndarray]:
    import seismic

    terms, weights = vectors.row(i)
    return np.array(
        [str(t) for t in terms.tolist()], dtype=seismic.get_seismic_string()
    ), weights.astype(np.float32)


LOCATION = "sembridge.index.seismic"
"""What it writes under the output directory (embedded)."""


class SeismicEngine:
    def __init__(self, index: Any) -> None:
        self.index = index

    def search(self, queries: Vectors, k: int) -> Hits:
        import seismic

        qids = np.array([str(i) for i in range(len(queries))], dtype=seismic.get_seismic_string())
        parts = [terms_of(queries, i) for i in range(len(queries))]
        found = self.index.batch_search(
            qids,
            [p[0] for p in parts],
            [p[1] for p in parts],
            k=k,
            query_cut=QUERY_CUT,
            heap_factor=HEAP_FACTOR,
            num_threads=1,
        )
        # rows come unordered
        by_query = {int(row[0][0]): [str(doc) for _, _, doc in row] for row in found if row}
        return [by_query.get(i, []) for i in range(len(queries))]

    def close(self) -> None:
        pass


def build(out: Path, docs: Vectors, url: str = "") -> tuple[SeismicEngine, dict[str, Any]]:
    import seismic

    data = seismic.SeismicDataset()
    data.add_documents_by_id(
        docs.ids,
        docs.rows.indices.astype(np.int64),
        docs.rows.values.astype(np.float32),
        docs.rows.indptr.astype(np.int64),
    )
    with quiet():
        index = seismic.SeismicIndex.build_from_dataset(data, num_threads=1)
        index.save(str(out / LOCATION.removesuffix(".index.seismic")))  # Seismic adds the suffix
    return SeismicEngine(index), {
        "index": LOCATION,  # under the output: the report names no absolute path
        "query_cut": QUERY_CUT,
        "heap_factor": HEAP_FACTOR,
    }
