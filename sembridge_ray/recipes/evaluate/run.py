"""The evaluate job, written against the executor: encode (its pools, cached:
:mod:`sembridge_ray.retrieval.encode`, shared with the export) -> exact sharded search -> run +
metrics. Small inputs (``cluster.in_driver``: a few hundred texts, a small corpus) are encoded
and searched in the driver by the same code, with the same results: an actor costs more to start
than their work.

    run_evaluate(cfg, executor=...) -> EvaluateResult   (what the command and the reproduction call)

Outputs in ``cfg.output``: ``run.trec``, ``metrics.json``, ``per_query.tsv``, ``config.yaml``,
``identity.json`` and ``_SUCCESS`` last, under the output contract of :mod:`sembridge_ray.runtime.outputs`.
Encodings are cached by the identities of the model and dataset, so a new output for an encoded
(model, dataset) only searches again."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sembridge_ray.data.registry import load_retrieval
from sembridge_ray.data.retrieval import RetrievalData
from sembridge_ray.recipes.evaluate.config import EvaluateConfig, EvaluateResult
from sembridge_ray.retrieval.encode import encode_judged
from sembridge_ray.retrieval.index import PAD, Shard, TopK, build_shard, rank_ids, shard_bounds
from sembridge_ray.retrieval.metrics import (
    METRICS,
    PER_QUERY,
    RUN,
    empty_rows,
    empty_shares,
    mean_metrics,
    per_query_metrics,
    per_query_tsv,
    sparsity_stats,
    term_counts,
    unknown_judgements,
)
from sembridge_ray.retrieval.sharded import ShardedIndex
from sembridge_ray.retrieval.sources import resolve_dataset, resolve_model
from sembridge_ray.retrieval.store import (
    iter_row_ranges,
    parquet_files,
    read_ids,
    read_run,
    read_vectors,
    run_lines,
)
from sembridge_ray.runtime.config import write_config
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import Executor
from sembridge_ray.runtime.identity import Pin, RunIdentity, pin
from sembridge_ray.runtime.outputs import (
    atomic_path,
    atomic_write_json,
    atomic_write_text,
    claim_output,
    require_apart,
)
from sembridge_ray.runtime.progress import Progress, duration

log = logging.getLogger(__name__)
CONFIG = "config.yaml"


def run_evaluate(
    cfg: EvaluateConfig, inputs: dict[str, str] | None = None, *, executor: Executor
) -> EvaluateResult:
    """Encode, retrieve and score one (model, dataset, split); returns what ``metrics.json`` holds.

    Everything is resolved and checked before the output is touched; ``inputs`` (the model's and
    dataset's identities) may be given by a caller that planned them (``jobs.reproduce``)."""
    cfg.require_inputs()
    executor.start()
    cfg = dataclasses.replace(cfg, precision=executor.precision(cfg.precision, cfg.resources))
    model, model_id = resolve_model(cfg.model, cfg.trust_remote_code)
    spec, data_id = resolve_dataset(cfg.dataset)
    # the split, refused when it has no qrels or none of its judged queries has a text
    data = load_retrieval(spec, cfg.split)
    if not data.qrels:
        raise InputError(f"dataset {cfg.dataset!r}: split {data.split!r} has no qrels")
    if not any(data.queries.get(q, "").strip() for q in data.qrels):
        raise InputError(
            f"dataset {cfg.dataset!r}: none of the {len(data.qrels)} queries judged in split {data.split!r} has a text "
            f"({len(data.queries)} queries read)"
        )
    require_apart(Path(cfg.output), {"model": model, "dataset": spec})
    identity = cfg.identity("evaluate", inputs or {"model": model_id, "dataset": data_id})
    # what was loaded is what the identity names: checked before an encoding is cached and before
    # _SUCCESS
    pinned = pin(identity.inputs, {"model": model, "dataset": spec})
    out = Path(cfg.output)
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:
            finished = json.loads((out / METRICS).read_text(encoding="utf-8"))
            return EvaluateResult.from_metrics(str(out), finished, True)
        # the output, or its staging directory under --overwrite
        metrics = _evaluate_into(claim.path, cfg, model, data, identity, pinned, executor)
        claim.finish(exclude=("cache",))
    return EvaluateResult.from_metrics(str(out), metrics)


def _evaluate_into(
    work: Path,
    cfg: EvaluateConfig,
    model: str,
    data: RetrievalData,
    identity: RunIdentity,
    pinned: Pin,
    executor: Executor,
) -> dict[str, object]:
    """Encode (cached, by ``executor``'s pools), search and score into ``work``: its config, run
    and ``metrics.json``, which it returns."""
    write_config(cfg, work / CONFIG)
    clock = _Clock()
    if not cfg.cache_dir:
        cfg = dataclasses.replace(cfg, cache_dir=str(work / "cache"))
    qids = sorted(q for q in data.qrels if q in data.queries)
    ids = (identity.inputs["model"], identity.inputs["dataset"])
    (docs, docs_hit), (queries, queries_hit) = encode_judged(
        cfg.encoding(), model, data, qids, ids, pinned=pinned, executor=executor, lap=clock.lap
    )
    metrics = search_and_score(cfg, docs, queries, data, work / RUN, clock, executor)
    metrics |= {
        "cache": {"docs": docs_hit, "queries": queries_hit},
        "seconds": clock.laps,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "split": data.split,
        "top_k": cfg.top_k,
    }
    atomic_write_json(work / METRICS, metrics)
    pinned()
    return metrics


class _Clock:
    def __init__(self) -> None:
        self.start, self.laps = time.perf_counter(), dict[str, float]()

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.laps[name] = round(now - self.start, 2)
        self.start = now
        return self.laps[name]


def search_and_score(
    cfg: EvaluateConfig,
    docs: Path,
    queries: Path,
    data: RetrievalData,
    run_path: Path,
    clock: _Clock,
    executor: Executor,
) -> dict[str, object]:
    """Index the corpus in shards held by ``executor``'s workers, search every encoded query, write
    the run, score it."""
    files = parquet_files(docs)
    ranks, sorted_ids = rank_ids(read_ids(files))
    qids, qvec = read_vectors(parquet_files(queries))
    plan = executor.placement(
        dataclasses.replace(cfg.resources, gpus_per_worker=0.0), reserve=False
    )
    bounds = shard_bounds(len(ranks), cfg.shard_size, plan.workers)
    shards = ShardStream(files=files, bounds=bounds, ranks=ranks)
    built = Progress(log, "index: building shards", len(ranks), "documents")
    # more shards than workers: they share the workers' CPUs (each worker still holds one shard)
    cpus = plan.cpus_per_worker * min(1.0, plan.workers / len(bounds))
    # a line every EVERY_S seconds while the shards are built and their workers start
    with built.watch():
        index = ShardedIndex.start(executor, _counted(shards, built), len(ranks), cpus)
    seconds = duration(clock.lap("index"))
    log.info("index: %d documents in %d shards (%s)", len(ranks), len(bounds), seconds)
    try:
        progress = Progress(log, "search", qvec.rows, "queries")
        top = index.search(qvec, cfg.top_k, cfg.query_batch_size, progress=progress)
        actors = index.stats()
        progress.finish()
    finally:
        index.shutdown()
    with atomic_path(run_path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(run_lines(qids, top, sorted_ids, cfg.run_tag))
    clock.lap("search")
    return _metrics(
        data, run_path, sorted_ids, top, len(qids), term_counts(qvec.indices, 0), shards.doc_df
    ) | {
        **empty_shares(empty_rows(qvec.indptr), len(qids), shards.empty, len(ranks)),
        "shards": len(bounds),
        "actors": actors,
    }


def _counted(shards: ShardStream, progress: Progress) -> Iterator[Shard]:
    for shard in shards:
        yield shard
        progress.add(shard.n_docs)


@dataclass(kw_only=True)
class ShardStream:
    """The index shards, built one at a time from the encoded files as the actors take them (the
    corpus is never held whole), and the documents' term counts, summed as the shards go by
    (``doc_df``, complete once iterated)."""

    files: list[Path]
    bounds: list[tuple[int, int]]
    ranks: np.ndarray
    doc_df: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    empty: int = 0
    """Documents whose vector is empty (no active dimension), counted as the shards go by."""

    def __iter__(self) -> Iterator[Shard]:
        for (start, stop), rows in zip(
            self.bounds, iter_row_ranges(self.files, self.bounds), strict=True
        ):
            counts = term_counts(rows.indices, 0)
            size = max(len(self.doc_df), len(counts))
            self.doc_df = np.pad(self.doc_df, (0, size - len(self.doc_df))) + np.pad(
                counts, (0, size - len(counts))
            )
            self.empty += empty_rows(rows.indptr)
            yield build_shard(rows, self.ranks[start:stop], int(rows.indices.max(initial=-1)) + 1)


def _metrics(
    data: RetrievalData,
    run_path: Path,
    sorted_ids: pa.Array,
    top: TopK,
    n_queries: int,
    query_df: np.ndarray,
    doc_df: np.ndarray,
) -> dict[str, float]:
    judged = pa.array(sorted({d for docs in data.qrels.values() for d in docs}), pa.string())
    missing = set(pc.filter(judged, pc.invert(pc.is_in(judged, value_set=sorted_ids))).to_pylist())
    if missing:
        log.warning(
            "%d qrels documents are not in the corpus (counted in metrics.json)", len(missing)
        )
    per_query = per_query_metrics(data.qrels, read_run(run_path))
    atomic_write_text(run_path.parent / PER_QUERY, per_query_tsv(per_query))
    return mean_metrics(per_query) | {
        "num_queries": len(data.qrels),
        "queries_without_text": len(data.qrels) - n_queries,
        "queries_with_results": int(np.sum(top.ranks[:, 0] != PAD)) if len(top.ranks) else 0,
        "num_docs": len(sorted_ids),
        **sparsity_stats(query_df, n_queries, doc_df, len(sorted_ids)),
        **unknown_judgements(data.qrels, missing),
    }
