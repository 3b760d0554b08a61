"""Ray side of ``jobs.export``: a checkpoint as a SparseEncoder directory (``--target
sentence-transformers``, :func:`sembridge_ray.distributed.finetune.run_export`), or a model exported
to a target and checked there.

    run_export(cfg) -> ExportResult

For a target: every input is checked before any encoding (the target's package, ``--url`` answering,
the model and its tokenizer, the dataset's judged queries); the corpus and the queries are encoded
through the encoding the evaluate job uses (:func:`sembridge_ray.distributed.encode.encode_corpus`: Ray
Data actor pool, cached under the same keys as an evaluation's); the Ray-free adapter in
:mod:`sembridge_ray.export` builds the target; its top-10 on the queries is compared with the exact
search (:mod:`sembridge_ray.export.parity`); ``export_report.json`` is written in the output, the
parity is added to the model's card when it is a finished model of this project (its
``scores.json``, which its ``_SUCCESS`` leaves out; nothing else of the input model is written to),
and a target outside its tolerance fails the job with one line (exit 2)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, cast

from sembridge_ray.atomic import remove
from sembridge_ray.bundled import resolve
from sembridge_ray.data.registry import load_retrieval
from sembridge_ray.data.retrieval import RetrievalData
from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.encode import corpus_key, encode_corpus, encode_queries
from sembridge_ray.distributed.finetune import checkpoint_model
from sembridge_ray.distributed.finetune import run_export as run_checkpoint_export
from sembridge_ray.errors import InputError
from sembridge_ray.export.base import (
    Vectors,
    require_package,
    require_reachable,
    require_tokenizer,
    server_errors,
    size_on_disk,
)
from sembridge_ray.export.parity import K, exact_topk, parity
from sembridge_ray.export.report import ExportReport
from sembridge_ray.export.targets import Target, target
from sembridge_ray.identity import Pin, path_identity, pin
from sembridge_ray.jobs.evaluate import EvaluateConfig
from sembridge_ray.jobs.export import ExportConfig, ExportResult
from sembridge_ray.locks import LOCK
from sembridge_ray.manifest import IDENTITY
from sembridge_ray.model_card import record_export
from sembridge_ray.outputs import atomic_write_json, claim_output, require_apart
from sembridge_ray.progress import Progress, duration
from sembridge_ray.provenance import ExportParity
from sembridge_ray.retrieval.sources import resolve_dataset, resolve_model
from sembridge_ray.retrieval.store import fingerprint, parquet_files, read_vectors
from sembridge_ray.sparse.model import load_tokenizer

log = logging.getLogger(__name__)
REPORT = "export_report.json"


def run_export(cfg: ExportConfig) -> ExportResult:
    cfg.require_inputs()
    if cfg.target == "sentence-transformers":
        return run_checkpoint_export(cfg)
    return run_target_export(cfg)


def check_target(cfg: ExportConfig) -> Target:
    """The target, its package and its server: each refusal one line, before anything is read or
    encoded."""
    found = target(cfg.target)
    if found.imports:
        require_package(found.imports, found.package, found.name)
    if cfg.url:
        if not found.url:
            raise InputError(
                f"--url: target {found.name!r} has no server to push to (it is embedded)"
            )
        require_reachable(cfg.url, found.schemes)
    return found


def vocabulary(model: str, width: int) -> list[str]:
    """Token strings of term ids 0..width-1 from the model's (target) tokenizer; an id past the
    tokenizer (a padded vocabulary) is ``[unused-id-N]``."""
    tokenizer = load_tokenizer(model)
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(size, width))))
    return [str(t) for t in tokens] + [f"[unused-id-{i}]" for i in range(size, width)]


def run_target_export(cfg: ExportConfig) -> ExportResult:
    """Export to ``cfg.target`` under the output contract (:mod:`sembridge_ray.outputs`): a finished
    export with the same settings and inputs is skipped, an unfinished one is done again, another
    one is refused unless ``--overwrite``; ``_SUCCESS`` is written only when the target is within
    its tolerance."""
    found = check_target(cfg)
    data, spec, data_id, qids = _judged(cfg)
    if cfg.checkpoint:  # checked and read now; written as <output>/model once the output is held
        write_checkpoint = checkpoint_model(
            dataclasses.replace(cfg, target="sentence-transformers")
        )
        inputs = {"checkpoint": path_identity(Path(cfg.checkpoint)), "dataset": data_id}
        named = {"checkpoint": cfg.checkpoint}
    else:
        model, model_id = resolve_model(cfg.model)
        require_tokenizer(model)
        inputs, named = {"model": model_id, "dataset": data_id}, {"model": model}
    read = {**named, "dataset": spec}
    _require_writes_apart(cfg, read)
    cluster.require_reachable()
    identity = cfg.identity("export", inputs)
    # what was read is what the identity names: checked before an encoding is cached (the cache is
    # shared with evaluate's) and before the report (an --overwrite of the model since would put
    # one model's parity on another's card)
    pinned = pin(inputs, read)
    out = Path(cfg.output)
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:
            report = cast(ExportReport, json.loads((out / REPORT).read_text(encoding="utf-8")))
            if not cfg.checkpoint:
                _to_card(model, report)
            return ExportResult(output=str(out), target=found.name, report=report, skipped=True)
        work = claim.path  # the output, or its staging directory under --overwrite
        _clear_unfinished(work)
        if cfg.checkpoint:
            write_checkpoint(work / "model")
            model, model_id = resolve_model(str(work / "model"))
            require_tokenizer(model)
        key = fingerprint(model_id, data_id)
        report = _export_into(work, found, cfg, model, key, data, qids, pinned)
        pinned()
        atomic_write_json(work / REPORT, report)
        if report["passed"]:
            claim.finish(exclude=("cache",))
    if not cfg.checkpoint:
        _to_card(model, report)
    if not report["passed"]:
        raise _outside_tolerance(found, report, work / REPORT)
    return ExportResult(output=str(out), target=found.name, report=report)


def _require_writes_apart(cfg: ExportConfig, read: dict[str, str]) -> None:
    """The output and the encode cache are neither inside nor around what the export reads."""
    require_apart(Path(cfg.output), read)
    if cfg.cache_dir:
        require_apart(Path(cfg.cache_dir), read, "cache_dir")


def _outside_tolerance(found: Target, report: ExportReport, where: Path) -> InputError:
    return InputError(
        f"target {found.name!r} lost more than its tolerance {found.tolerance()}: overlap@10 "
        f"{report['overlap@10']}, identical up to ties {report['identical_up_to_ties']}, nDCG@10 "
        f"{report['ndcg@10_target']} vs {report['ndcg@10_exact']} exact ({where})"
    )


def _clear_unfinished(work: Path) -> None:
    """What an unfinished export left in ``work`` (a crash, or a target outside its tolerance) is
    built again: everything but the lock, the identity and the encoding cache goes."""
    for item in work.iterdir():
        if not item.name.startswith(LOCK) and item.name not in (IDENTITY, "cache"):
            remove(item)


def _export_into(
    work: Path,
    found: Target,
    cfg: ExportConfig,
    model: str,
    key: str,
    data: RetrievalData,
    qids: list[str],
    pinned: Pin,
) -> ExportReport:
    """Encode (cached), build the target in ``work``, search it and compare with the exact search:
    the report."""
    start = time.perf_counter()
    docs, queries = _encoded(cfg, work, model, key, data, qids, pinned)
    encoded = time.perf_counter()
    log.info(
        "export: %d documents, %d queries encoded; building %s", len(docs), len(queries), found.name
    )
    exact = exact_topk(docs, queries, K)
    vocab_size = len(load_tokenizer(model))
    hits, details, where = build_and_search(
        found, cfg, work, model, docs, queries, data, vocab_size
    )
    built = time.perf_counter()
    report = ExportReport(
        {
            "target": found.name,
            "model": "model (from the checkpoint)" if cfg.checkpoint else cfg.model,
            "dataset": cfg.dataset,
            "split": data.split,
            "documents": len(docs),
            "postings": docs.postings,
            "bytes": size_on_disk(where) if where.exists() else 0,
            "seconds": round(built - start, 2),
            "seconds_by_stage": {
                "encode": round(encoded - start, 2),
                "export_and_search": round(built - encoded, 2),
            },
            **parity(docs, queries, hits, data.qrels, K, exact).report(),
            "tolerance": found.tolerance(),
            "details": details,
        }
    )
    if cfg.checkpoint:
        report["checkpoint"] = cfg.checkpoint
    report["passed"] = passes(found, report)
    return report


def export_parity(report: ExportReport) -> ExportParity:
    """What a model's card keeps of an export report."""
    return ExportParity(
        target=report["target"],
        dataset=report["dataset"],
        split=report["split"],
        queries=report["queries"],
        documents=report["documents"],
        overlap10=report["overlap@10"],
        ndcg10_exact=report["ndcg@10_exact"],
        ndcg10_target=report["ndcg@10_target"],
        passed=report["passed"],
    )


