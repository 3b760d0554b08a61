"""The export job, written against the executor: a checkpoint as a SparseEncoder directory (``--target
sentence-transformers``, :func:`sembridge_ray.recipes.export.checkpoint.checkpoint_model`), or a model exported
to a target and checked there.

    run_export(cfg, executor=...) -> ExportResult

For a target: every input is checked before any encoding (the target's package, ``--url`` answering,
the model and its tokenizer, the dataset's judged queries); the corpus and the queries are encoded
by the step the evaluate job uses (:mod:`sembridge_ray.retrieval.encode`: Ray Data actor pool,
cached under the same keys as an evaluation's); the target (an
:class:`~sembridge_ray.export.base.ExportTarget` of the Ray-free registry
:mod:`sembridge_ray.export.targets`) is built and searched; its top-10 on the queries is compared
with the exact search (:mod:`sembridge_ray.export.parity`); ``export_report.json`` is written in the
output (a published model's card shows it when named at publish time, ``--scores``), and a target
outside its tolerance fails the job with one line (exit 2)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import cast

from sembridge_ray.data.retrieval import RetrievalData
from sembridge_ray.export.base import (
    ExportJob,
    ExportTarget,
    Vectors,
    require_package,
    require_reachable,
    require_tokenizer,
    size_on_disk,
)
from sembridge_ray.export.parity import K, exact_topk, judged, parity
from sembridge_ray.export.report import REPORT, ExportReport
from sembridge_ray.export.targets import MODEL_DIRECTORY, target
from sembridge_ray.recipes.export.checkpoint import checkpoint_model
from sembridge_ray.recipes.export.config import ExportConfig, ExportResult
from sembridge_ray.retrieval.encode import encode_judged
from sembridge_ray.retrieval.settings import Encoding
from sembridge_ray.retrieval.sources import resolve_dataset, resolve_model
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import Executor
from sembridge_ray.runtime.identity import Pin, path_identity, pin
from sembridge_ray.runtime.outputs import atomic_write_json, claim_output, require_apart
from sembridge_ray.sparse.model import load_tokenizer

log = logging.getLogger(__name__)


def run_export(cfg: ExportConfig, *, executor: Executor) -> ExportResult:
    cfg.require_inputs()
    if cfg.target == MODEL_DIRECTORY:  # the checkpoint as the SparseEncoder directory it publishes
        out = Path(cfg.output)
        return checkpoint_model(cfg, new_output=out)(out)
    return run_target_export(cfg, executor)


def check_target(cfg: ExportConfig) -> ExportTarget:
    """The target, its package and its server: each refusal one line, before anything is read or
    encoded."""
    found = target(cfg.target)
    if found.package:
        require_package(found.package.module, found.package.pip, found.name)
    if cfg.url:
        if not found.schemes:
            raise InputError(
                f"--url: target {found.name!r} has no server to push to (it is embedded)"
            )
        require_reachable(cfg.url, found.schemes)
    return found


def run_target_export(cfg: ExportConfig, executor: Executor) -> ExportResult:
    """Export to ``cfg.target`` under the output contract (:mod:`sembridge_ray.runtime.outputs`): a finished
    export with the same settings and inputs is skipped, an unfinished one is done again, another
    one is refused unless ``--overwrite``; ``_SUCCESS`` is written only when the target is within
    its tolerance."""
    found = check_target(cfg)
    spec, data_id = resolve_dataset(cfg.dataset)
    data, qids = judged(cfg.dataset, spec, cfg.split)
    if cfg.checkpoint:  # checked and read now; written as <output>/model once the output is held
        write_checkpoint = checkpoint_model(cfg)  # reads only cfg.checkpoint and cfg.select
        inputs = {"checkpoint": path_identity(Path(cfg.checkpoint)), "dataset": data_id}
        named = {"checkpoint": cfg.checkpoint}
    else:
        model, model_id = resolve_model(cfg.model)
        require_tokenizer(model)
        inputs, named = {"model": model_id, "dataset": data_id}, {"model": model}
    read = {**named, "dataset": spec}  # the output and the encode cache are apart from it
    require_apart(Path(cfg.output), read)
    if cfg.cache_dir:
        require_apart(Path(cfg.cache_dir), read, "cache_dir")
    executor.start()  # the cluster answers (RAY_ADDRESS), before the output is claimed
    identity = cfg.identity("export", inputs)
    # what was read is what the identity names: checked before an encoding is cached (the cache is
    # shared with evaluate's) and before the report
    pinned = pin(inputs, read)
    out = Path(cfg.output)
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:
            report = cast(ExportReport, json.loads((out / REPORT).read_text(encoding="utf-8")))
            return ExportResult(output=str(out), target=found.name, report=report, skipped=True)
        work = claim.path  # the output, or its staging directory under --overwrite
        claim.restart(keep=("cache",))  # an unfinished export is built again
        if cfg.checkpoint:
            write_checkpoint(work / "model")
            model, model_id = resolve_model(str(work / "model"))
            require_tokenizer(model)
        encode = partial(
            _encoded, cfg, work, model, (model_id, data_id), data, qids, pinned, executor
        )
        report = _export_into(work, found, cfg, model, data, encode)
        pinned()
        atomic_write_json(work / REPORT, report)
        if report["passed"]:
            claim.finish(exclude=("cache",))
    if not report["passed"]:
        raise _outside_tolerance(found, report, work / REPORT)
    return ExportResult(output=str(out), target=found.name, report=report)


def _outside_tolerance(found: ExportTarget, report: ExportReport, where: Path) -> InputError:
    return InputError(
        f"target {found.name!r} lost more than its tolerance {found.tolerance.rule()}: overlap@10 "
        f"{report['overlap@10']}, identical up to ties {report['identical_up_to_ties']}, nDCG@10 "
        f"{report['ndcg@10_target']} vs {report['ndcg@10_exact']} exact ({where})"
    )


def _export_into(
    work: Path,
    found: ExportTarget,
    cfg: ExportConfig,
    model: str,
    data: RetrievalData,
    encode: Callable[[], tuple[Vectors, Vectors]],
) -> ExportReport:
    """Encode (``encode``: cached), build the target in ``work``, search it and compare with the
    exact search: the report."""
    start = time.perf_counter()
    docs, queries = encode()
    encoded = time.perf_counter()
    log.info(
        "export: %d documents, %d queries encoded; building %s", len(docs), len(queries), found.name
    )
    exact = exact_topk(docs, queries, K)
    built = found.export(_job(cfg, work, model, docs, queries, data))
    done = time.perf_counter()
    report = ExportReport(
        {
            "target": found.name,
            "model": "model (from the checkpoint)" if cfg.checkpoint else cfg.model,
            "dataset": cfg.dataset,
            "split": data.split,
            "documents": len(docs),
            "postings": docs.postings,
            "bytes": size_on_disk(built.files) if built.files.exists() else 0,
            "seconds": round(done - start, 2),
            "seconds_by_stage": {
                "encode": round(encoded - start, 2),
                "export_and_search": round(done - encoded, 2),
            },
            **parity(docs, queries, built.hits, data.qrels, K, exact).report(),
            "tolerance": found.tolerance.rule(),
            "details": built.details,
        }
    )
    if cfg.checkpoint:
        report["checkpoint"] = cfg.checkpoint
    report["passed"] = found.tolerance.passes(report)
    return report


def _job(
    cfg: ExportConfig, work: Path, model: str, docs: Vectors, queries: Vectors, data: RetrievalData
) -> ExportJob:
    """What the target is built from (its progress lines are this job's)."""
    return ExportJob(
        out=work,
        model=model,
        docs=docs,
        queries=queries,
        data=data,
        dataset=cfg.dataset,
        tokenizer_size=len(load_tokenizer(model)),
        url=cfg.url,
        max_query_length=cfg.max_query_length,
        max_doc_length=cfg.max_doc_length,
        threads=cfg.resources.threads_per_worker,
        k=K,
        log=log,
    )


def _encoded(
    cfg: ExportConfig,
    out: Path,
    model: str,
    identities: tuple[str, str],
    data: RetrievalData,
    qids: list[str],
    pinned: Pin,
    executor: Executor,
) -> tuple[Vectors, Vectors]:
    """The corpus and the judged queries, encoded as the evaluate job encodes them (and cached under
    its keys, pinned as it pins them)."""
    settings = Encoding(
        dataset=cfg.dataset,
        max_query_length=cfg.max_query_length,
        max_doc_length=cfg.max_doc_length,
        cache_dir=cfg.cache_dir or str(out / "cache"),
        resources=cfg.resources,
        precision=executor.precision("auto", cfg.resources),
    )
    (docs_dir, _), (queries_dir, _) = encode_judged(
        settings, model, data, qids, identities, pinned=pinned, executor=executor
    )
    return Vectors.read(docs_dir), Vectors.read(queries_dir)
