"""Milvus: a collection of (``pk`` int64 row number, ``doc_id`` string, ``sparse``
SPARSE_FLOAT_VECTOR) with a ``SPARSE_INVERTED_INDEX`` under inner product, built and searched with
``drop_ratio`` 0 (nothing pruned), so its top-k equals the exact one up to ties.

Embedded by default: Milvus Lite, ``MilvusClient("<output>/milvus.db")``; ``url``: a Milvus server's
URI (the collection is replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sembridge_ray.export.base import Hits, Package, Rates, Tally, Vectors, untallied
from sembridge_ray.export.engine import EngineTarget, close_on_error

COLLECTION, FIELD, DOC_ID, PK = "sembridge", "sparse", "doc_id", "pk"
BATCH = 1000
MAX_ID_LENGTH = 512
LOCATION = "milvus.db"
"""What it writes under the output directory (embedded)."""
RATES = Rates(build_s_per_doc=5.5e-3, search_s_per_pair=38e-6, search_s_per_merged=0.13e-6)
"""Milvus Lite's speed, measured with ``benchmarks/export_rates.py milvus`` on the 2-CPU development
machine (milvus-lite 3.2, pymilvus 3.0, other jobs running): 5.0-5.7 ms a document to build (the
embedded server's start included) at 100 and 1,200 postings, and 54 µs a (query, document) pair at
100 + 25 postings, 229 µs at 1,200 + 300: 38 µs a pair plus 0.13 µs a posting walked."""
WHY_SLOW = (
    "Milvus Lite is a development mode: its sparse index and search run in Python in this process"
)


def _sparse(vectors: Vectors, i: int) -> dict[int, float]:
    """Row ``i`` as a Milvus sparse vector (term id -> weight)."""
    terms, weights = vectors.row(i)
    return dict(zip(terms.tolist(), weights.tolist(), strict=True))


class MilvusEngine:
    def __init__(self, client: Any, lite_db: str = "", collection: str = COLLECTION) -> None:
        self.client, self.lite_db, self.collection = client, lite_db, collection

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits:
        data = [_sparse(queries, i) for i in range(len(queries))]
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
            tally(len(found))
        return out

    def close(self) -> None:
        """Closes the client and, when embedded, stops the Milvus Lite server, which closes
        ``milvus.db`` before the job marks its output complete (Milvus Lite would otherwise do it
        only at interpreter exit)."""
        self.client.close()
        if self.lite_db:
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(self.lite_db)


def build(
    out: Path, docs: Vectors, url: str = "", tally: Tally = untallied
) -> tuple[MilvusEngine, dict[str, object]]:
    from pymilvus import MilvusClient

    uri = url or str(out / LOCATION)
    engine = MilvusEngine(MilvusClient(uri), "" if url else uri)
    # the embedded server stopped, its file closed, should the build fail
    close_on_error(engine, lambda: _fill(engine.client, docs, tally))
    return engine, {
        "collection": COLLECTION,
        "vector": FIELD,
        "id_field": DOC_ID,
        "uri": url or LOCATION,  # under the output: the report names no absolute path
    }


def _fill(client: Any, docs: Vectors, tally: Tally) -> None:
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
        rows = [
            {PK: i, DOC_ID: docs.ids[i], FIELD: _sparse(docs, i)}
            for i in range(start, min(start + BATCH, len(docs)))
        ]
        client.insert(COLLECTION, rows)
        tally(len(rows))
    client.flush(COLLECTION)


TARGET = EngineTarget(
    name="milvus",
    summary="Milvus SPARSE_FLOAT_VECTOR; embedded Milvus Lite, or --url a server",
    package=Package("milvus_lite", "milvus-lite"),
    build=build,
    location=LOCATION,
    schemes=("http", "https", "tcp"),
    rates=RATES,
    why_slow=WHY_SLOW,
)
