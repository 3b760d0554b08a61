"""Encoding texts into sparse rows, and sparse rows <-> Arrow.

:func:`encode_texts` is what the Ray Data actors run (``SparseEncodeUDF``): texts sorted by length
inside each call (little padding), the vocabulary projection over the unpadded tokens only, log1p on
the (B, V) maxima rather than on every token's logits, and the non-zeros extracted on the device
(only they are copied back). Rows come back in input order; in fp32 (the default) they equal
sentence-transformers' ``encode`` on the same model. ``precision="bf16"`` autocasts the matmuls, on
any device, only when the caller asks: a CPU's features never decide it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from sembridge_ray.data.schema import ID, INDICES, SPARSE_SCHEMA, VALUES
from sembridge_ray.sparse.pooling import POOL_BUDGET_BYTES, Head

if TYPE_CHECKING:
    from sentence_transformers import SparseEncoder
    from transformers import PreTrainedModel


def sparse_rows(
    emb: torch.Tensor, max_active_dims: int | None = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """emb (B, V), dense or sparse -> per row: indices (int32, ascending) and values (float32, > 0).

    ``max_active_dims`` keeps each row's that many largest values (ties broken by lower index): the
    ``--doc-max-active-dims`` pruning.
    """
    dense = (emb.to_dense() if emb.is_sparse else emb).detach().float().cpu()
    # row by row, not device_rows: sorting only a row's non-zeros is 8x faster on a CPU when
    # pruning (256 x 30,522, 150 non-zeros a row, max_active_dims=64: 14 ms against 122 ms)
    indices, values = [], []
    for row in dense:
        nz = torch.nonzero(row > 0).squeeze(1)
        vals = row[nz]
        if max_active_dims is not None and nz.numel() > max_active_dims:
            # stable sort of -value keeps the lower index first among equal values
            keep = torch.sort(torch.argsort(-vals, stable=True)[:max_active_dims]).values
            nz, vals = nz[keep], vals[keep]
        indices.append(nz.numpy().astype(np.int32))
        values.append(vals.numpy().astype(np.float32))
    return indices, values


Rows = tuple[list[np.ndarray], list[np.ndarray]]
ROLE_PROMPTS = {"query": ("query",), "document": ("document", "passage", "corpus"), None: ()}
"""Prompt names ``SparseEncoder.encode_query``/``encode_document`` would use: a model with one takes
ST's own path."""
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def fast_parts(
    model: SparseEncoder, role: str | None
) -> tuple[PreTrainedModel, Head, torch.nn.Linear] | None:
    """(MLM, head transform, vocabulary projection) of a plain SPLADE ``SparseEncoder`` (fill-mask
    Transformer + SpladePooling(max, relu), no Router, no prompt for ``role``, no
    ``max_active_dims``); else None."""
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from sembridge_ray.sparse.model import mlm_head_name, split_head

    if len(model) != 2 or getattr(model, "max_active_dims", None) or model.default_prompt_name:
        return None
    pooling, mlm = model[1], getattr(model[0], "auto_model", None)
    if not isinstance(pooling, SpladePooling) or mlm is None:
        return None
    if (pooling.pooling_strategy, pooling.activation_function) != ("max", "relu") or any(
        model.prompts.get(name) for name in ROLE_PROMPTS[role]
    ):
        return None
    head = mlm_head_name(mlm)
    parts = split_head(getattr(mlm, head)) if head is not None else None
    return None if parts is None else (mlm, *parts)


