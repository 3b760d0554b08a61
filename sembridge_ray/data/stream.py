"""The training stream: pairs in the exact order training consumes them, materialised to Parquet once.

Row ``s · B + i`` is pair i of global batch s (B = the global batch size). Epoch e is a permutation of the pairs
seeded by (seed, e), cut to whole batches. Because the order lives in the file, step s sees the same pairs for any
number of workers and after any resume: a resumed run skips s · B rows and continues.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.data.pairs import training_pairs
from sembridge_ray.errors import InputError
from sembridge_ray.outputs import atomic_path, atomic_write_json

log = logging.getLogger(__name__)
STREAM_FILE, STREAM_INFO = "train_stream.parquet", "train_stream.json"


@dataclass(frozen=True, kw_only=True)
class StreamInfo:
    """What was materialised, and the settings it was materialised for (a rerun reuses a matching stream)."""

    spec: str
    split: str
    hard_negatives: int
    batch_size: int
    epochs: int
    max_steps: int | None
    seed: int
    pairs: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0
    unknown_queries: int = 0
    unknown_docs: int = 0
    without_negatives: int = 0


def training_stream(pairs: pa.Table, batch_size: int, steps: int, seed: int) -> pa.Table:
    """pairs (N rows) -> the first ``steps`` global batches (steps · batch_size rows) over seeded epochs.

    Each epoch is ``np.random.default_rng([seed, epoch]).permutation(N)`` truncated to whole batches.
    """
    per_epoch = pairs.num_rows // batch_size
    if per_epoch == 0:
        raise ValueError(f"{pairs.num_rows} pairs make no global batch of {batch_size}")
    parts = []
    for epoch in range(math.ceil(steps / per_epoch)):
        order = np.random.default_rng([seed, epoch]).permutation(pairs.num_rows)[: per_epoch * batch_size]
        parts.append(pairs.take(pa.array(order)))
    return pa.concat_tables(parts).slice(0, steps * batch_size)


def materialise_stream(request: StreamInfo, out_dir: Path) -> tuple[Path, StreamInfo]:
    """Write ``out_dir/train_stream.parquet`` (+ ``.json``) for ``request``, or reuse the one already there.

    An empty training set, or fewer pairs than one global batch, is an :class:`InputError` naming the spec.
    """
    path, info_path = Path(out_dir) / STREAM_FILE, Path(out_dir) / STREAM_INFO
    if path.is_file() and info_path.is_file():
        info = StreamInfo(**json.loads(info_path.read_text(encoding="utf-8")))
        if _settings(info) == _settings(request):
            log.info("reusing the training stream %s (%d steps)", path, info.total_steps)
            return path, info
    pairs, stats = training_pairs(request.spec, request.split, request.hard_negatives)
    per_epoch = pairs.num_rows // request.batch_size
    if per_epoch == 0:
        raise InputError(
            f"training set {request.spec!r} has {pairs.num_rows} pairs, fewer than one global "
            f"batch of {request.batch_size}"
        )
    total = per_epoch * request.epochs
    total = total if request.max_steps is None else min(total, request.max_steps)
    info = StreamInfo(
        **{
            **_settings(request),
            "pairs": pairs.num_rows,
            "steps_per_epoch": per_epoch,
            "total_steps": total,
            "unknown_queries": stats.unknown_queries,
            "unknown_docs": stats.unknown_docs,
            "without_negatives": stats.without_negatives,
        }
    )
    with atomic_path(path) as tmp:
        pq.write_table(training_stream(pairs, request.batch_size, total, request.seed), tmp, row_group_size=8192)
    atomic_write_json(info_path, asdict(info))
    log.info("training stream: %d pairs, %d steps per epoch, %d steps -> %s", info.pairs, per_epoch, total, path)
    return path, info


def _settings(info: StreamInfo) -> dict[str, Any]:
    keys = ("spec", "split", "hard_negatives", "batch_size", "epochs", "max_steps", "seed")
    return {k: getattr(info, k) for k in keys}
