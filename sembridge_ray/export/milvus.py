"""Milvus: a collection of (``pk`` int64 row number, ``doc_id`` string, ``sparse``
SPARSE_FLOAT_VECTOR) with a ``SPARSE_INVERTED_INDEX`` under inner product, built and searched with
``drop_ratio`` 0 (nothing pruned), so its top-k equals the exact one up to ties.

Embedded by default: Milvus Lite, ``MilvusClient("<output>/milvus.db")``; ``url``: a Milvus server's
URI (the collection is replaced)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from sembridge_ray.export.base import Hits, Vectors

COLLECTION, FIELD, DOC_ID, PK = "sembridge", "sparse", "doc_id", "pk"
BATCH = 1000
MAX_ID_LENGTH = 512
LOCATION = "milvus.db"
"""What it writes under the output directory (embedded)."""


class MilvusEngine:
    def __init__(self, client: Any, lite_db: str = "", collection: str = COLLECTION) -> None:
        self.client, self.lite_db, self.collection = client, lite_db, collection

    def search(self, queries: Vectors, k: int) -> Hits:
        data = [
            dict(zip(*(a.tolist() for a in queries.row(i)), strict=True))
            for i in range(len(queries))
        ]
        out: Hits = []
        for start in range(0, len(data), 100):
            found = self.client.search(
                self.collection,
                data=data[start : start + 100],
                anns_field=FIELD,
                limit=k,
                output_fields=[DOC_ID],
                search_params={"metric_type": "IP", "params": {"drop_ratio_search": 0.0}},
            )
            out += [[str(hit["entity"][DOC_ID]) for hit in row] for row in found]
        return out

    def close(self) -> None:
        """Closes the client and, when embedded, stops the Milvus Lite server, which closes
        ``milvus.db`` before the job marks its output complete (Milvus Lite would otherwise do it
        only at interpreter exit)."""
        self.client.close()
        if self.lite_db:
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(self.lite_db)


def build(out: Path, docs: Vectors, url: str = "") -> tuple[MilvusEngine, dict[str, Any]]:
    from pymilvus import MilvusClient

    uri = url or str(out / LOCATION)
    engine = MilvusEngine(MilvusClient(uri), "" if url else uri)
    try:
        _fill(engine.client, docs)
    except BaseException:  # the embedded server stopped, its file closed, before the error goes up
        with contextlib.suppress(Exception):  # the error that stopped the build is the one to see
            engine.close()
        raise
    return engine, {
        "collection": COLLECTION,
        "vector": FIELD,
        "id_field": DOC_ID,
        "uri": url or LOCATION,  # under the output: the report names no absolute path
    }


def _fill(client: Any, docs: Vectors) -> None:
    """A fresh collection of ``docs`` (one replaced if there), indexed and flushed."""
    from pymilvus import DataType

    if client.has_collection(COLLECTION):
        client.drop_collection(COLLECTION)
    schema = client.create_schema(auto_id=False)
    schema.add_field(PK, DataType.INT64, is_primary=True)
    schema.add_field(DOC_ID, DataType.VARCHAR, max_length=MAX_ID_LENGTH)
    schema.add_field(FIELD, DataType.SPARSE_FLOAT_VECTOR)
    index = client.prepare_index_params()
    index.add_index(
        field_name=FIELD,
        index_type="SPARSE_INVERTED_INDEX",
        metric_type="IP",
        params={"drop_ratio_build": 0.0},
    )
    client.create_collection(COLLECTION, schema=schema, index_params=index)
    for start in range(0, len(docs), BATCH):
        rows = []
        for i in range(start, min(start + BATCH, len(docs))):
            terms, weights = docs.row(i)
            sparse = dict(zip(terms.tolist(), weights.tolist(), strict=True))
            rows.append({PK: i, DOC_ID: docs.ids[i], FIELD: sparse})
        client.insert(COLLECTION, rows)
    client.flush(COLLECTION)
