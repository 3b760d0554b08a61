"""The init job's driver logic, without Ray: partition, bridge vectors, new rows, composition, artefacts.

The two heavy stages are injected (:class:`Stages`): in this process for tests and small runs, or as Ray Data
actor pools (``sembridge_ray.distributed.init``). Both call the same pure functions, so they agree bit
for bit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sembridge_ray import catalog
from sembridge_ray.bundled import resolve
from sembridge_ray.config import write_config
from sembridge_ray.embed_init import position, report
from sembridge_ray.embed_init.baselines import explicit_rows, method_weights
from sembridge_ray.embed_init.bridge import (
    RULE_VERSION,
    cached_vectors,
    check_bridge,
    encode_strings,
    load_bridge,
    model_fingerprint,
    tokenizer_fingerprint,
    vocab_strings,
)
from sembridge_ray.embed_init.combine import (
    NewRows,
    compose,
    compose_bias,
    csr_lists,
    provenance,
    weighted_rows,
)
from sembridge_ray.embed_init.methods import method
from sembridge_ray.embed_init.transplant import target_model, write_target_model
from sembridge_ray.embed_init.vocab import Partition, partition_vocab
from sembridge_ray.errors import InputError
from sembridge_ray.identity import model_identity
from sembridge_ray.jobs.init import InitConfig, InitResult
from sembridge_ray.model_card import write_card
from sembridge_ray.outputs import atomic_path, atomic_write_json, claim_output, preflight
from sembridge_ray.placement import local_precision, pick_device
from sembridge_ray.progress import duration
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import (
    Serving,
    check_push,
    load_mlm,
    load_tokenizer,
    mlm_embeddings,
    publish,
    read_pooling,
)

log = logging.getLogger(__name__)
REPORT, MODEL = "init_report.json", "model"
_UNUSED_SOURCE = ("[unused", "madeupword", "[UNUSED")


@dataclass(frozen=True)
class RowsContext:
    """What every weights worker holds: the source bridge vectors (indexed by source id) and matrices."""

    cfg: dict[str, Any]
    source_vecs: torch.Tensor  # (|Vs rows|, D); zero rows for ids without a string
    candidates: torch.Tensor  # source ids the bridge may use, ascending
    overlap_sources: torch.Tensor  # source ids matched by a target token, copied or not (FOCUS anchors), ascending
    inputs: torch.Tensor  # E_s (|Vs rows|, d)
    outputs: torch.Tensor | None
    bias: torch.Tensor | None
    source_classes: torch.Tensor | None = None  # position class by source id (position_aware only)
    target_classes: torch.Tensor | None = None  # position class by target id (position_aware only)


def compute_rows(ctx: RowsContext, target_ids: np.ndarray, new_vecs: np.ndarray, device: str | None = None) -> NewRows:
    """Weights and composed rows for bridged target ids (the hot stage; shard it freely by rows)."""
    cfg = InitConfig.from_dict(ctx.cfg)
    classes = None
    if ctx.source_classes is not None and ctx.target_classes is not None:
        classes = (ctx.target_classes[torch.as_tensor(target_ids, dtype=torch.long)], ctx.source_classes)
    w = method_weights(
        cfg,
        torch.from_numpy(new_vecs),
        ctx.source_vecs,
        ctx.candidates,
        ctx.overlap_sources,
        device=device,
        classes=classes,
    )
    return NewRows(
        target_ids=target_ids,
        weights=w,
        inputs=weighted_rows(w, ctx.inputs),
        outputs=None if ctx.outputs is None else weighted_rows(w, ctx.outputs),
        bias=None if ctx.bias is None else weighted_rows(w, ctx.bias.unsqueeze(1)).squeeze(1),
    )


ROW_IDS, ROW_COLS, ROW_WEIGHTS, ROW_IN, ROW_OUT, ROW_BIAS = "id", "source_ids", "weights", "inputs", "outputs", "bias"


def rows_table(new: NewRows) -> pa.Table:
    """NewRows of a bridged rule as Arrow (what Ray actors send back); exact inverse: :func:`rows_from_tables`."""
    if new.weights is None:
        raise ValueError("rows_table: only bridged rules (with weights) travel as row tables")
    cols, vals = csr_lists(new.weights)
    data = {
        ROW_IDS: pa.array(new.target_ids.astype(np.int64)),
        ROW_COLS: pa.array([c.tolist() for c in cols], pa.list_(pa.int32())),
        ROW_WEIGHTS: pa.array([v.tolist() for v in vals], pa.list_(pa.float32())),
        ROW_IN: pa.array(list(new.inputs.numpy()), pa.list_(pa.from_numpy_dtype(new.inputs.numpy().dtype))),
    }
    if new.outputs is not None:
        data[ROW_OUT] = pa.array(list(new.outputs.numpy()), pa.list_(pa.from_numpy_dtype(new.outputs.numpy().dtype)))
    if new.bias is not None:
        data[ROW_BIAS] = pa.array(new.bias.numpy())
    return pa.table(data)


def rows_from_tables(tables: list[pa.Table], m: int) -> NewRows:
    """Batches of :func:`rows_table` (any order) -> one NewRows sorted by target id."""
    table = pa.concat_tables(tables).sort_by(ROW_IDS)
    sizes = np.array([len(c) for c in table.column(ROW_COLS).to_pylist()], dtype=np.int64)
    crow = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]))
    weights = torch.sparse_csr_tensor(
        crow,
        torch.from_numpy(_flat(table, ROW_COLS, np.int64)),
        torch.from_numpy(_flat(table, ROW_WEIGHTS, np.float32)),
        size=(table.num_rows, m),
        check_invariants=False,
    )
    names = table.column_names
    return NewRows(
        table.column(ROW_IDS).to_numpy(),
        _stack(table, ROW_IN),
        weights,
        _stack(table, ROW_OUT) if ROW_OUT in names else None,
        torch.from_numpy(table.column(ROW_BIAS).to_numpy()) if ROW_BIAS in names else None,
    )


def _flat(table: pa.Table, name: str, dtype: Any) -> np.ndarray:
    return np.asarray(table.column(name).combine_chunks().flatten(), dtype=dtype)


def _stack(table: pa.Table, name: str) -> torch.Tensor:
    return torch.from_numpy(np.stack(table.column(name).to_numpy(zero_copy_only=False)))


@dataclass(frozen=True)
class Stages:
    """The heavy stages: bridge encoding of (id, text) tables, and rows for (target ids, vectors)."""

    encode: Callable[[pa.Table], np.ndarray]
    rows: Callable[[RowsContext, np.ndarray, np.ndarray], NewRows]


def in_process_stages(cfg: InitConfig) -> Stages:
    holder: dict[str, Any] = {}

    def encode(table: pa.Table) -> np.ndarray:
        if "model" not in holder:
            holder["model"] = load_bridge(cfg.bridge_model, trust_remote_code=cfg.trust_remote_code)
        texts, size = table.column("text").to_pylist(), cfg.bridge_batch_size
        # Batch boundaries fixed by position, as in the Ray stage: vectors must not depend on the batching.
        return np.concatenate(
            [
                encode_strings(holder["model"], texts[i : i + size], size, cfg.bridge_model, cfg.precision)
                for i in range(0, len(texts), size)
            ]
            or [np.zeros((0, 0), np.float32)]
        )

    return Stages(encode=encode, rows=compute_rows)


def input_identities(cfg: InitConfig) -> dict[str, str]:
    """Check that every input exists (before anything is loaded or written) and identify it by content."""
    if not (cfg.source_model and cfg.target_tokenizer and cfg.output):
        raise InputError("--source-model, --target-tokenizer and --output are required")
    inputs = {
        "source_model": model_identity(cfg.source_model, "source model"),
        "target_tokenizer": model_identity(cfg.target_tokenizer, "target tokenizer"),
    }
    if method(cfg.method).uses_bridge:
        inputs["bridge_model"] = check_bridge(cfg.bridge_model)
    return inputs


def _source_vectors(
    cfg: InitConfig, source_tok: Any, rows: int, stages: Stages, key: str, strings: pa.Table
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bridge vectors by source id (zero rows where no string) and the candidate ids."""
    vecs = cached_vectors(Path(cfg.cache_dir), key, strings, stages.encode)
    ids = strings.column("id").to_numpy()
    out = torch.zeros(rows, vecs.shape[1], dtype=torch.float32)
    out[torch.from_numpy(ids.astype(np.int64))] = torch.from_numpy(vecs)
    keep = [
        int(i)
        for i, t in zip(ids, source_tok.convert_ids_to_tokens(ids.tolist()), strict=True)
        if not cfg.exclude_special_sources
        or (int(i) not in set(source_tok.all_special_ids) and not str(t).startswith(_UNUSED_SOURCE))
    ]
    return out, torch.tensor(sorted(keep), dtype=torch.long)


