"""The init job end to end, without Ray: inputs checked and identified, the output claimed, the
vocabulary partitioned, new rows from the injected stages (``embed_init.pipeline``), the model
composed and written with its provenance, report and card. ``sembridge_ray.recipes.init.run`` runs
it with an executor's pools as the stages (``embed_init.pipeline.pool_stages``); tests and scripts
with the in-process ones."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.bundled import resolve
from sembridge_ray.embed_init import position, report
from sembridge_ray.embed_init.bias_text import bias_counts, require_varying_counts
from sembridge_ray.embed_init.bridge import (
    bridge_dimension,
    check_bridge,
    model_fingerprint,
)
from sembridge_ray.embed_init.combine import provenance
from sembridge_ray.embed_init.methods import method
from sembridge_ray.embed_init.pipeline import (
    BridgeSide,
    Stages,
    bridge_side,
    in_process_stages,
)
from sembridge_ray.embed_init.records import InitReport
from sembridge_ray.embed_init.rows import RowRule, new_rows
from sembridge_ray.embed_init.transplant import (
    composed_model,
    frequency_bias,
    source_matrices,
    write_target_model,
)
from sembridge_ray.embed_init.vocab import Partition, partition_vocab
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
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import model_identity, path_identity, require_unchanged
from sembridge_ray.runtime.outputs import atomic_path, atomic_write_json, claim_output, preflight
from sembridge_ray.runtime.placement import local_precision, pick_device
from sembridge_ray.runtime.progress import duration
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import (
    Serving,
    check_push,
    load_mlm,
    load_tokenizer,
    read_pooling,
)
from sembridge_ray.target_tokenizers import require_vocabulary

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)
REPORT, MODEL = "init_report.json", "model"


def local_stages(cfg: InitConfig) -> Stages:
    """Both heavy stages in this process, as ``cfg`` sets them."""
    return in_process_stages(
        cfg.bridge_model, cfg.bridge_batch_size, cfg.precision, cfg.trust_remote_code
    )


def input_identities(cfg: InitConfig) -> dict[str, str]:
    """Check that every input exists (before anything is loaded or written) and identify it by
    content."""
    if not (cfg.source_model and cfg.target_tokenizer and cfg.output):
        raise InputError("--model, --target-tokenizer and --output are required")
    inputs = {
        "source_model": model_identity(cfg.source_model, "source model"),
        "target_tokenizer": model_identity(cfg.target_tokenizer, "target tokenizer"),
    }
    if method(cfg.method).uses_bridge:
        inputs["bridge_model"] = check_bridge(cfg.bridge_model)
        components = cfg.weighting.bridge_components
        dim = bridge_dimension(cfg.bridge_model) if cfg.weighting.bridge_space == "abtt" else None
        if dim is not None and components >= dim:
            raise InputError(
                f"bridge_components={components}: must be below the bridge's dimension {dim} (abtt removes "
                "that many principal directions; all of them leave no bridge)"
            )
    if cfg.bias == "frequency":
        text = Path(cfg.bias_text)
        if not text.is_file():
            raise InputError(
                f"--bias-text {cfg.bias_text}: no such file (a .txt or Parquet file of target text)"
            )
        inputs["bias_text"] = path_identity(text)
    return inputs


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
    cfg = _resolved(cfg)
    stages = stages or local_stages(cfg)
    identity = cfg.identity("init", inputs or input_identities(cfg))
    if cfg.push_to_hub:
        check_scores(identity, MODEL, cfg.scores)
    out = Path(cfg.output)
    if preflight(out, identity, cfg.overwrite):
        return _skipped(out)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    model, source_tok, target_tok, counts = _load_inputs(cfg)
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:  # another run finished it meanwhile
            return _skipped(out)
        part = partition_vocab(source_tok, target_tok, cfg.match, copy_overlap=cfg.copy_overlap)
        timings["load_and_partition_s"] = time.perf_counter() - start
        if counts is not None:
            require_varying_counts(counts, part.rest, cfg.bias_text)
        _log_partition(part, cfg.method, timings["load_and_partition_s"])
        matrices = source_matrices(model)
        toks = {"source": source_tok, "target": target_tok}
        sizes = {"source": len(matrices[0]), "target": part.size}
        bridge = bridge_side(
            cfg.method, cfg.rule, cfg.precision, cfg.bridge_model, toks, sizes, neutral_symbols
        )
        rule = RowRule(
            method=cfg.method,
            weighting=cfg.rule,
            seed=cfg.seed,
            precision=cfg.precision,
            cache_dir=Path(cfg.cache_dir),
            exclude_special_sources=cfg.exclude_special_sources,
        )
        new = new_rows(rule, part, matrices, (source_tok, target_tok), stages, bridge, timings)
        if counts is not None and matrices[2] is not None:
            new = frequency_bias(new, counts, matrices[2], source_tok)
        start = time.perf_counter()
        model = composed_model(model, target_tok, part, new, matrices, cfg.bias)
        prov = provenance(part, new, {i: t for t, i in target_tok.get_vocab().items()})
        counterparts = position.exact_counterparts(source_tok, target_tok, part.rest)
        rep = _report(named, part, prov, source_tok, timings, bridge, counterparts)
        # claim.path: the output or its staging
        _write_outputs(claim.path, cfg, named, model, target_tok, rep, prov)
        timings["compose_and_write_s"] = time.perf_counter() - start
        rep["timings"] = {k: round(v, 3) for k, v in timings.items()}
        atomic_write_json(claim.path / REPORT, rep)
        _require_inputs_unchanged(identity.inputs, cfg)
        claim.finish()
        _log_written(out, prov.num_rows, timings["compose_and_write_s"])
    return InitResult.from_report(str(out), rep)


def _load_inputs(
    cfg: InitConfig,
) -> tuple[
    PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerBase, dict[int, int] | None
]:
    """The source model and tokenizer, the target tokenizer, and ``bias_text``'s token counts
    (``bias: frequency`` only): everything read before the output is claimed."""
    model, source_tok = load_mlm(cfg.source_model, cfg.trust_remote_code)
    target_tok = load_tokenizer(cfg.target_tokenizer, cfg.trust_remote_code)
    require_vocabulary(target_tok, cfg.target_tokenizer)
    counts = bias_counts(target_tok, cfg.bias_text) if cfg.bias == "frequency" else None
    return model, source_tok, target_tok, counts


def _log_written(out: Path, tokens: int, seconds: float) -> None:
    """One log line: the output is complete."""
    log.info(
        "wrote %s: model, provenance of %d tokens, report (%s)", out, tokens, duration(seconds)
    )


def _resolved(cfg: InitConfig) -> InitConfig:
    """``cfg`` with bundled names materialised to paths (for the actors) and ``precision: auto``
    resolved here."""
    cfg = replace(
        cfg,
        source_model=resolve(cfg.source_model),
        target_tokenizer=resolve(cfg.target_tokenizer),
        bridge_model=resolve(cfg.bridge_model),
    )  # bundled names: paths for the actors
    # in this process (run_init resolves it for the actors before building them)
    if cfg.precision == "auto":
        cfg = replace(
            cfg, precision=local_precision(cfg.precision, use_gpu=pick_device() == "cuda")
        )
    return cfg


def _skipped(out: Path) -> InitResult:
    """The result of an output already complete with the same settings, from its report."""
    return InitResult.from_report(
        str(out), json.loads((out / REPORT).read_text(encoding="utf-8")), skipped=True
    )


def _log_partition(part: Partition, method_name: str, seconds: float) -> None:
    """One log line: how the target vocabulary splits into copied, special and new tokens."""
    log.info(
        "vocabulary: %d target tokens: %d copied, %d specials, %d to initialise with %s (%s)",
        part.size,
        len(part.overlap),
        len(part.specials),
        len(part.rest),
        method_name,
        duration(seconds),
    )


def _write_outputs(
    work: Path,
    cfg: InitConfig,
    named: InitConfig,
    model: PreTrainedModel,
    target_tok: PreTrainedTokenizerBase,
    rep: InitReport,
    prov: pa.Table,
) -> None:
    """Write the config, the model directory (with its card) and the provenance into ``work``."""
    write_config(cfg, work / "config.yaml")
    # never a NaN model complete
    require_finite(model.state_dict(), f"the initialised model for {Path(cfg.output)}")
    with atomic_path(work / MODEL) as tmp:
        serving = Serving(
            query_length=cfg.query_length,
            document_length=cfg.document_length,
            pooling=read_pooling(cfg.source_model),
        )
        write_target_model(model, target_tok, tmp, serving)
        write_card(tmp, {"init": card_facts(named, rep, cfg)})
    with atomic_path(work / "provenance.parquet") as tmp:
        pq.write_table(prov, tmp)


def _require_inputs_unchanged(inputs: dict[str, str], cfg: InitConfig) -> None:
    """Everything was loaded: still the inputs the identity names (no ``--overwrite`` of one
    meanwhile)?"""
    require_unchanged(
        inputs,
        {
            "source_model": cfg.source_model,
            "target_tokenizer": cfg.target_tokenizer,
            "bridge_model": cfg.bridge_model,
            "bias_text": cfg.bias_text,
        },
    )


def card_facts(
    cfg: InitConfig, report: InitReport, resolved: InitConfig | None = None
) -> InitFacts:
    """What the model card says about an initialisation (``cfg`` with the inputs as the user named
    them, ``resolved`` with bundled names materialised to paths): names without absolute paths, the
    base model on the hub, the target language and the licence of every input
    (:mod:`sembridge_ray.provenance`)."""
    paths = resolved or cfg
    bridge = cfg.bridge_model if method(cfg.method).uses_bridge else ""
    bias_text = cfg.bias_text if cfg.bias == "frequency" else ""
    return {
        "source_model": display_name(cfg.source_model),
        "target_tokenizer": display_name(cfg.target_tokenizer),
        "bridge_model": display_name(bridge),
        "language": cfg.language or language_of(cfg.target_tokenizer, paths.target_tokenizer),
        "method": cfg.method,
        "alpha": cfg.weighting.alpha,
        "position_aware": cfg.weighting.position_aware,
        "kinds": report["kinds"],
        "support_histogram": report["support_histogram"],
        "base_model": base_model(cfg.source_model, paths.source_model),
        "vocab_size": report["target_size"],
        "query_length": cfg.query_length,
        "document_length": cfg.document_length,
        "licences": [
            *input_licences("source model", cfg.source_model, paths.source_model),
            *input_licences("target tokenizer", cfg.target_tokenizer, paths.target_tokenizer),
            *input_licences("bridge model", bridge, paths.bridge_model if bridge else ""),
            *input_licences("decoder-bias text", bias_text, bias_text),
        ],
    }


def _report(
    cfg: InitConfig,
    part: Partition,
    prov: pa.Table,
    source_tok: PreTrainedTokenizerBase,
    timings: dict[str, float],
    bridge: BridgeSide,
    counterparts: dict[int, int],
) -> InitReport:
    source_tokens = {i: t for t, i in source_tok.get_vocab().items()}
    bridge_fp, keys = bridge.fingerprint, bridge.keys
    # one literal, in the order init_report.json has always been written; the weighting options each
    # say whether and when the report carries them (embed_init.config.Read: the position keys with
    # position_aware, SemBridge+'s only when on, so the released report keeps its bytes)
    return cast(
        "InitReport",
        {
            "method": cfg.method,
            "alpha": cfg.weighting.alpha,
            "bias": cfg.bias,
            "match": list(cfg.match),
            "copy_overlap": cfg.copy_overlap,
            "exclude_special_sources": cfg.exclude_special_sources,
            **cfg.weighting.reported(cfg.method),
            **report.counts(part, prov),
            "support_histogram": report.support_histogram(prov),
            "position": report.position_stats(prov, bridge.classes["target"], counterparts),
            "timings": {k: round(v, 3) for k, v in timings.items()},
            "fingerprints": {
                "source_model": model_fingerprint(cfg.source_model),
                "bridge_model": bridge_fp,
                # <bridge>-<tokenizer>[-<precision>]
                "source_tokenizer": keys["source"].split("-")[1],
                "target_tokenizer": keys["target"].split("-")[1],
            },
            "models": {
                "source_model": cfg.source_model,
                "target_tokenizer": cfg.target_tokenizer,
                "bridge_model": cfg.bridge_model,
            },
            "samples": report.sample_rows(prov, source_tokens, cfg.samples),
        },
    )