def _to_card(model: str, report: ExportReport) -> None:
    """The parity onto the model's card, when it is a finished model of this project."""
    try:
        record_export(model, export_parity(report))
    except Exception as err:  # the card is a courtesy: the parity is safe in the report
        log.warning("the parity was not added to the model card of %s: %s", model, err)


def _judged(cfg: ExportConfig) -> tuple[RetrievalData, str, str, list[str]]:
    """The dataset's split, what was read, its identity and its judged query ids with a text (none:
    refused)."""
    spec, data_id = resolve_dataset(cfg.dataset)
    data = load_retrieval(spec, cfg.split)
    qids = sorted(q for q in data.qrels if data.queries.get(q, "").strip())
    if not qids:
        raise InputError(
            f"dataset {cfg.dataset!r}: split {data.split!r} has no judged query with a text"
        )
    _require_relevant_in_corpus(cfg.dataset, data, qids)
    return data, spec, data_id, qids


def _require_relevant_in_corpus(dataset: str, data: RetrievalData, qids: list[str]) -> None:
    """Refused when no document judged relevant (grade > 0) to the queries is in the corpus: nDCG@10
    would be 0 for any ranking, and a target held to an nDCG tolerance would pass whatever it
    returned. Some of them missing: a warning (both runs count them as never found)."""
    relevant = {d for q in qids for d, grade in data.qrels[q].items() if grade > 0}
    corpus = {d for batch in data.corpus.batches(100_000) for d in batch.column(ID).to_pylist()}
    missing = relevant - corpus
    if len(missing) == len(relevant):
        why = f"none of the {len(relevant)} is in the corpus" if relevant else "every grade is 0"
        raise InputError(
            f"dataset {dataset!r}: split {data.split!r}: no document judged relevant to its "
            f"{len(qids)} queries to score them with ({why}): nDCG@10 would be 0 whatever the "
            "target returned"
        )
    if missing:
        log.warning(
            "%d of the %d documents judged relevant are not in the corpus: nDCG@10 counts them as "
            "never found (the exact search's and the target's alike)",
            len(missing),
            len(relevant),
        )