@dataclass(frozen=True)
class _Bridge:
    """The bridge side of one init: strings and cache keys per vocabulary, position classes by id."""

    fingerprint: str
    strings: dict[str, pa.Table]
    keys: dict[str, str]
    classes: dict[str, np.ndarray]


def _bridge_side(cfg: InitConfig, source_tok: Any, target_tok: Any, sizes: dict[str, int]) -> _Bridge:
    """Bridge strings under the configured rule, and their cache keys: a key names the strings, so a vocabulary
    whose marked strings equal its released ones (a WordPiece one) keeps the released key and cache."""
    toks = {"source": source_tok, "target": target_tok}
    classes = {side: position.tokenizer_classes(tok, sizes[side]) for side, tok in toks.items()}
    if not method(cfg.method).uses_bridge:
        return _Bridge("", {}, {side: f"-{tokenizer_fingerprint(tok)}" for side, tok in toks.items()}, classes)
    fp = model_fingerprint(cfg.bridge_model)
    strings, keys = {}, {}
    for side, tok in toks.items():
        strings[side] = released = vocab_strings(tok)
        rule = RULE_VERSION
        if cfg.position_aware and cfg.position_marker:
            strings[side] = vocab_strings(tok, classes[side], cfg.position_marker)
            rule = RULE_VERSION if strings[side].equals(released) else position.marked_rule(cfg.position_marker)
        # bf16 vectors are other vectors: their own cache entry (fp32 keeps the keys it always had)
        keys[side] = f"{fp}-{tokenizer_fingerprint(tok, rule)}" + (
            "" if cfg.precision == "fp32" else f"-{cfg.precision}"
        )
    return _Bridge(fp, strings, keys, classes)


