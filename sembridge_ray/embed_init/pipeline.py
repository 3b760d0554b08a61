"""The transfer's reusable steps, without Ray and without the job's config: the bridge side
(strings, cache keys, position classes), the source's bridge vectors, and the hot stage (weights and
composed rows of bridged tokens).

The two heavy stages are injected (:class:`Stages`): in this process for tests and scripts
(:func:`in_process_stages`), or as an executor's pools (:func:`pool_stages`: Ray Data actor pools
in ``sembridge_ray.recipes.init.run``). Both call the same pure functions, so they agree bit for
bit. The transfer that runs them is ``sembridge_ray.embed_init.transfer``; the job around it
(inputs, output claim, writing, card, push) is ``sembridge_ray.recipes.init.run``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sembridge_ray.data.schema import ID
from sembridge_ray.embed_init import plus, position
from sembridge_ray.embed_init.baselines import method_weights, require_codable
from sembridge_ray.embed_init.bridge import (
    RULE_VERSION,
    VECTOR,
    BridgeEncodeUDF,
    cached_vectors,
    encode_strings,
    load_bridge,
    model_fingerprint,
    tokenizer_fingerprint,
    vocab_strings,
)
from sembridge_ray.embed_init.combine import NewRows, csr_lists, weighted_rows
from sembridge_ray.embed_init.config import MethodName, WeightingConfig
from sembridge_ray.embed_init.methods import method
from sembridge_ray.runtime.executor import Executor, Pool, use_threads
from sembridge_ray.runtime.identity import InputChanged
from sembridge_ray.runtime.placement import Precision, ResourceConfig, pick_device
from sembridge_ray.runtime.progress import Progress

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedTokenizerBase

_UNUSED_SOURCE = ("[unused", "madeupword", "[UNUSED")


log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RowsContext:
    """What every weights worker holds: the method, the weighting section as it reads it
    (``InitConfig.rule``), the source bridge vectors (indexed by source id) and matrices."""

    method: MethodName
    weighting: WeightingConfig
    precision: Precision = "fp32"
    """The run's resolved precision: the candidate screening's (``baselines.screen_dtype_for``)."""
    source_vecs: torch.Tensor
    """(|Vs rows|, D); zero rows for ids without a string."""
    candidates: torch.Tensor
    """Source ids the bridge may use, ascending."""
    overlap_sources: torch.Tensor
    """Source ids matched by a target token, copied or not (FOCUS anchors), ascending."""
    inputs: torch.Tensor
    """E_s (|Vs rows|, d)."""
    outputs: torch.Tensor | None
    bias: torch.Tensor | None
    source_classes: torch.Tensor | None = None
    """Position class by source id (position_aware only)."""
    target_classes: torch.Tensor | None = None
    """Position class by target id (position_aware only)."""
    prior: torch.Tensor | None = None
    """With ``fvt_weight`` > 0 or ``adaptive_support: fvt``: CSR (len(prior_ids), |Vs rows|)
    decomposition weights (``embed_init.plus``)."""
    prior_ids: torch.Tensor | None = None
    """The target ids of ``prior``'s rows, ascending."""

    def __post_init__(self) -> None:
        # built in the driver before the weights stage: a method coding over the anchors (omp) that
        # cannot run here fails in one line, not in every actor
        require_codable(self.method, self.weighting, len(self.overlap_sources))


