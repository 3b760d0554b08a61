"""Writers for the two-process tests of ``test_caches.py``, importable by a spawned process (which
imports this module, not the test module and its imports).

Each writer waits on a barrier inside its build, so both have missed the cache before either
publishes: the race to publish one entry happens every time, not by luck. Writer ``index`` computes
values offset by ``index``, so the two results are equal only when the loser serves the winner's
entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

BARRIER_S = 120.0  # a spawned interpreter importing torch takes seconds on a busy 2-core machine


def strings() -> pa.Table:
    """A four-token vocabulary's (id, text), as ``bridge.vocab_strings`` gives them."""
    return pa.table(
        {"id": pa.array([0, 1, 2, 5], pa.int32()), "text": ["[PAD]", "cat", "sat", "##s"]}
    )


def vectors(table: pa.Table, offset: float = 0.0) -> np.ndarray:
    """Deterministic (n, 8) float32 stand-ins for bridge vectors, a function of the ids."""
    ids = table.column("id").to_numpy().astype(np.float32)
    return (np.outer(ids + 1, np.arange(1, 9, dtype=np.float32)) / 7 + offset).astype(np.float32)


def bytes_writer(entry: str, index: int, barrier: Any, results: Any) -> None:
    from sembridge_ray import cache

    def build(tmp: Path) -> bytes:
        barrier.wait(BARRIER_S)
        tmp.mkdir(parents=True)
        (tmp / "data.bin").write_bytes(f"written by {index}".encode())
        return f"written by {index}".encode()

    value, hit = cache.fetch(
        Path(entry), lambda found: found.read_bytes("data.bin"), build, "test cache"
    )
    results.put((index, value, hit))


def bridge_writer(cache_dir: str, index: int, barrier: Any, results: Any) -> None:
    from sembridge_ray.embed_init.bridge import cached_vectors

    def encode(table: pa.Table) -> np.ndarray:
        barrier.wait(BARRIER_S)
        return vectors(table, offset=index)

    results.put((index, cached_vectors(Path(cache_dir), "bridge-key", strings(), encode), None))


def encode_cache_writer(entry: str, index: int, barrier: Any, results: Any) -> None:
    import pyarrow.parquet as pq

    from sembridge_ray.retrieval.sources import VECTORS, cached

    def build(tmp: Path) -> dict[str, Any]:
        barrier.wait(BARRIER_S)
        (tmp / VECTORS).mkdir()
        pq.write_table(
            pa.table({"id": ["d0", "d1"], "value": [float(index), 1.0]}),
            tmp / VECTORS / "part-0.parquet",
        )
        return {"rows": 2}

    directory, hit = cached(Path(entry), build)
    results.put((index, pq.read_table(directory / "part-0.parquet").to_pydict(), hit))


def word_vector_writer(path: str, index: int, barrier: Any, results: Any) -> None:
    """Read the cache, then add a word of one's own: the read-modify-write that used to lose one
    writer's words."""
    from sembridge_ray.siamese import vectors as word_vectors

    before = word_vectors._read_cache(Path(path))
    barrier.wait(BARRIER_S)
    word_vectors._write_cache(Path(path), {f"word{index}": np.full(4, index, np.float32)})
    results.put((index, sorted(before), None))