def _new_rows(
    cfg: InitConfig,
    part: Partition,
    ctx_parts: dict[str, Any],
    stages: Stages,
    bridge: _Bridge,
    timings: dict[str, float],
) -> NewRows:
    e_in, e_out, bias = ctx_parts["inputs"], ctx_parts["outputs"], ctx_parts["bias"]
    rest = np.asarray(part.rest, dtype=np.int64)
    if not len(rest):  # every target token is copied: nothing to bridge, nothing to encode
        log.info("every target token has a source counterpart: the model is the copied rows alone")
        return _no_new_rows(e_in, e_out, bias, bridged=method(cfg.method).uses_bridge)
    if not method(cfg.method).uses_bridge:
        rows = explicit_rows(cfg.method, len(rest), e_in, cfg.seed)
        out_rows = None if e_out is None else explicit_rows(cfg.method, len(rest), e_out, cfg.seed + 1)
        return NewRows(rest, rows, None, out_rows, None)
    start = time.perf_counter()
    src_vecs, candidates = _source_vectors(
        cfg, ctx_parts["source_tok"], len(e_in), stages, bridge.keys["source"], bridge.strings["source"]
    )
    tgt_strings = bridge.strings["target"]
    tgt_vecs = cached_vectors(Path(cfg.cache_dir), bridge.keys["target"], tgt_strings, stages.encode)
    row_of = {int(i): n for n, i in enumerate(tgt_strings.column("id").to_numpy())}
    new_vecs = tgt_vecs[[row_of[int(i)] for i in rest]] if len(rest) else np.zeros((0, tgt_vecs.shape[1]), np.float32)
    timings["bridge_encode_s"] = time.perf_counter() - start
    overlap_sources = torch.tensor(part.anchors, dtype=torch.long)
    classes = [torch.from_numpy(bridge.classes[side]) if cfg.position_aware else None for side in ("source", "target")]
    ctx = RowsContext(cfg.to_dict(), src_vecs, candidates, overlap_sources, e_in, e_out, bias, *classes)
    start = time.perf_counter()
    new = stages.rows(ctx, rest, new_vecs)
    timings["weights_s"] = time.perf_counter() - start
    return new


