"""The training stream: pairs in the exact order training consumes them, materialised to Parquet
once.

Row ``s · B + i`` is pair i of global batch s (B = the global batch size). With
``batch_sampler=no_duplicates`` (the default) epoch e is cut by sentence-transformers' own
``NoDuplicatesBatchSampler`` (seed + e): no text occurs twice in a global batch, so no in-batch
negative is a copy of another pair's query or positive. With ``batch_sampler`` epoch e is a
permutation of the pairs seeded by (seed, e), cut to whole batches (the order before duplicate-free
batches existed). Because the order lives in the file, step s sees the same pairs for any number of
workers and after any resume: a resumed run skips s · B rows and continues.

The stream and its settings (``train_stream.json``) form one :mod:`sembridge_ray.cache` entry,
``<out_dir>/train_stream/``: a resume reuses them only when both verify against their sha256 and the
settings match; otherwise the entry is moved aside with a warning and the stream is materialised
again."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray import cache
from sembridge_ray.data.pairs import training_pairs
from sembridge_ray.runtime.errors import InputError

log = logging.getLogger(__name__)
STREAM_ENTRY, STREAM_FILE, STREAM_INFO = "train_stream", "train_stream.parquet", "train_stream.json"


@dataclass(frozen=True, kw_only=True)
class StreamInfo:
    """What was materialised, and the settings it was materialised for (a rerun reuses a matching
    stream)."""

    spec: str
    split: str
    hard_negatives: int
    batch_size: int
    epochs: int
    max_steps: int | None
    seed: int
    batch_sampler: str = "no_duplicates"
    # the settings end here (:func:`_settings`); the rest is counted while the stream is made
    pairs: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0
    unknown_queries: int = 0
    unknown_docs: int = 0
    without_negatives: int = 0


def training_stream(
    pairs: pa.Table, batch_size: int, steps: int, seed: int, batch_sampler: str = "no_duplicates"
) -> pa.Table:
    """pairs (N rows) -> the first ``steps`` global batches (steps · batch_size rows) over seeded
    epochs.

    ``batch_sampler``: each epoch is ``NoDuplicatesBatchSampler(seed=seed, drop_last=True)`` at
    epoch e (its ``N // batch_size`` batches), or ``np.random.default_rng([seed,
    epoch]).permutation(N)`` truncated to whole batches."""
    per_epoch = pairs.num_rows // batch_size
    if per_epoch == 0:
        raise ValueError(f"{pairs.num_rows} pairs make no global batch of {batch_size}")
    epochs = math.ceil(steps / per_epoch)
    if batch_sampler == "no_duplicates":
        orders = _no_duplicate_orders(pairs, batch_size, seed, epochs)
    else:
        orders = (
            np.random.default_rng([seed, e]).permutation(pairs.num_rows)[: per_epoch * batch_size]
            for e in range(epochs)
        )
    parts = [pairs.take(pa.array(order)) for order in orders]
    return pa.concat_tables(parts).slice(0, steps * batch_size)


def _no_duplicate_orders(
    pairs: pa.Table, batch_size: int, seed: int, epochs: int
) -> Iterator[np.ndarray]:
    """Each epoch's row order as sentence-transformers' ``NoDuplicatesBatchSampler`` batches it (the
    sampler a ``SparseEncoderTrainer`` user picks with ``BatchSamplers.NO_DUPLICATES``), batches
    concatenated."""
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    sampler = NoDuplicatesBatchSampler(
        Dataset(InMemoryTable(pairs)),
        batch_size=batch_size,
        drop_last=True,
        generator=torch.Generator(),
        seed=seed,
    )
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        yield np.fromiter((i for batch in sampler for i in batch), dtype=np.int64)


def materialise_stream(request: StreamInfo, out_dir: Path) -> tuple[Path, StreamInfo]:
    """Write ``out_dir/train_stream/train_stream.parquet`` (+ ``.json``) for ``request``, or reuse
    the one already there when it verifies and was made for the same settings.

    An empty training set, or fewer pairs than one global batch, is an :class:`InputError` naming
    the spec."""
    entry = Path(out_dir) / STREAM_ENTRY
    (path, info), hit = cache.fetch(
        entry,
        lambda found: _stored_stream(found, request),
        lambda tmp: _build_stream(request, entry, tmp),
        "training stream",
    )
    if hit:
        log.info("reusing the training stream %s (%d steps)", path, info.total_steps)
    return path, info


def _stored_stream(entry: cache.Entry, request: StreamInfo) -> tuple[Path, StreamInfo]:
    info = StreamInfo(**json.loads(entry.read_bytes(STREAM_INFO)))
    if _settings(info) != _settings(request):
        raise cache.Corrupt(entry.current, "made for other settings")
    # the cache streams the Parquet file through sha256 before it is served
    return entry.path / STREAM_FILE, info


def _build_stream(request: StreamInfo, entry: Path, tmp: Path) -> tuple[Path, StreamInfo]:
    pairs, stats = training_pairs(request.spec, request.split, request.hard_negatives)
    per_epoch = pairs.num_rows // request.batch_size
    if per_epoch == 0:
        raise InputError(
            f"training set {request.spec!r} has {pairs.num_rows} pairs, fewer than one global "
            f"batch of {request.batch_size}"
        )
    total = per_epoch * request.epochs
    total = total if request.max_steps is None else min(total, request.max_steps)
    info = replace(
        request,
        pairs=pairs.num_rows,
        steps_per_epoch=per_epoch,
        total_steps=total,
        unknown_queries=stats.unknown_queries,
        unknown_docs=stats.unknown_docs,
        without_negatives=stats.without_negatives,
    )
    stream = training_stream(pairs, request.batch_size, total, request.seed, request.batch_sampler)
    tmp.mkdir(parents=True)  # only now: a failed read of the training set leaves nothing behind
    pq.write_table(stream, tmp / STREAM_FILE, row_group_size=8192)
    (tmp / STREAM_INFO).write_text(json.dumps(asdict(info), indent=2) + "\n", encoding="utf-8")
    path = entry / STREAM_FILE
    log.info(
        "training stream: %d pairs, %d steps per epoch, %d steps -> %s",
        info.pairs,
        per_epoch,
        total,
        path,
    )
    return path, info


def _settings(info: StreamInfo) -> tuple[object, ...]:
    """The fields of a :class:`StreamInfo` the stream is made from: those before ``pairs`` (the rest
    is counted while it is made)."""
    names = [f.name for f in fields(StreamInfo)]
    return tuple(getattr(info, name) for name in names[: names.index("pairs")])