def _encoded(
    cfg: ExportConfig,
    out: Path,
    model: str,
    key: str,
    data: RetrievalData,
    qids: list[str],
    pinned: Pin,
) -> tuple[Vectors, Vectors]:
    """The corpus and the judged queries, encoded as the evaluate job encodes them (and cached under
    its keys, pinned as it pins them)."""
    eval_cfg = EvaluateConfig(
        model=model,
        dataset=cfg.dataset,
        split=cfg.split,
        output=str(out),
        max_query_length=cfg.max_query_length,
        max_doc_length=cfg.max_doc_length,
        cache_dir=cfg.cache_dir or str(out / "cache"),
        resources=cfg.resources,
    )
    eval_cfg = dataclasses.replace(
        eval_cfg, precision=cluster.resolve_precision(eval_cfg.precision, cfg.resources)
    )
    cache = Path(eval_cfg.cache_dir)
    corpus = corpus_key(key, resolve(cfg.dataset), data.split)
    docs_dir, _ = encode_corpus(eval_cfg, model, data, corpus, cache, pinned=pinned)
    queries_dir, _ = encode_queries(
        eval_cfg, model, data, qids, fingerprint(key, data.split), cache, pinned=pinned
    )
    docs, queries = (Vectors(*read_vectors(parquet_files(d))) for d in (docs_dir, queries_dir))
    return docs, queries


def passes(found: Target, report: ExportReport) -> bool:
    if found.kind == "variant":
        return True
    if found.exact:
        return bool(report["identical_up_to_ties"] == 1.0)
    loss = (report["ndcg@10_exact"] or 0.0) - (report["ndcg@10_target"] or 0.0)
    return bool(report["overlap@10"] >= found.min_overlap and loss <= found.max_ndcg_loss + 1e-9)


def build_and_search(
    found: Target,
    cfg: ExportConfig,
    out: Path,
    model: str,
    docs: Vectors,
    queries: Vectors,
    data: RetrievalData,
    tokenizer_size: int,
) -> tuple[list[list[str]], dict[str, Any], Path]:
    """Build the target in ``out``; its top-k for ``queries``, what the report says about it, and
    its files."""
    if found.kind == "engine":
        adapter: Any = found.adapter()
        with server_errors(cfg.url, found.schemes):
            hits, details = _engine_hits(found.name, adapter, out, docs, queries, cfg.url)
            return hits, details, out / adapter.LOCATION
    if found.kind == "files":
        from sembridge_ray.export import lucene

        width = max(
            tokenizer_size, max(int(v.rows.indices.max(initial=-1)) + 1 for v in (docs, queries))
        )
        with server_errors(cfg.url, found.schemes):
            doing = "uploading" if cfg.url else "writing the files"
            sent = Progress(log, f"{found.name}: {doing}", len(docs), "documents")
            with sent.watch():
                files, details = lucene.build(
                    out, found.name, docs, queries, vocabulary(model, width), K, cfg.url, sent.add
                )
            sent.finish()
            searched = Progress(log, f"{found.name}: searching", len(queries), "queries")
            with searched.watch():
                hits = files.search(queries, K, tally=searched.add)
            searched.finish()
            return hits, details, out / found.name
    texts = {
        d: t
        for batch in data.corpus.batches(10_000)
        for d, t in zip(batch.column(ID).to_pylist(), batch.column(TEXT).to_pylist(), strict=True)
    }
    if found.kind == "variant":
        return _doc_only(cfg, out, model, docs, queries, data, texts, tokenizer_size)
    return _onnx(found, cfg, out, model, docs, queries, data, texts)


