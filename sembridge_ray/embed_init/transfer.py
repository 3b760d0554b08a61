"""Transfer a source model's embeddings to a target vocabulary: the maths' one entry point for an
init. A job checks and identifies the inputs (:func:`input_identities`) and loads them
(:func:`load_inputs`) before it claims its output; :func:`transfer` then partitions the target
vocabulary against the source's (copied, special and new tokens), computes the new tokens' rows by
the method (through the injected :class:`~sembridge_ray.embed_init.pipeline.Stages`), sets their
decoder bias from the bias text under ``bias: frequency``, and recomposes the source model with the
target vocabulary's rows; :func:`require_unchanged` checks, before the job marks its output
complete, that the inputs are still those identified.

Its settings are its own (:class:`~sembridge_ray.embed_init.config.TransferSettings`); the job's
config, its output claim, the writing, the report, the card and the push are the init recipe's
(``sembridge_ray.recipes.init.run``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sembridge_ray.embed_init import position
from sembridge_ray.embed_init.bias_text import bias_counts, require_varying_counts
from sembridge_ray.embed_init.bridge import bridge_dimension, check_bridge
from sembridge_ray.embed_init.combine import provenance
from sembridge_ray.embed_init.config import TransferSettings
from sembridge_ray.embed_init.methods import method
from sembridge_ray.embed_init.pipeline import BridgeSide, Stages, bridge_side
from sembridge_ray.embed_init.rows import new_rows
from sembridge_ray.embed_init.transplant import composed_model, frequency_bias, source_matrices
from sembridge_ray.embed_init.vocab import Partition, partition_vocab
from sembridge_ray.runtime import identity
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.progress import duration
from sembridge_ray.sparse.model import load_mlm, load_tokenizer
from sembridge_ray.target_tokenizers import require_vocabulary

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What a transfer reads, loaded."""

    model: PreTrainedModel
    """The source masked-LM."""
    source_tok: PreTrainedTokenizerBase
    target_tok: PreTrainedTokenizerBase
    counts: dict[int, int] | None
    """The bias text's token counts (``bias: frequency`` only)."""


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """A transfer done: its model, where each target row came from, and what the report reads."""

    model: PreTrainedModel
    """The source model with the target vocabulary's rows (and decoder bias)."""
    tokenizer: PreTrainedTokenizerBase
    """The model's tokenizer now: the target one."""
    partition: Partition
    """The target vocabulary split into copied, special and new tokens."""
    provenance: pa.Table
    """One row per target id: its kind, source ids and weights (``combine.provenance``)."""
    bridge: BridgeSide
    counterparts: dict[int, int]
    """Target id -> source id of the new tokens that have an exact source counterpart."""
    source_tokens: dict[int, str]
    """Source id -> token (the report's samples name the sources)."""


def input_identities(cfg: TransferSettings) -> dict[str, str]:
    """The inputs' identities, each checked first: the source model and the target tokenizer, the
    bridge model where the method uses one (a model, with more dimensions than ``bridge_space:
    abtt`` removes) and the bias text under ``bias: frequency`` (a file)."""
    inputs = {"source_model": identity.model_identity(cfg.source_model, "source model")}
    inputs["target_tokenizer"] = identity.model_identity(cfg.target_tokenizer, "target tokenizer")
    if method(cfg.method).uses_bridge:
        inputs["bridge_model"] = check_bridge(cfg.bridge_model)
        w = cfg.weighting
        dim = bridge_dimension(cfg.bridge_model) if w.bridge_space == "abtt" else None
        if dim is not None and w.bridge_components >= dim:
            raise InputError(
                f"bridge_components={w.bridge_components}: must be below the bridge's dimension {dim} (abtt removes "
                "that many principal directions; all of them leave no bridge)"
            )
    if cfg.bias == "frequency":
        text = Path(cfg.bias_text)
        if not text.is_file():
            raise InputError(
                f"--bias-text {cfg.bias_text}: no such file (a .txt or Parquet file of target text)"
            )
        inputs["bias_text"] = identity.path_identity(text)
    return inputs


def load_inputs(cfg: TransferSettings) -> Inputs:
    """The source model and tokenizer, the target tokenizer (refused without a vocabulary) and the
    bias text's token counts."""
    model, source_tok = load_mlm(cfg.source_model, cfg.trust_remote_code)
    target_tok = load_tokenizer(cfg.target_tokenizer, cfg.trust_remote_code)
    require_vocabulary(target_tok, cfg.target_tokenizer)
    counts = bias_counts(target_tok, cfg.bias_text) if cfg.bias == "frequency" else None
    return Inputs(model=model, source_tok=source_tok, target_tok=target_tok, counts=counts)


def require_unchanged(cfg: TransferSettings, identities: dict[str, str]) -> None:
    """Everything was read: still the inputs ``identities`` name (no ``--overwrite`` of one
    meanwhile)?"""
    names = ("source_model", "target_tokenizer", "bridge_model", "bias_text")
    identity.require_unchanged(identities, {name: getattr(cfg, name) for name in names})


def transfer(
    cfg: TransferSettings, inputs: Inputs, stages: Stages, timings: dict[str, float]
) -> Transfer:
    """The source model moved to the target vocabulary: copied rows for the tokens the partition
    matches, new rows for the rest (``rows.new_rows``), composed into the source's matrices.
    ``timings``: the caller's, with its loading's seconds as ``load_and_partition_s``; the
    partitioning is added to them, the new rows' steps recorded, and the composing as
    ``compose_and_write_s`` (the caller adds its writing)."""
    source_tok, target_tok, counts = inputs.source_tok, inputs.target_tok, inputs.counts
    start = time.perf_counter()
    part = partition_vocab(source_tok, target_tok, cfg.match, cfg.copy_overlap)
    timings["load_and_partition_s"] += time.perf_counter() - start
    if counts is not None:
        require_varying_counts(counts, part.rest, cfg.bias_text)
    log.info(
        "vocabulary: %d target tokens: %d copied, %d specials, %d to initialise with %s (%s)",
        part.size,
        len(part.overlap),
        len(part.specials),
        len(part.rest),
        cfg.method,
        duration(timings["load_and_partition_s"]),
    )
    matrices = source_matrices(inputs.model)
    toks = {"source": source_tok, "target": target_tok}
    sizes = {"source": len(matrices[0]), "target": part.size}
    bridge = bridge_side(
        cfg.method, cfg.weighting, cfg.precision, cfg.bridge_model, toks, sizes, cfg.neutral_symbols
    )
    new = new_rows(cfg, part, matrices, (source_tok, target_tok), stages, bridge, timings)
    if counts is not None and matrices[2] is not None:
        new = frequency_bias(new, counts, matrices[2], source_tok)
    start = time.perf_counter()
    done = Transfer(
        model=composed_model(inputs.model, target_tok, part, new, matrices, cfg.bias),
        tokenizer=target_tok,
        partition=part,
        provenance=provenance(part, new, {i: t for t, i in target_tok.get_vocab().items()}),
        bridge=bridge,
        counterparts=position.exact_counterparts(source_tok, target_tok, part.rest),
        source_tokens={i: t for t, i in source_tok.get_vocab().items()},
    )
    timings["compose_and_write_s"] = time.perf_counter() - start
    return done