def _no_new_rows(e_in: torch.Tensor, e_out: torch.Tensor | None, bias: torch.Tensor | None, bridged: bool) -> NewRows:
    """The NewRows of an init with no target token left to initialise (a target vocabulary inside the source's)."""
    empty = torch.zeros((0, *e_in.shape[1:]), dtype=e_in.dtype)
    weights = None
    if bridged:
        weights = torch.sparse_csr_tensor(
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0, dtype=torch.float32),
            size=(0, len(e_in)),
        )
    out = None if e_out is None else torch.zeros((0, *e_out.shape[1:]), dtype=e_out.dtype)
    return NewRows(np.zeros(0, np.int64), empty, weights, out, None if bias is None else bias[:0].clone())


def initialise(cfg: InitConfig, stages: Stages | None = None, inputs: dict[str, str] | None = None) -> InitResult:
    """Run the whole initialisation into ``cfg.output`` (model dir, provenance, report, config, _SUCCESS), then
    push the model when ``push_to_hub`` is set (also a finished output's: a rerun publishes without recomputing).

    Inputs are checked and loaded before the output is claimed (:func:`~sembridge_ray.outputs.claim_output`):
    bad input leaves an existing output untouched. ``inputs`` (identities) may come from a caller that planned
    them (``jobs.reproduce``).
    """
    if cfg.push_to_hub:
        check_push(cfg.push_to_hub)  # before any work: a push that cannot happen fails in a second
    result = _initialise(cfg, stages, inputs)
    if not cfg.push_to_hub:
        return result
    return replace(result, pushed=publish(Path(result.output), MODEL, cfg.push_to_hub))


