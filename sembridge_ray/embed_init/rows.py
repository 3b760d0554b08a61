"""The rows of the target tokens a transfer initialises (those without a source counterpart):
by the method's explicit rule, bridged (the bridge's vectors, then ``Stages.rows``' weights and
rows, then the weighting section's post-steps: ``random_blend``, ``norm_scale``,
``confidence_gate``), or decomposed (fvt). :func:`~sembridge_ray.embed_init.transfer.transfer`
calls :func:`new_rows` with its settings; the stages are in-process or Ray Data actor pools."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from sembridge_ray.embed_init import plus
from sembridge_ray.embed_init.baselines import explicit_rows, require_codable
from sembridge_ray.embed_init.combine import NewRows, weighted_rows
from sembridge_ray.embed_init.config import TransferSettings, WeightingConfig
from sembridge_ray.embed_init.crosslingual import (
    bridge_confidence,
    drop_rows,
    least_confident,
    rescale_to_sources,
)
from sembridge_ray.embed_init.methods import method
from sembridge_ray.embed_init.pipeline import (
    BridgeSide,
    RowsContext,
    Stages,
    no_new_rows,
    source_vectors,
)
from sembridge_ray.embed_init.vocab import Partition

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def new_rows(
    cfg: TransferSettings,
    part: Partition,
    matrices: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    toks: tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase],
    stages: Stages,
    bridge: BridgeSide,
    timings: dict[str, float],
) -> NewRows:
    """The rows of the target tokens left to initialise (``part.rest``): by the method's explicit
    rule, or bridged (vectors from the cache or ``stages.encode``, weights and rows from
    ``stages.rows``), or decomposed (fvt). ``matrices``: the source's (input embeddings, untied
    output embeddings, decoder bias); ``toks``: the source and target tokenizers."""
    e_in, e_out, bias = matrices
    source_tok, target_tok = toks
    w = cfg.weighting
    rest = np.asarray(part.rest, dtype=np.int64)
    if not len(rest):  # every target token is copied: nothing to bridge, nothing to encode
        log.info("every target token has a source counterpart: the model is the copied rows alone")
        return no_new_rows(e_in, e_out, bias, bridged=not method(cfg.method).rows)
    if method(cfg.method).decomposes:
        return decomposed_rows(
            rest, plus.fvt_weights(source_tok, target_tok, rest, len(e_in)), matrices
        )
    # omp without anchors: refused before any encoding
    require_codable(cfg.method, w, len(part.anchors))
    if not method(cfg.method).uses_bridge:
        rows = explicit_rows(cfg.method, len(rest), e_in, cfg.seed)
        out_rows = (
            None if e_out is None else explicit_rows(cfg.method, len(rest), e_out, cfg.seed + 1)
        )
        return NewRows(target_ids=rest, inputs=rows, outputs=out_rows)
    # the bridge's vectors (cached, else from stages.encode): every source token's, the candidate
    # sources, and the vectors of the target tokens to initialise, in `rest` order
    start, cache_dir = time.perf_counter(), Path(cfg.cache_dir)
    src_vecs, candidates = source_vectors(
        bridge.strings["source"],
        bridge.vectors("source", cache_dir, stages.encode),
        len(e_in),
        source_tok,
        cfg.exclude_special_sources,
    )
    tgt_vecs = bridge.vectors("target", cache_dir, stages.encode)
    row_of = {int(i): n for n, i in enumerate(bridge.strings["target"].column("id").to_numpy())}
    new_vecs = tgt_vecs[[row_of[int(i)] for i in rest]]
    timings["bridge_encode_s"] = time.perf_counter() - start
    # one transform of the union of the candidates and the tokens to initialise
    if w.bridge_space != "raw":
        new_vecs = _transform_space(w, part, src_vecs, candidates, new_vecs)
    # what stages.rows needs beside the new tokens' vectors; the position classes and the fvt
    # prior where the rule uses them
    decomposed = w.fvt_weight > 0 or w.adaptive_support == "fvt"
    prior = plus.fvt_weights(source_tok, target_tok, rest, len(e_in)) if decomposed else None
    classes = [
        torch.from_numpy(bridge.classes[side]) if w.position_aware else None
        for side in ("source", "target")
    ]
    ctx = RowsContext(
        method=cfg.method,
        weighting=w,
        precision=cfg.precision,
        source_vecs=src_vecs,
        candidates=candidates,
        overlap_sources=torch.tensor(part.anchors, dtype=torch.long),
        inputs=e_in,
        outputs=e_out,
        bias=bias,
        source_classes=classes[0],
        target_classes=classes[1],
        prior=prior,
        prior_ids=torch.from_numpy(rest) if prior is not None else None,
    )
    start = time.perf_counter()
    new = stages.rows(ctx, rest, new_vecs)
    timings["weights_s"] = time.perf_counter() - start
    # here, not in the actors: the random rows are the random method's, in `rest` order
    if w.random_blend > 0:
        new = _blend_random(new, e_in, e_out, cfg)
    if w.norm_scale > 0:
        new = _rescale(new, e_in, e_out, w.norm_scale)
    if w.confidence_gate > 0:
        targets = torch.from_numpy(bridge.vectors("target", cache_dir, stages.encode))
        sure = bridge_confidence(
            torch.from_numpy(new_vecs), src_vecs[candidates], targets, w.confidence
        )
        gated = least_confident(sure, w.confidence_gate)
        new = _gate(new, gated, e_in, e_out, bias, cfg.seed)
        log.info(
            "confidence gate: %d of %d bridged tokens keep a random row",
            int(gated.sum()),
            len(rest),
        )
    return new


def _transform_space(
    w: WeightingConfig,
    part: Partition,
    src_vecs: torch.Tensor,
    candidates: torch.Tensor,
    new_vecs: np.ndarray,
) -> np.ndarray:
    """``bridge_space``'s transform, fitted on the candidates and the tokens to initialise together:
    the candidates' rows of ``src_vecs`` transformed in place, the new tokens' vectors returned
    transformed."""
    fitted = plus.space_transform(
        torch.cat([src_vecs[candidates], torch.from_numpy(new_vecs)]),
        w.bridge_space,
        w.bridge_components,
        anchors=src_vecs[torch.tensor(part.anchors, dtype=torch.long)]
        if w.bridge_space == "relative"
        else None,
    )
    src_vecs[candidates] = plus.apply_transform(src_vecs[candidates], fitted)
    return plus.apply_transform(torch.from_numpy(new_vecs), fitted).numpy()


RowStep = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(bridged rows, the source matrix they mix, seed offset: 0 for the inputs, 1 for the outputs, as
the random method seeds them) -> the rows after a post-step."""


