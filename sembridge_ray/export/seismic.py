"""Seismic (pyseismic-lsr): its approximate learned-sparse index (``SeismicIndex``: pruned posting
lists, clustered blocks with summaries), saved as ``<output>/sembridge.index.seismic``
(``SeismicIndex.load`` reads it). Terms are Seismic strings (the decimal term id) and documents keep
their ids. The search is approximate (``query_cut``, ``heap_factor`` below): its loss is measured
(``docs/export.md``), not assumed."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sembridge_ray.export.base import Hits, Package, Rates, Tally, Tolerance, Vectors, untallied
from sembridge_ray.export.engine import EngineTarget

QUERY_CUT, HEAP_FACTOR = 20, 0.9
"""Search settings: the query's largest terms kept, and the heap factor (1 = no approximation in the
blocks)."""


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """File descriptors 1 and 2 to /dev/null: Seismic's (and PISA's) native code prints progress
    there. The job's own log lines still come out meanwhile (its progress while the native code
    works): a handler that writes to descriptor 2 writes to a copy of it."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    with os.fdopen(os.dup(saved[1]), "w", encoding="utf-8", buffering=1) as err:
        moved = []  # (handler, its own stream) of each handler writing to descriptor 2
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", ()):
                if isinstance(handler, logging.StreamHandler) and _fileno(handler.stream) == 2:
                    with contextlib.suppress(AttributeError):  # stderr's own (logging.lastResort)
                        moved.append((handler, handler.setStream(err)))
        with open(os.devnull, "wb") as null:
            for fd in (1, 2):
                os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            for handler, stream in moved:
                handler.setStream(stream)


def _fileno(stream: Any) -> int:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # pytest's capture, a closed stream
        return -1


LOCATION = "sembridge.index.seismic"
"""What it writes under the output directory (embedded)."""
RATES = Rates(build_s_per_posting=6e-6, build_exponent=1.5)
"""Seismic's build speed (its search takes milliseconds), measured with ``benchmarks/export_rates.py
seismic`` on the 2-CPU development machine (pyseismic-lsr 0.5.4, one thread, other jobs running, so
the same case varied by up to 1.5x): a document of 100 postings took 5.5-10 ms, 400: 31 ms, 800:
231 ms, 1,200: 225-322 ms. A document's cost grows faster than its postings; 6 µs × postings^1.5
is within a factor of 2 of each."""
WHY_SLOW = (
    "Seismic's build clusters every term's posting list and summarises each block, which costs more "
    "per posting the denser the documents"
)


class SeismicEngine:
    def __init__(self, index: Any) -> None:
        self.index = index

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits:
        import seismic

        string = seismic.get_seismic_string()
        rows = [queries.row(i) for i in range(len(queries))]
        found = self.index.batch_search(
            np.array([str(i) for i in range(len(queries))], dtype=string),
            [np.array([str(t) for t in terms.tolist()], dtype=string) for terms, _ in rows],
            [weights.astype(np.float32) for _, weights in rows],
            k=k,
            query_cut=QUERY_CUT,
            heap_factor=HEAP_FACTOR,
            num_threads=1,
        )
        tally(len(queries))
        # rows come unordered
        by_query = {int(row[0][0]): [str(doc) for _, _, doc in row] for row in found if row}
        return [by_query.get(i, []) for i in range(len(queries))]

    def close(self) -> None:
        pass


def build(
    out: Path, docs: Vectors, url: str = "", tally: Tally = untallied
) -> tuple[SeismicEngine, dict[str, object]]:
    """One native call: the documents are counted once it returns (the job's progress lines
    estimate the time until then from :data:`RATES`)."""
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
    tally(len(docs))
    return SeismicEngine(index), {
        "index": LOCATION,  # under the output: the report names no absolute path
        "query_cut": QUERY_CUT,
        "heap_factor": HEAP_FACTOR,
    }


TARGET = EngineTarget(
    name="seismic",
    summary="Seismic's approximate index (pyseismic-lsr)",
    package=Package("seismic", "pyseismic-lsr"),
    build=build,
    location=LOCATION,
    tolerance=Tolerance.within(min_overlap=0.95, max_ndcg_loss=0.02),
    rates=RATES,
    why_slow=WHY_SLOW,
)
