"""Qdrant: a collection with one sparse vector per document (``sparse``: term ids and float32
weights) and the document id in the payload (Qdrant's point ids are integers: the row number).
Qdrant scores sparse vectors exactly (dot product over the shared terms), so its top-k equals the
exact one up to ties.

Embedded by default: qdrant-client's local mode, ``QdrantClient(path=<output>/qdrant)``, which any
later ``QdrantClient(path=...)`` opens; ``url``: a Qdrant server (the collection is replaced)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from sembridge_ray.export.base import Hits, Vectors

COLLECTION, FIELD, DOC_ID = "sembridge", "sparse", "doc_id"
BATCH = 256
LOCATION = "qdrant"
"""What it writes under the output directory (embedded)."""


class QdrantEngine:
    def __init__(self, client: Any, collection: str = COLLECTION) -> None:
        self.client, self.collection = client, collection

    def search(self, queries: Vectors, k: int) -> Hits:
        from qdrant_client import models

        out: Hits = []
        for i in range(len(queries)):
            terms, weights = queries.row(i)
            found = self.client.query_points(
                self.collection,
                query=models.SparseVector(indices=terms.tolist(), values=weights.tolist()),
                using=FIELD,
                limit=k,
                with_payload=[DOC_ID],
            )
            out.append([str(p.payload[DOC_ID]) for p in found.points])
        return out

    def close(self) -> None:
        self.client.close()


def connect(out: Path, url: str = "") -> Any:
    from qdrant_client import QdrantClient

    return QdrantClient(url=url, timeout=60) if url else QdrantClient(path=str(out / LOCATION))


def build(out: Path, docs: Vectors, url: str = "") -> tuple[QdrantEngine, dict[str, Any]]:
    """Index ``docs`` into a fresh collection; returns the engine and what the report says about
    it."""
    engine = QdrantEngine(connect(out, url))
    try:
        _fill(engine.client, docs)
    except BaseException:  # the local mode's lock on its folder released before the error goes up
        with contextlib.suppress(Exception):  # the error that stopped the build is the one to see
            engine.close()
        raise
    where = url or LOCATION  # under the output: the report names no absolute path
    return engine, {
        "collection": COLLECTION,
        "vector": FIELD,
        "payload_id": DOC_ID,
        "location": where,
    }


def _fill(client: Any, docs: Vectors) -> None:
    """A fresh collection of ``docs`` (one replaced if there)."""
    from qdrant_client import models

    if client.collection_exists(COLLECTION):
        client.delete_collection(COLLECTION)
    client.create_collection(
        COLLECTION, vectors_config={}, sparse_vectors_config={FIELD: models.SparseVectorParams()}
    )
    for start in range(0, len(docs), BATCH):
        points = []
        for i in range(start, min(start + BATCH, len(docs))):
            terms, weights = docs.row(i)
            vector = models.SparseVector(indices=terms.tolist(), values=weights.tolist())
            points.append(
                models.PointStruct(id=i, vector={FIELD: vector}, payload={DOC_ID: docs.ids[i]})
            )
        client.upsert(COLLECTION, points=points, wait=True)