def compute_rows(
    ctx: RowsContext, target_ids: np.ndarray, new_vecs: np.ndarray, device: str | None = None
) -> NewRows:
    """Weights and composed rows for bridged target ids (the hot stage; shard it freely by rows)."""
    ids = torch.as_tensor(target_ids, dtype=torch.long)
    classes = None
    if ctx.source_classes is not None and ctx.target_classes is not None:
        classes = (ctx.target_classes[ids], ctx.source_classes)
    prior = None
    if ctx.prior is not None and ctx.prior_ids is not None:
        prior = plus.select_rows(ctx.prior, torch.searchsorted(ctx.prior_ids, ids))
    wc = ctx.weighting
    w = method_weights(
        ctx.method,
        ctx.weighting,
        torch.from_numpy(new_vecs),
        ctx.source_vecs,
        ctx.candidates,
        ctx.overlap_sources,
        device=device,
        classes=classes,
        support=plus.support_sizes(prior, len(target_ids), wc.adaptive_support, wc.support_size),
        precision=ctx.precision,
    )
    if prior is not None and wc.fvt_weight > 0:
        w = plus.blend(w, prior, wc.fvt_weight)
    if wc.lsq_ridge > 0:
        w = plus.least_squares(w, torch.from_numpy(new_vecs), ctx.source_vecs, wc.lsq_ridge)
    return NewRows(
        target_ids=target_ids,
        weights=w,
        inputs=weighted_rows(w, ctx.inputs),
        outputs=None if ctx.outputs is None else weighted_rows(w, ctx.outputs),
        bias=None if ctx.bias is None else weighted_rows(w, ctx.bias.unsqueeze(1)).squeeze(1),
    )


ROW_COLS, ROW_WEIGHTS = "source_ids", "weights"
ROW_IN, ROW_OUT, ROW_BIAS = "inputs", "outputs", "bias"


def rows_table(new: NewRows) -> pa.Table:
    """NewRows of a bridged rule as Arrow (what Ray actors send back); exact inverse:
    :func:`rows_from_tables`."""
    if new.weights is None:
        raise ValueError("rows_table: only bridged rules (with weights) travel as row tables")
    cols, vals = csr_lists(new.weights)
    data = {
        ID: pa.array(new.target_ids.astype(np.int64)),
        ROW_COLS: pa.array([c.tolist() for c in cols], pa.list_(pa.int32())),
        ROW_WEIGHTS: pa.array([v.tolist() for v in vals], pa.list_(pa.float32())),
    }
    for name, rows in ((ROW_IN, new.inputs), (ROW_OUT, new.outputs)):
        if rows is not None:
            array = rows.numpy()
            data[name] = pa.array(list(array), pa.list_(pa.from_numpy_dtype(array.dtype)))
    if new.bias is not None:
        data[ROW_BIAS] = pa.array(new.bias.numpy())
    return pa.table(data)


def rows_from_tables(tables: list[pa.Table], m: int) -> NewRows:
    """Batches of :func:`rows_table` (any order) -> one NewRows sorted by target id."""
    table = pa.concat_tables(tables).sort_by(ID)
    sizes = pc.list_value_length(table.column(ROW_COLS)).to_numpy().astype(np.int64)
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
        target_ids=table.column(ID).to_numpy(),
        inputs=_stack(table, ROW_IN),
        weights=weights,
        outputs=_stack(table, ROW_OUT) if ROW_OUT in names else None,
        bias=torch.from_numpy(table.column(ROW_BIAS).to_numpy()) if ROW_BIAS in names else None,
    )


def _flat(table: pa.Table, name: str, dtype: npt.DTypeLike) -> np.ndarray:
    return np.asarray(table.column(name).combine_chunks().flatten(), dtype=dtype)


def _stack(table: pa.Table, name: str) -> torch.Tensor:
    return torch.from_numpy(np.stack(table.column(name).to_numpy(zero_copy_only=False)))


@dataclass(frozen=True)
class Stages:
    """The heavy stages: bridge encoding of (id, text) tables, and rows for (target ids,
    vectors)."""

    encode: Callable[[pa.Table], np.ndarray]
    rows: Callable[[RowsContext, np.ndarray, np.ndarray], NewRows]


def in_process_stages(
    bridge_model: str, batch_size: int, precision: Precision, trust_remote_code: bool
) -> Stages:
    """Both stages in this process; the bridge model is loaded on first use (a method without it
    never loads it)."""

    @functools.cache
    def model() -> SentenceTransformer:
        return load_bridge(bridge_model, trust_remote_code=trust_remote_code)

    def encode(table: pa.Table) -> np.ndarray:
        texts = table.column("text").to_pylist()
        # Batch boundaries fixed by position, as in the Ray stage: vectors must not depend on the
        # batching.
        batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
        vecs = [encode_strings(model(), b, batch_size, bridge_model, precision) for b in batches]
        return np.concatenate(vecs or [np.zeros((0, 0), np.float32)])

    return Stages(encode=encode, rows=compute_rows)