def _initialise(cfg: InitConfig, stages: Stages | None, inputs: dict[str, str] | None) -> InitResult:
    named = cfg  # as the user named the inputs (bundled names, hub ids): what the report and the card show
    cfg = replace(
        cfg,
        source_model=resolve(cfg.source_model),
        target_tokenizer=resolve(cfg.target_tokenizer),
        bridge_model=resolve(cfg.bridge_model),
    )  # bundled names: paths for the actors
    if cfg.precision == "auto":  # in this process (run_init resolves it for the actors before building them)
        cfg = replace(cfg, precision=local_precision(cfg.precision, use_gpu=pick_device() == "cuda"))
    stages = stages or in_process_stages(cfg)
    identity = cfg.identity("init", inputs or input_identities(cfg))
    out = Path(cfg.output)
    if preflight(out, identity, cfg.overwrite):
        return InitResult.from_report(str(out), json.loads((out / REPORT).read_text(encoding="utf-8")), skipped=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    model, source_tok = load_mlm(cfg.source_model, cfg.trust_remote_code)
    target_tok = load_tokenizer(cfg.target_tokenizer, cfg.trust_remote_code)
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:  # another run finished it meanwhile
            return InitResult.from_report(
                str(out), json.loads((out / REPORT).read_text(encoding="utf-8")), skipped=True
            )
        part = partition_vocab(source_tok, target_tok, cfg.match, copy_overlap=cfg.copy_overlap)
        timings["load_and_partition_s"] = time.perf_counter() - start
        log.info(
            "vocabulary: %d target tokens: %d copied, %d specials, %d to initialise with %s (%s)",
            part.size,
            len(part.overlap),
            len(part.specials),
            len(part.rest),
            cfg.method,
            duration(timings["load_and_partition_s"]),
        )
        e_in, e_out, bias = (t.detach().clone() if t is not None else None for t in mlm_embeddings(model))
        assert e_in is not None  # a masked-LM always has input embeddings
        bridge = _bridge_side(cfg, source_tok, target_tok, {"source": len(e_in), "target": part.size})
        parts = {"inputs": e_in, "outputs": e_out, "bias": bias, "source_tok": source_tok}
        new = _new_rows(cfg, part, parts, stages, bridge, timings)

        start = time.perf_counter()
        inputs_rows = compose(part, e_in, new.inputs, new.target_ids, e_in.mean(0))
        outputs = None
        if e_out is not None:
            assert new.outputs is not None  # bridged beside the inputs whenever the source has an output matrix
            outputs = compose(part, e_out, new.outputs, new.target_ids, e_out.mean(0))
        new_bias = None if bias is None else compose_bias(part, new, bias, cfg.bias)
        model = target_model(model, target_tok, part.size, inputs_rows, outputs, new_bias)
        tokens = {i: t for t, i in target_tok.get_vocab().items()}
        prov = provenance(part, new, tokens)
        counterparts = position.exact_counterparts(source_tok, target_tok, part.rest)
        rep = _report(named, part, prov, source_tok, timings, bridge, counterparts)
        work = claim.path  # the output, or its staging directory under --overwrite
        write_config(cfg, work / "config.yaml")
        require_finite(model.state_dict(), f"the initialised model for {out}")  # never a NaN model complete
        with atomic_path(work / MODEL) as tmp:
            serving = Serving(
                query_length=cfg.query_length,
                document_length=cfg.document_length,
                pooling=read_pooling(cfg.source_model),
            )
            write_target_model(model, target_tok, tmp, serving)
            write_card(tmp, {"init": card_facts(named, rep)})
        with atomic_path(work / "provenance.parquet") as tmp:
            pq.write_table(prov, tmp)
        timings["compose_and_write_s"] = time.perf_counter() - start
        rep["timings"] = {k: round(v, 3) for k, v in timings.items()}
        atomic_write_json(work / REPORT, rep)
        claim.finish()
        log.info(
            "wrote %s: model, provenance of %d tokens, report (%s)",
            out,
            prov.num_rows,
            duration(timings["compose_and_write_s"]),
        )
    return InitResult.from_report(str(out), rep)


def card_facts(cfg: InitConfig, report: dict[str, Any]) -> dict[str, Any]:
    """What the model card says about an initialisation (``cfg`` with the inputs as the user named them)."""
    return {
        "source_model": cfg.source_model,
        "target_tokenizer": cfg.target_tokenizer,
        "bridge_model": cfg.bridge_model if method(cfg.method).uses_bridge else "",
        "language": cfg.language or catalog.language_of(cfg.target_tokenizer),
        "method": cfg.method,
        "alpha": cfg.alpha,
        "position_aware": cfg.position_aware,
        "kinds": report["kinds"],
        "support_histogram": report["support_histogram"],
    }


def _report(
    cfg: InitConfig,
    part: Partition,
    prov: pa.Table,
    source_tok: Any,
    timings: dict[str, float],
    bridge: _Bridge,
    counterparts: dict[int, int],
) -> dict[str, Any]:
    source_tokens = {i: t for t, i in source_tok.get_vocab().items()}
    bridge_fp, keys = bridge.fingerprint, bridge.keys
    rule: dict[str, Any] = {"position_aware": cfg.position_aware}
    if cfg.position_aware:
        rule |= {"position_marker": cfg.position_marker, "position_penalty": cfg.position_penalty}
    return {
        "method": cfg.method,
        "alpha": cfg.alpha,
        "bias": cfg.bias,
        "match": list(cfg.match),
        "copy_overlap": cfg.copy_overlap,
        "exclude_special_sources": cfg.exclude_special_sources,
        **rule,
        **report.counts(part, prov),
        "support_histogram": report.support_histogram(prov),
        "position": report.position_stats(prov, bridge.classes["target"], counterparts),
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "fingerprints": {
            "source_model": model_fingerprint(cfg.source_model),
            "bridge_model": bridge_fp,
            "source_tokenizer": keys["source"].split("-")[1],  # <bridge>-<tokenizer>[-<precision>]
            "target_tokenizer": keys["target"].split("-")[1],
        },
        "models": {
            "source_model": cfg.source_model,
            "target_tokenizer": cfg.target_tokenizer,
            "bridge_model": cfg.bridge_model,
        },
        "samples": report.sample_rows(prov, source_tokens, cfg.samples, cfg.seed),
    }
