"""The init job, as glue: inputs checked and identified, the output claimed, the inputs loaded,
the source model transferred to the target vocabulary (:func:`sembridge_ray.embed_init.transfer.transfer`:
all of the maths), the model written with its provenance, report
(``embed_init.report.init_report``), card and config, and the model pushed when asked.

:func:`run_init` runs the transfer's two heavy stages as pools of an executor
(``embed_init.pipeline.pool_stages``: Ray Data actor pools, or this process on ``LocalExecutor``);
:func:`initialise` takes any :class:`~sembridge_ray.embed_init.pipeline.Stages` (tests and scripts
give it the in-process ones, :func:`local_stages`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from sembridge_ray.embed_init import transfer
from sembridge_ray.embed_init.pipeline import Stages, in_process_stages, pool_stages
from sembridge_ray.embed_init.report import init_report
from sembridge_ray.embed_init.transplant import write_target_model
from sembridge_ray.model_card import write_card
from sembridge_ray.provenance import (
    InitFacts,
    base_model,
    display_name,
    input_licences,
    language_of,
)
from sembridge_ray.publish import check_scores, publish
from sembridge_ray.recipes.init.config import InitConfig, InitResult
from sembridge_ray.runtime.config import write_config
from sembridge_ray.runtime.executor import Executor
from sembridge_ray.runtime.outputs import atomic_path, atomic_write_json, claim_output, preflight
from sembridge_ray.runtime.placement import local_precision, pick_device
from sembridge_ray.runtime.progress import duration
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import Serving, check_push, read_pooling

log = logging.getLogger(__name__)
REPORT, MODEL = "init_report.json", "model"


def run_init(
    cfg: InitConfig,
    inputs: dict[str, str] | None = None,
    *,
    executor: Executor,
    neutral_symbols: bool = True,
) -> InitResult:
    """One initialisation on ``executor`` (inputs checked in the driver first; a finished output is
    skipped). ``neutral_symbols``: see :func:`initialise` (an ablation, no config key)."""
    executor.start()
    cfg = replace(cfg, precision=executor.precision(cfg.precision, cfg.resources))
    bridge = {
        "name": cfg.bridge_model,
        "batch_size": cfg.bridge_batch_size,
        "trust_remote_code": cfg.trust_remote_code,
        "threads": cfg.resources.threads_per_worker,
        "precision": cfg.precision,
    }
    stages = pool_stages(
        executor, cfg.resources, bridge, cfg.bridge_batch_size, cfg.rows_batch_size
    )
    return initialise(cfg, stages, inputs, neutral_symbols=neutral_symbols)


def local_stages(cfg: InitConfig) -> Stages:
    """Both heavy stages in this process, as ``cfg`` sets them."""
    return in_process_stages(
        cfg.bridge_model, cfg.bridge_batch_size, cfg.precision, cfg.trust_remote_code
    )


def input_identities(cfg: InitConfig) -> dict[str, str]:
    """Check that every input exists (before anything is loaded or written) and identify it by
    content (``transfer.input_identities``)."""
    cfg.require_inputs()
    return transfer.input_identities(cfg.transfer())


def initialise(
    cfg: InitConfig,
    stages: Stages | None = None,
    inputs: dict[str, str] | None = None,
    *,
    neutral_symbols: bool = True,
) -> InitResult:
    """Run the whole initialisation into ``cfg.output`` (model dir, provenance, report, config,
    _SUCCESS), then push the model when ``push_to_hub`` is set (also a finished output's: a rerun
    publishes without recomputing).

    Inputs are checked and loaded before the output is claimed
    (:func:`~sembridge_ray.runtime.outputs.claim_output`): bad input leaves an existing output untouched.
    ``inputs`` (identities) may come from a caller that planned them (``jobs.reproduce``).
    ``neutral_symbols=False`` is the position-aware ablation of the neutral class
    (``scripts/position_aware/variants.py``; ``position.position_class``): no config key, since no
    user would pick it, and so in no identity either: give such a run an output of its own."""
    if cfg.push_to_hub:
        check_push(cfg.push_to_hub)  # before any work: a push that cannot happen fails in a second
    result = _initialise(cfg, stages, inputs, neutral_symbols)
    if not cfg.push_to_hub:
        return result
    return replace(result, pushed=publish(Path(result.output), MODEL, cfg.push_to_hub, cfg.scores))


def _initialise(
    cfg: InitConfig, stages: Stages | None, inputs: dict[str, str] | None, neutral_symbols: bool
) -> InitResult:
    # as the user named the inputs (bundled names, hub ids): what the report and the card show
    named = cfg
    # bundled names materialised to paths (for the actors); ``precision: auto`` resolved for this
    # process (run_init resolves the actors'), a set one kept as it is without probing a device
    precision = cfg.precision
    if precision == "auto":
        precision = local_precision(precision, use_gpu=pick_device() == "cuda")
    cfg = replace(cfg.resolved(), precision=precision)
    stages = stages or local_stages(cfg)
    identity = cfg.identity("init", inputs or input_identities(cfg))
    if cfg.push_to_hub:
        check_scores(identity, MODEL, cfg.scores)
    out = Path(cfg.output)
    if preflight(out, identity, cfg.overwrite):
        return _skipped(out)
    start = time.perf_counter()
    settings = cfg.transfer(neutral_symbols)
    loaded = transfer.load_inputs(settings)
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:  # another run finished it meanwhile
            return _skipped(out)
        timings = {"load_and_partition_s": time.perf_counter() - start}
        done = transfer.transfer(settings, loaded, stages, timings)
        start = time.perf_counter()
        # with the inputs as the user named them
        rep = init_report(named.transfer(), named.weighting, done, cfg.samples, timings)
        card = {"init": card_facts(named, InitResult.from_report(str(out), rep), cfg)}
        # claim.path: the output or its staging
        _write_outputs(claim.path, cfg, done, card)
        timings["compose_and_write_s"] += time.perf_counter() - start
        rep["timings"] = {k: round(v, 3) for k, v in timings.items()}
        atomic_write_json(claim.path / REPORT, rep)
        transfer.require_unchanged(settings, identity.inputs)
        claim.finish()
        seconds = duration(timings["compose_and_write_s"])
        tokens = done.provenance.num_rows
        log.info("wrote %s: model, provenance of %d tokens, report (%s)", out, tokens, seconds)
    return InitResult.from_report(str(out), rep)


def _skipped(out: Path) -> InitResult:
    """The result of an output already complete with the same settings, from its report."""
    report = json.loads((out / REPORT).read_text(encoding="utf-8"))
    return InitResult.from_report(str(out), report, skipped=True)


def _write_outputs(
    work: Path, cfg: InitConfig, done: transfer.Transfer, card: Mapping[str, object]
) -> None:
    """Write the config, the model directory (with its ``card``) and the provenance into
    ``work``."""
    write_config(cfg, work / "config.yaml")
    # never a NaN model complete
    require_finite(done.model.state_dict(), f"the initialised model for {Path(cfg.output)}")
    with atomic_path(work / MODEL) as tmp:
        serving = Serving(
            query_length=cfg.query_length,
            document_length=cfg.document_length,
            pooling=read_pooling(cfg.source_model),
        )
        write_target_model(done.model, done.tokenizer, tmp, serving)
        write_card(tmp, card)
    with atomic_path(work / "provenance.parquet") as tmp:
        pq.write_table(done.provenance, tmp)


def card_facts(cfg: InitConfig, result: InitResult, resolved: InitConfig) -> InitFacts:
    """What the model card says about an initialisation (``cfg`` with the inputs as the user named
    them, ``resolved`` with bundled names materialised to paths) and what it made (``result``):
    names without absolute paths, the base model on the hub, the target language and the licence of
    every input (:mod:`sembridge_ray.provenance`)."""
    # the bridge model the run read, if any: the report fingerprints it
    bridge = cfg.bridge_model if result.report["fingerprints"]["bridge_model"] else ""
    bias_text = cfg.bias_text if cfg.bias == "frequency" else ""
    return {
        "source_model": display_name(cfg.source_model),
        "target_tokenizer": display_name(cfg.target_tokenizer),
        "bridge_model": display_name(bridge),
        "language": cfg.language or language_of(cfg.target_tokenizer, resolved.target_tokenizer),
        "method": cfg.method,
        "alpha": cfg.weighting.alpha,
        "position_aware": cfg.weighting.position_aware,
        "kinds": result.kinds,
        "support_histogram": result.support_histogram,
        "base_model": base_model(cfg.source_model, resolved.source_model),
        "vocab_size": result.report["target_size"],
        "query_length": cfg.query_length,
        "document_length": cfg.document_length,
        "licences": [
            *input_licences("source model", cfg.source_model, resolved.source_model),
            *input_licences("target tokenizer", cfg.target_tokenizer, resolved.target_tokenizer),
            *input_licences("bridge model", bridge, resolved.bridge_model if bridge else ""),
            *input_licences("decoder-bias text", bias_text, bias_text),
        ],
    }