def pool_stages(
    executor: Executor,
    res: ResourceConfig,
    bridge: Mapping[str, object],
    bridge_batch_size: int,
    rows_batch_size: int,
) -> Stages:
    """Both stages as pools of ``executor`` sized by ``res`` (one GPU per worker when there are
    GPUs): bridge encoding (:class:`~sembridge_ray.embed_init.bridge.BridgeEncodeUDF` built from
    ``bridge``) and the weights (:class:`InitRowsUDF`, the one :class:`RowsContext` shared). Blocks
    are cut by position, one per encoder batch or batch of rows, so that a string's vector and a
    row's cosines come from the same batches and GEMM shapes however many workers there are: the
    weights are the same bit for bit on one node or many, in a worker or here. The executor is asked
    for its workers on first use, so bad input fails before any cluster starts."""

    def encode(table: pa.Table) -> np.ndarray:
        plan = executor.placement(res)
        size = bridge_batch_size
        blocks = [table.slice(i, size) for i in range(0, table.num_rows, size)]
        progress = Progress(log, "bridge encoding", table.num_rows, "strings")
        pool = Pool(udf=BridgeEncodeUDF, kwargs=bridge, plan=plan, threads=res.threads_per_worker)
        result = pa.concat_tables(executor.map_blocks(pool, blocks, table.num_rows, progress))
        # pools do not keep row order
        rows = pc.index_in(table.column(ID), value_set=result.column(ID)).to_numpy()
        vectors = result.column(VECTOR).to_numpy(zero_copy_only=False)[rows]
        return np.stack(vectors).astype(np.float32)

    def rows(ctx: RowsContext, target_ids: np.ndarray, new_vecs: np.ndarray) -> NewRows:
        plan = executor.placement(res)
        ids = pa.array(target_ids.astype(np.int64))
        table = pa.table({ID: ids, VECTOR: pa.array(list(new_vecs), pa.list_(pa.float32()))})
        size = rows_batch_size
        blocks = [table.slice(i, size) for i in range(0, max(1, table.num_rows), size)]
        progress = Progress(log, "weights", table.num_rows, "rows")
        threads = res.threads_per_worker
        kwargs, shared = {"threads": threads}, {"context": ctx}
        pool = Pool(udf=InitRowsUDF, kwargs=kwargs, plan=plan, threads=threads, shared=shared)
        tables = executor.map_blocks(pool, blocks, table.num_rows, progress)
        return rows_from_tables(tables, len(ctx.inputs))

    return Stages(encode=encode, rows=rows)


