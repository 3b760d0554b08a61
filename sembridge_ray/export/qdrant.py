"""Qdrant: a collection with one sparse vector per document (``sparse``: term ids and float32
weights) and the document id in the payload (Qdrant's point ids are integers: the row number).
Qdrant scores sparse vectors exactly (dot product over the shared terms), so its top-k equals the
exact one up to ties.

Embedded by default: qdrant-client's local mode, ``QdrantClient(path=<output>/qdrant)``, which any
later ``QdrantClient(path=...)`` opens; ``url``: a Qdrant server (the collection is replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sembridge_ray.export.base import Hits, Package, Rates, Tally, Vectors, untallied
from sembridge_ray.export.engine import EngineTarget, close_on_error

COLLECTION, FIELD, DOC_ID = "sembridge", "sparse", "doc_id"
BATCH = 256
LOCATION = "qdrant"
"""What it writes under the output directory (embedded)."""
RATES = Rates(build_s_per_doc=0.012, search_s_per_pair=5.1e-6, search_s_per_merged=0.56e-6)
"""The local mode's speed, measured with ``benchmarks/export_rates.py qdrant`` on the 2-CPU
development machine (qdrant-client 1.20, other jobs running): 10-14 ms a document to build whatever
its density (every point is pickled and committed to SQLite alone), and 75 µs a (query, document)
pair at 100 + 25 postings, 844 µs at 1,200 + 300 (a Python loop over both posting lists): 5.1 µs a
pair plus 0.56 µs a posting walked (checked at 1,000 documents of 1,200: 9.5 s to build, 12
expected; 1.1 ms a pair to search, 0.85 expected)."""
WHY_SLOW = (
    "qdrant-client's local mode is a development mode: every point is committed to SQLite on its "
    "own, and every query is scored against every document in Python"
)


def sparse(vectors: Vectors, i: int) -> Any:
    """Row ``i`` as a Qdrant sparse vector."""
    from qdrant_client import models

    terms, weights = vectors.row(i)
    return models.SparseVector(indices=terms.tolist(), values=weights.tolist())


class QdrantEngine:
    def __init__(self, client: Any, collection: str = COLLECTION) -> None:
        self.client, self.collection = client, collection

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits:
        out: Hits = []
        for i in range(len(queries)):
            found = self.client.query_points(
                self.collection,
                query=sparse(queries, i),
                using=FIELD,
                limit=k,
                with_payload=[DOC_ID],
            )
            out.append([str(p.payload[DOC_ID]) for p in found.points])
            tally(1)
        return out

    def close(self) -> None:
        self.client.close()


def build(
    out: Path, docs: Vectors, url: str = "", tally: Tally = untallied
) -> tuple[QdrantEngine, dict[str, object]]:
    """Index ``docs`` into a fresh collection; returns the engine and what the report says about
    it."""
    from qdrant_client import QdrantClient

    engine = QdrantEngine(
        QdrantClient(url=url, timeout=60) if url else QdrantClient(path=str(out / LOCATION))
    )
    # the local mode's lock on its folder released should the build fail
    close_on_error(engine, lambda: _fill(engine.client, docs, tally))
    return engine, {
        "collection": COLLECTION,
        "vector": FIELD,
        "payload_id": DOC_ID,
        "location": url or LOCATION,  # under the output: the report names no absolute path
    }


def _fill(client: Any, docs: Vectors, tally: Tally) -> None:
    """A fresh collection of ``docs`` (one replaced if there)."""
    from qdrant_client import models

    if client.collection_exists(COLLECTION):
        client.delete_collection(COLLECTION)
    client.create_collection(
        COLLECTION, vectors_config={}, sparse_vectors_config={FIELD: models.SparseVectorParams()}
    )
    for start in range(0, len(docs), BATCH):
        points = [
            models.PointStruct(id=i, vector={FIELD: sparse(docs, i)}, payload={DOC_ID: docs.ids[i]})
            for i in range(start, min(start + BATCH, len(docs)))
        ]
        client.upsert(COLLECTION, points=points, wait=True)
        tally(len(points))


TARGET = EngineTarget(
    name="qdrant",
    summary="Qdrant sparse vectors; embedded local mode, or --url a server",
    package=Package("qdrant_client", "qdrant-client"),
    build=build,
    location=LOCATION,
    schemes=("http", "https"),
    rates=RATES,
    why_slow=WHY_SLOW,
)