def pool_unpadded(
    feats: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """feats (B, T, H), weight (V, H), bias (V,), mask (B, T) -> (B, V) SPLADE max pooling, without
    autograd.

    Only the unpadded tokens are projected (in groups of examples within :data:`POOL_BUDGET_BYTES`),
    and the relu'd maxima go through log1p once. Equals ``splade_pool(feats @ weight.T + bias,
    mask)``: a padded position contributes 0 there, which the relu floor gives here."""
    lengths = mask.sum(dim=1).tolist()
    tokens = feats[mask.bool()]  # (N, H), row-major: each example's tokens are contiguous
    per_group = max(1, POOL_BUDGET_BYTES // (weight.shape[0] * 4 * max(1, max(lengths))))
    out, start = [], 0
    for g in range(0, len(lengths), per_group):
        group = lengths[g : g + per_group]
        logits = F.linear(tokens[start : start + sum(group)], weight, bias).clamp_(min=0)  # (n, V)
        out += [
            seg.max(dim=0).values if len(seg) else logits.new_zeros(logits.shape[1])
            for seg in logits.split(group)
        ]
        start += sum(group)
    return torch.log1p(torch.stack(out).float())


def device_rows(pooled: torch.Tensor, max_active_dims: int | None = None) -> Rows:
    """(B, V) on any device -> per row: indices (int32, ascending) and values (float32, > 0), as
    :func:`sparse_rows`.

    Non-zeros (and the ``max_active_dims`` cut, ties to the lower index) are found on the device;
    only they are copied."""
    if max_active_dims is not None and max_active_dims < pooled.shape[1]:
        # stable sort of -value keeps the lower index first among equal values
        keep = torch.argsort(-pooled, dim=1, stable=True)[:, :max_active_dims]
        pooled = torch.zeros_like(pooled).scatter_(1, keep, pooled.gather(1, keep))
    rows, cols = torch.nonzero(pooled > 0, as_tuple=True)
    values = pooled[rows, cols].float().cpu().numpy()
    cols_np = cols.to(torch.int32).cpu().numpy()
    # a cut after every row: the last piece is empty (and the only one for no row)
    cuts = np.cumsum(torch.bincount(rows, minlength=pooled.shape[0]).cpu().numpy())
    return np.split(cols_np, cuts)[:-1], np.split(values, cuts)[:-1]


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on ``device`` when ``precision`` is bf16; nothing for fp32."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16 once resolved, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def encode_texts(
    model: SparseEncoder,
    texts: Sequence[str],
    batch_size: int,
    role: str | None = None,
    max_active_dims: int | None = None,
    precision: str = "fp32",
    done: Callable[[int], None] | None = None,
) -> Rows:
    """Texts -> sparse rows in input order, with a ``SparseEncoder``'s weights and tokenizer.

    Batches are cut from the texts sorted by length (longest first). A model :func:`fast_parts`
    cannot take apart (Router, prompts, other pooling) is encoded with its own
    ``encode``/``encode_query``/``encode_document``. ``done(n)`` is called as texts are encoded
    (after each batch; once at the end for such a model): progress."""
    parts = fast_parts(model, role)
    amp = autocast_for(model.device, precision)
    if parts is None:
        encode = {
            None: model.encode,
            "query": model.encode_query,
            "document": model.encode_document,
        }[role]
        with amp:
            emb = encode(
                list(texts), batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False
            )
        rows = sparse_rows(emb, max_active_dims)
        if done is not None:
            done(len(texts))
        return rows
    mlm, transform, decoder = parts
    order = np.argsort([-len(t) for t in texts], kind="stable")
    indices: list[np.ndarray] = [np.zeros(0, np.int32)] * len(texts)
    values: list[np.ndarray] = [np.zeros(0, np.float32)] * len(texts)
    with torch.inference_mode(), amp:
        for start in range(0, len(texts), batch_size):
            chosen = order[start : start + batch_size]
            features = model.preprocess([texts[i] for i in chosen])
            inputs = {k: features[k].to(model.device) for k in ENCODER_INPUTS if k in features}
            hidden = mlm.base_model(**inputs).last_hidden_state
            pooled = pool_unpadded(
                transform(hidden), decoder.weight, decoder.bias, inputs["attention_mask"]
            )
            for i, idx, val in zip(chosen, *device_rows(pooled, max_active_dims), strict=True):
                indices[i], values[i] = idx, val
            if done is not None:
                done(len(chosen))
    return indices, values


def sparse_table(
    ids: Sequence[str], indices: Sequence[np.ndarray], values: Sequence[np.ndarray]
) -> pa.Table:
    """Rows -> a table with ``id`` string, ``indices`` list<int32>, ``values`` list<float32>."""

    def lists(arrays: Sequence[np.ndarray], dtype: pa.DataType) -> pa.Array:
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=dtype))

    return pa.Table.from_arrays(
        [pa.array(list(ids), pa.string()), lists(indices, pa.int32()), lists(values, pa.float32())],
        schema=SPARSE_SCHEMA,
    )


def table_rows(table: pa.Table) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """The inverse of :func:`sparse_table`."""
    ids = table.column(ID).to_pylist()
    idx = [np.asarray(v, dtype=np.int32) for v in table.column(INDICES).to_pylist()]
    val = [np.asarray(v, dtype=np.float32) for v in table.column(VALUES).to_pylist()]
    return ids, idx, val