NOTICE_S = 60.0
"""An embedded engine expected to take longer than this (build and search) says so, and why, before
it starts."""


def _engine_hits(
    name: str, adapter: Any, out: Path, docs: Vectors, queries: Vectors, url: str
) -> tuple[list[list[str]], dict[str, Any]]:
    """Build the engine and search it, with progress lines (done / total, ETA) at least every
    :data:`~sembridge_ray.progress.EVERY_S` seconds, after a line saying how long an embedded
    engine will take when its measured rates (the adapter's ``RATES``) make that long."""
    rates = None if url else getattr(adapter, "RATES", None)
    build_s: float | None = None
    search_s: float | None = None
    if rates is not None:
        build_s, search_s = rates.seconds(docs, queries)
        _notice_slow(name, adapter.WHY_SLOW, docs, queries, build_s, search_s)
    built = Progress(log, f"{name}: indexing", len(docs), "documents", expected_s=build_s)
    with built.watch():
        engine, details = adapter.build(out, docs, url, tally=built.add)
    built.finish()
    try:
        searched = Progress(log, f"{name}: searching", len(queries), "queries", expected_s=search_s)
        with searched.watch():
            hits = engine.search(queries, K, tally=searched.add)
        searched.finish()
    finally:
        engine.close()
    return hits, details


def _notice_slow(
    name: str, why: str, docs: Vectors, queries: Vectors, build_s: float, search_s: float
) -> None:
    """One line, before a build its measured rates expect to take longer than :data:`NOTICE_S`:
    how long and why."""
    if build_s + search_s <= NOTICE_S:
        return
    log.warning(
        "%s will take about %s here (%s to build, %s to search): %s documents of %s postings each, "
        "%s queries of %s, at the rates measured for it; %s (a server through --url, or "
        "--target pisa, is much faster)",
        name,
        duration(build_s + search_s),
        duration(build_s),
        duration(search_s),
        f"{len(docs):,}",
        f"{docs.postings / max(len(docs), 1):,.0f}",
        f"{len(queries):,}",
        f"{queries.postings / max(len(queries), 1):,.0f}",
        why,
    )


def _doc_only(
    cfg: ExportConfig,
    out: Path,
    model: str,
    docs: Vectors,
    queries: Vectors,
    data: RetrievalData,
    texts: dict[str, str],
    tokenizer_size: int,
) -> tuple[list[list[str]], dict[str, Any], Path]:
    """The inference-free variant (IDF of the corpus on the query side) and its top-k over the
    encoded documents."""
    from sembridge_ray.export import doc_only
    from sembridge_ray.sparse.encode import sparse_rows

    folder = out / "model-doc-only"
    width = max(tokenizer_size, int(docs.rows.indices.max(initial=-1)) + 1)
    weights = doc_only.idf(load_tokenizer(model), (texts[d] for d in docs.ids), width)
    variant = doc_only.write(model, folder, weights, cfg.dataset, cfg.max_doc_length)
    asked = variant.encode_query([data.queries[q] for q in queries.ids], convert_to_tensor=True)
    static = Vectors.from_rows(queries.ids, *sparse_rows(asked))
    # the document route is the model's own: the documents' vectors are the ones encoded
    return exact_topk(docs, static, K), {"model": folder.name, "idf_corpus": cfg.dataset}, folder


def _onnx(
    found: Target,
    cfg: ExportConfig,
    out: Path,
    model: str,
    docs: Vectors,
    queries: Vectors,
    data: RetrievalData,
    texts: dict[str, str],
) -> tuple[list[list[str]], dict[str, Any], Path]:
    """The ONNX export; the corpus and the queries encoded again through it, searched exactly."""
    from sembridge_ray.export import onnx

    folder = out / "onnx"
    details = onnx.export(model, folder, found.name, cfg.max_query_length, cfg.max_doc_length)
    encoder = onnx.OnnxSparseEncoder(folder, threads=cfg.resources.threads_per_worker)
    encoded = []
    for role, vectors, text in (("document", docs, texts), ("query", queries, data.queries)):
        progress = Progress(log, f"{found.name}: encoding {role}s", len(vectors), "texts")
        with progress.watch():
            rows = encoder.encode([text[i] for i in vectors.ids], role, tally=progress.add)
        progress.finish()
        encoded.append(Vectors.from_rows(vectors.ids, *rows))
    return exact_topk(encoded[0], encoded[1], K), details, folder