def source_vectors(
    strings: pa.Table,
    vecs: np.ndarray,
    rows: int,
    source_tok: PreTrainedTokenizerBase,
    exclude_special_sources: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bridge vectors ``vecs`` of the source ``strings`` (id, text) by source id (zero rows where no
    string), and the candidate ids (without specials and ``[unused*]`` rows when
    ``exclude_special_sources``)."""
    ids = strings.column("id").to_numpy()
    out = torch.zeros(rows, vecs.shape[1], dtype=torch.float32)
    out[torch.from_numpy(ids.astype(np.int64))] = torch.from_numpy(vecs)
    keep = [
        int(i)
        for i, t in zip(ids, source_tok.convert_ids_to_tokens(ids.tolist()), strict=True)
        if not exclude_special_sources
        or (int(i) not in set(source_tok.all_special_ids) and not str(t).startswith(_UNUSED_SOURCE))
    ]
    return out, torch.tensor(sorted(keep), dtype=torch.long)


@dataclass(frozen=True, kw_only=True)
class BridgeSide:
    """The bridge side of one init: strings and cache keys per vocabulary, position classes by
    id."""

    fingerprint: str
    strings: dict[str, pa.Table]
    keys: dict[str, str]
    classes: dict[str, np.ndarray]
    model: str = ""
    """The bridge model the keys' fingerprint is of."""

    def vectors(
        self, side: str, cache_dir: Path, encode: Callable[[pa.Table], np.ndarray]
    ) -> np.ndarray:
        """(n, D) bridge vectors of ``side``'s strings, from the cache or encoded into it; a bridge
        model that changed while it was encoding (its fingerprint is the cache key's) fails before
        any entry is published."""

        def pinned(table: pa.Table) -> np.ndarray:
            vecs = encode(table)
            if self.model and (now := model_fingerprint(self.model)) != self.fingerprint:
                raise InputChanged(
                    f"bridge model {self.model} changed while its vectors were encoded (fingerprint {self.fingerprint}"
                    f" -> {now}); nothing is cached under the old one: run it again"
                )
            return vecs

        return cached_vectors(cache_dir, self.keys[side], self.strings[side], pinned)


def bridge_side(
    name: str,
    weighting: WeightingConfig,
    precision: str,
    bridge_model: str,
    toks: dict[str, PreTrainedTokenizerBase],
    sizes: dict[str, int],
    neutral_symbols: bool = True,
) -> BridgeSide:
    """Bridge strings of the ``source`` and ``target`` tokenizers under method ``name``'s rule (the
    bridge vectors' ``precision``: the run's resolved one), and their cache keys: a key names the
    strings, so a vocabulary whose marked strings equal its released ones (a WordPiece one) keeps
    the released key and cache. ``neutral_symbols``: the position classes' rule
    (``position.position_class``)."""
    classes = {
        side: position.tokenizer_classes(tok, sizes[side], neutral_symbols)
        for side, tok in toks.items()
    }
    if not method(name).uses_bridge:
        keys = {side: f"-{tokenizer_fingerprint(tok)}" for side, tok in toks.items()}
        return BridgeSide(fingerprint="", strings={}, keys=keys, classes=classes)
    fp = model_fingerprint(bridge_model)
    strings, keys = {}, {}
    marker = weighting.position_marker if weighting.position_aware else ""
    # bf16 vectors are other vectors: their own cache entry (fp32 keeps the keys it always had)
    suffix = "" if precision == "fp32" else f"-{precision}"
    for side, tok in toks.items():
        strings[side] = released = vocab_strings(tok)
        rule = RULE_VERSION
        if marker:
            strings[side] = vocab_strings(tok, classes[side], marker)
            rule = RULE_VERSION if strings[side].equals(released) else position.marked_rule(marker)
        keys[side] = f"{fp}-{tokenizer_fingerprint(tok, rule)}{suffix}"
    return BridgeSide(
        fingerprint=fp, strings=strings, keys=keys, classes=classes, model=bridge_model
    )


def no_new_rows(
    e_in: torch.Tensor, e_out: torch.Tensor | None, bias: torch.Tensor | None, bridged: bool
) -> NewRows:
    """The NewRows of an init with no target token left to initialise (a target vocabulary inside
    the source's)."""
    # no rows: crow [0], no columns or values
    weights = torch.zeros((0, len(e_in)), dtype=torch.float32).to_sparse_csr() if bridged else None
    return NewRows(
        target_ids=np.zeros(0, np.int64),
        inputs=e_in[:0].clone(),
        weights=weights,
        outputs=None if e_out is None else e_out[:0].clone(),
        bias=None if bias is None else bias[:0].clone(),
    )


class InitRowsUDF:
    """A pool's worker: holds the source bridge matrix and E_s (from the object store, put once);
    computes the weights and composed rows of a batch of bridged target tokens."""

    def __init__(self, context: RowsContext, threads: int = 0, device: str = "") -> None:
        """``context``: the driver's one :class:`RowsContext` (a pool's shared object: put in the
        object store once and read by every actor)."""
        use_threads(threads)
        self.ctx, self.device = context, device or pick_device()

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column(ID).to_numpy()
        vecs = np.stack(batch.column(VECTOR).to_numpy(zero_copy_only=False)).astype(np.float32)
        return rows_table(compute_rows(self.ctx, ids, vecs, device=self.device))