def _each_matrix(
    new: NewRows, e_in: torch.Tensor, e_out: torch.Tensor | None, step: RowStep
) -> NewRows:
    """``new`` with ``step`` applied to its inputs, and to its outputs where untied."""
    outputs = None if e_out is None or new.outputs is None else step(new.outputs, e_out, 1)
    return replace(new, inputs=step(new.inputs, e_in, 0), outputs=outputs)


def _blend_random(
    new: NewRows, e_in: torch.Tensor, e_out: torch.Tensor | None, cfg: TransferSettings
) -> NewRows:
    """``random_blend`` of the bridged rows with the random method's (inputs, and outputs where
    untied; seeded as its rows are, in ``rest`` order): ``(1 - weight) bridged + weight random`` in
    float64, in the bridged rows' dtype."""
    n, weight = len(new.target_ids), cfg.weighting.random_blend

    def blend(rows: torch.Tensor, matrix: torch.Tensor, offset: int) -> torch.Tensor:
        other = explicit_rows("random", n, matrix, cfg.seed + offset).double()
        return ((1 - weight) * rows.double() + weight * other).to(rows.dtype)

    return _each_matrix(new, e_in, e_out, blend)


def _rescale(new: NewRows, e_in: torch.Tensor, e_out: torch.Tensor | None, scale: float) -> NewRows:
    """``norm_scale``: each bridged row (inputs, and outputs where untied) at ``scale`` times the
    weighted mean norm of its sources' rows."""
    weights = new.weights
    assert weights is not None

    def rescale(rows: torch.Tensor, matrix: torch.Tensor, offset: int) -> torch.Tensor:
        return rescale_to_sources(rows, weights, matrix.norm(dim=1), scale)

    return _each_matrix(new, e_in, e_out, rescale)


def _gate(
    new: NewRows,
    gated: torch.Tensor,
    e_in: torch.Tensor,
    e_out: torch.Tensor | None,
    bias: torch.Tensor | None,
    seed: int,
) -> NewRows:
    """``confidence_gate``: the ``gated`` tokens' rows become the random method's (seeded as its
    rows are, in ``rest`` order), their bias the source's mean (as random init gives them), their
    weights none (the provenance records no source for them)."""
    n = len(new.target_ids)

    def gate(rows: torch.Tensor, matrix: torch.Tensor, offset: int) -> torch.Tensor:
        return torch.where(gated[:, None], explicit_rows("random", n, matrix, seed + offset), rows)

    return replace(
        _each_matrix(new, e_in, e_out, gate),
        weights=None if new.weights is None else drop_rows(new.weights, gated),
        bias=None
        if bias is None or new.bias is None
        else torch.where(gated, bias.double().mean().to(new.bias.dtype), new.bias),
    )


def decomposed_rows(
    rest: np.ndarray,
    weights: torch.Tensor,
    matrices: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> NewRows:
    """The fvt baseline's rows: each piece's decomposition weights composed, the mean source row
    (and bias) where nothing covers the piece (its weights row is empty)."""
    covered = (weights.crow_indices()[1:] - weights.crow_indices()[:-1]) > 0

    def rows(matrix: torch.Tensor) -> torch.Tensor:
        out = weighted_rows(weights, matrix)
        out[~covered] = matrix.double().mean(0).to(matrix.dtype)
        return out

    e_in, e_out, bias = matrices
    return NewRows(
        target_ids=rest,
        inputs=rows(e_in),
        weights=weights,
        outputs=None if e_out is None else rows(e_out),
        bias=None if bias is None else rows(bias.unsqueeze(1)).squeeze(1),
    )
