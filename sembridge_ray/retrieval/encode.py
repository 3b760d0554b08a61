"""The encoding step that the evaluate and export jobs share (their settings are an
:class:`Encoding`): a corpus and its judged queries as
sparse vectors, through an executor's pool of encoder workers (Ray's hands inputs not worth a pool
to this process), cached under the identities of the model and dataset so that either job reuses what the
other encoded.

    corpus_key(key, spec, split) -> key        (per split only where each split has its own corpus)
    encode_judged(cfg, model, data, qids, key, pinned=, executor=) -> (docs, queries)
    encode_corpus(cfg, model, data, key, cache, pinned=, executor=) -> (vectors dir, cache hit)
    encode_queries(cfg, model, data, qids, key, cache, pinned=, executor=) -> (vectors dir, cache hit)

A step, not a driver: it claims no output and writes only under the cache it is given."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sembridge_ray.bundled import resolve
from sembridge_ray.data.registry import corpus_split
from sembridge_ray.data.retrieval import RetrievalData
from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.retrieval.settings import Encoding
from sembridge_ray.retrieval.sources import VECTORS, cached
from sembridge_ray.retrieval.store import fingerprint, stage_corpus
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import Executor, Pool
from sembridge_ray.runtime.identity import Pin
from sembridge_ray.runtime.outputs import atomic_path
from sembridge_ray.runtime.progress import Progress
from sembridge_ray.sparse.encode_files import PATH, ROWS, SparseEncodeUDF

log = logging.getLogger(__name__)
ENCODING_VERSION = 1


def corpus_key(key: str, spec: str, split: str) -> str:
    """The key of a corpus's encoding of (model, dataset) ``key``: one corpus encoding serves every
    split, except where each split has its own corpus (XQuAD's articles)."""
    return fingerprint(key, own) if (own := corpus_split(spec, split)) else key


def encode_judged(
    cfg: Encoding,
    model: str,
    data: RetrievalData,
    qids: list[str],
    identities: tuple[str, str],
    *,
    pinned: Pin,
    executor: Executor,
    lap: Callable[[str], object] = lambda step: None,
) -> tuple[tuple[Path, bool], tuple[Path, bool]]:
    """The corpus and the queries ``qids`` of ``data`` as (vectors dir, cache hit) each, encoded by
    ``executor``'s pools and cached in ``cfg.cache_dir`` under the model's and the dataset's
    ``identities``: the corpus per split where each split has its own (:func:`corpus_key`), the
    queries per split; ``lap(step)`` after each step (``encode_docs``, ``encode_queries``)."""
    cache, spec, key = Path(cfg.cache_dir), resolve(cfg.dataset), fingerprint(*identities)
    docs = encode_corpus(
        cfg, model, data, corpus_key(key, spec, data.split), cache, pinned=pinned, executor=executor
    )
    lap("encode_docs")
    queries_key = fingerprint(key, data.split)
    queries = encode_queries(
        cfg, model, data, qids, queries_key, cache, pinned=pinned, executor=executor
    )
    lap("encode_queries")
    return docs, queries


def encode_corpus(
    cfg: Encoding,
    model: str,
    data: RetrievalData,
    key: str,
    cache: Path,
    *,
    pinned: Pin,
    executor: Executor,
) -> tuple[Path, bool]:
    """The corpus's sparse vectors (cached): staged to Parquet by the driver, encoded by a pool of
    ``executor``; ``pinned`` (required: the cache is shared between jobs, :func:`sembridge_ray.runtime.identity.pin`)
    raises when the model or dataset is no longer the one ``key`` names (then no entry is published
    under it)."""
    entry = _entry(cfg, "docs", key, cfg.max_doc_length, cfg.doc_max_active_dims)

    def build(tmp: Path) -> dict[str, int]:
        files = stage_corpus(data.corpus.batches(cfg.stage_rows), tmp / "staged")
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        if rows == 0:
            raise InputError(f"dataset {cfg.dataset!r}: the corpus ({data.corpus.name}) is empty")
        encode(files, tmp / VECTORS, cfg, model, "document", executor)
        shutil.rmtree(tmp / "staged")
        pinned()
        return {"rows": rows}

    return cached(cache / entry, build)


def encode_queries(
    cfg: Encoding,
    model: str,
    data: RetrievalData,
    qids: list[str],
    key: str,
    cache: Path,
    *,
    pinned: Pin,
    executor: Executor,
) -> tuple[Path, bool]:
    """The vectors of the qrels queries that have text (cached; ``pinned`` as for
    :func:`encode_corpus`)."""
    entry = _entry(cfg, "queries", key, cfg.max_query_length, cfg.query_max_active_dims, qids)

    def build(tmp: Path) -> dict[str, int]:
        if qids:
            table = pa.table({ID: qids, TEXT: [data.queries[q] for q in qids]})
            batches = (table.slice(i, cfg.stage_rows) for i in range(0, len(qids), cfg.stage_rows))
            staged = stage_corpus(batches, tmp / "staged")
            encode(staged, tmp / VECTORS, cfg, model, "query", executor)
            shutil.rmtree(tmp / "staged")
            pinned()
        return {"rows": len(qids)}

    return cached(cache / entry, build)


def _entry(cfg: Encoding, kind: str, *parts: object) -> str:
    """The cache entry of ``kind``'s encoding: its fingerprint covers ``parts``, the staging and
    batch sizes, and a precision other than fp32 (fp32 entries keep their keys)."""
    precision = [cfg.precision] if cfg.precision != "fp32" else []
    sizes = (cfg.stage_rows, cfg.encode_batch_size)
    return f"{kind}-{fingerprint(kind, ENCODING_VERSION, *parts, *sizes, *precision)}"


def encode(
    files: list[Path], dest: Path, cfg: Encoding, model: str, role: str, executor: Executor
) -> None:
    """Staged (id, text) Parquet files -> sparse Parquet files (id, indices, values) of the same
    names in ``dest``, through a pool of encoder workers of ``executor`` (one GPU each when there
    are GPUs), one file per call. See :class:`SparseEncodeUDF`: the vectors are the same bit for bit
    on one node or many, in a worker or here."""
    plan = executor.placement(cfg.resources)
    query = role == "query"
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    with atomic_path(dest) as tmp:
        tmp.mkdir(parents=True)
        kwargs = {
            "model_dir": model,
            "trust_remote_code": cfg.trust_remote_code,
            "role": role,
            "max_length": cfg.max_query_length if query else cfg.max_doc_length,
            "max_active_dims": cfg.query_max_active_dims if query else cfg.doc_max_active_dims,
            "batch_size": cfg.encode_batch_size,
            "out_dir": str(tmp),
            "threads": cfg.resources.threads_per_worker,
            # the jobs resolved it already (then it stays as it is); a direct caller's auto resolves
            "precision": executor.precision(cfg.precision, cfg.resources),
        }
        progress = Progress(log, f"encoding {'queries' if query else 'documents'}", total, "texts")
        pool = Pool(
            udf=SparseEncodeUDF, kwargs=kwargs, plan=plan, threads=cfg.resources.threads_per_worker
        )
        blocks = [pa.table({PATH: [str(f)]}) for f in files]
        executor.map_blocks(
            pool, blocks, total, progress, lambda done: int(pc.sum(done.column(ROWS)).as_py() or 0)
        )
