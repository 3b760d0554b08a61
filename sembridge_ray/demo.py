"""The offline demo: encode real SICK sentences with a tiny SPLADE fixture through a Ray Data actor pool."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from sembridge_ray.config import Config
from sembridge_ray.data.schema import ID, INDICES, TEXT, VALUES
from sembridge_ray.data.sick import read_sick_split
from sembridge_ray.placement import ResourceConfig
from sembridge_ray.resources import SICK_DIR


@dataclass(frozen=True)
class DemoConfig(Config):
    """Demo job settings."""

    output: str = "outputs/demo"
    """Output directory (``DEMO_OUTPUT`` in ``cluster/local.sh``)."""
    model: str = ""
    """SparseEncoder directory or hub id; empty = the tiny ``bert-mlm`` fixture built under the output."""
    max_length: int = 64
    limit: int = 2000
    """Encode at most this many SICK test sentences (0 = all)."""
    batch_size: int = 128
    resources: ResourceConfig = field(default_factory=ResourceConfig)


def sick_sentences(limit: int) -> pa.Table:
    """Unique SICK test sentences as an (id, text) table, in first-seen order."""
    seen: dict[str, None] = {}
    for pair in read_sick_split(SICK_DIR, "test"):
        seen.setdefault(pair.a)
        seen.setdefault(pair.b)
    texts = list(seen)[: limit or None]
    return pa.table({ID: [f"s{i}" for i in range(len(texts))], TEXT: texts})


def summarise(table: pa.Table) -> dict[str, float]:
    """Rows, mean/max active dimensions and the total mass of a sparse-vector table."""
    lengths = np.array([len(v) for v in table.column(INDICES).to_pylist()])
    mass = float(sum(float(np.sum(v)) for v in table.column(VALUES).to_pylist()))
    return {"rows": int(table.num_rows), "mean_active_dims": float(lengths.mean()) if len(lengths) else 0.0,
            "max_active_dims": int(lengths.max()) if len(lengths) else 0, "total_weight": mass}
