"""Ray Data callable classes: load once in ``__init__``, call pure functions in ``__call__``. The
driver runs the same classes itself for inputs an actor pool is not worth starting for
(``cluster.in_driver``), under :func:`actor_threads`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
import pyarrow as pa

from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.placement import Placement, pick_device
from sembridge_ray.progress import Progress
from sembridge_ray.sparse.encode import encode_texts, sparse_table

if TYPE_CHECKING:
    import ray.data
    from ray import ObjectRef

    from sembridge_ray.embed_init.pipeline import RowsContext

PATH, ROWS = "path", "rows"
log = logging.getLogger(__name__)


def use_threads(threads: int) -> None:
    """``threads`` > 0: this actor's torch thread count (see
    ``ResourceConfig.threads_per_worker``)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


@contextlib.contextmanager
def actor_threads(placement: Placement, threads: int) -> Iterator[None]:
    """torch's thread count in this process while it does an actor's work, then put back:
    ``threads`` (``threads_per_worker``) when > 0, else the worker's CPU share, as Ray sets it for
    an actor (OMP_NUM_THREADS)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads if threads > 0 else max(1, int(placement.cpus_per_worker)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SparseEncodeUDF:
    """Ray Data actor: holds a SparseEncoder on its device; turns staged (id, text) Parquet files
    into sparse vector files of the same name in ``out_dir``, and returns one row per file (its path
    and row count).

    Each file is encoded whole by :func:`~sembridge_ray.sparse.encode.encode_texts`, in batches of
    ``batch_size`` texts cut from the file's texts sorted by length (so batches pad little), rows
    written in the file's order: the vectors depend on the file alone, not on Ray's block
    boundaries, and a file whose actor died is simply encoded again."""

    def __init__(
        self,
        model_dir: str,
        max_length: int,
        batch_size: int,
        out_dir: str,
        max_active_dims: int | None = None,
        role: str | None = None,
        threads: int = 0,
        precision: str = "fp32",
        trust_remote_code: bool = False,
        device: str = "",
    ) -> None:
        """``role`` "query" or "document" encodes with ``encode_query``/``encode_document`` (the
        model's prompts or router for that side, where it has them); None uses plain ``encode``.
        ``precision`` is the driver's resolved one (fp32 or bf16), never decided here; ``device`` ""
        is :func:`pick_device`'s."""
        from sembridge_ray.sparse.model import load_sparse_encoder

        use_threads(threads)
        self.model = load_sparse_encoder(
            model_dir,
            device=device or pick_device(),
            max_length=max_length,
            trust_remote_code=trust_remote_code,
        )
        self.max_active_dims, self.batch_size, self.precision = (
            max_active_dims,
            batch_size,
            precision,
        )
        self.out_dir, self.role = Path(out_dir), role

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow.parquet as pq

        from sembridge_ray.outputs import atomic_path

        written, counts = [], []
        for path in batch.column(PATH).to_pylist():
            table = pq.read_table(path, columns=[ID, TEXT])
            texts = [str(t) for t in table.column(TEXT).to_pylist()]
            # a staged file can take minutes: this actor says how far it is, every EVERY_S seconds
            what = (
                f"encoding {'queries' if self.role == 'query' else 'documents'} ({Path(path).name})"
            )
            progress = Progress(log, what, len(texts), "texts")
            indices, values = encode_texts(
                self.model,
                texts,
                self.batch_size,
                self.role,
                self.max_active_dims,
                self.precision,
                done=progress.add,
            )
            target = self.out_dir / Path(path).name
            with atomic_path(target) as tmp:
                pq.write_table(
                    sparse_table([str(i) for i in table.column(ID).to_pylist()], indices, values),
                    tmp,
                )
            written.append(str(target))
            counts.append(table.num_rows)
        return pa.table({PATH: written, ROWS: pa.array(counts, pa.int64())})


def arrow_blocks(ds: ray.data.Dataset) -> Iterator[pa.Table]:
    """Every output block of the Ray dataset ``ds`` as an Arrow table, as it finishes (in any
    order)."""
    for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        yield cast(pa.Table, block)


class PoolArgs(TypedDict):
    """``map_batches`` keyword arguments of an actor pool."""

    compute: ray.data.ActorPoolStrategy
    num_cpus: float
    num_gpus: float
    batch_size: int | None


def actor_pool_args(placement: Placement, batch_size: int | None) -> PoolArgs:
    """``map_batches`` keyword arguments for an actor pool of ``placement.workers`` actors;
    ``batch_size`` None hands each actor call one whole block."""
    import ray

    return {
        "compute": ray.data.ActorPoolStrategy(size=placement.workers),
        "num_cpus": placement.cpus_per_worker,
        "num_gpus": placement.gpus_per_worker,
        "batch_size": batch_size,
    }


class BridgeEncodeUDF:
    """Ray Data actor: holds the bridge sentence-transformers model; (id, text) -> (id, vector)."""

    def __init__(
        self,
        name: str,
        batch_size: int,
        trust_remote_code: bool = False,
        threads: int = 0,
        precision: str = "fp32",
        device: str = "",
    ) -> None:
        from sembridge_ray.embed_init.bridge import load_bridge

        use_threads(threads)
        self.name, self.batch_size, self.precision = name, batch_size, precision
        self.model = load_bridge(
            name, device=device or pick_device(), trust_remote_code=trust_remote_code
        )

    def __call__(self, batch: pa.Table) -> pa.Table:
        from sembridge_ray.embed_init.bridge import VECTOR, encode_strings

        vecs = encode_strings(
            self.model, batch.column(TEXT).to_pylist(), self.batch_size, self.name, self.precision
        )
        return pa.table(
            {ID: batch.column(ID), VECTOR: pa.array(list(vecs), pa.list_(pa.float32()))}
        )


class InitRowsUDF:
    """Ray Data actor: holds the source bridge matrix and E_s (from the object store, put once);
    computes the weights and composed rows of a batch of bridged target tokens."""

    def __init__(self, context: list[ObjectRef[RowsContext]], threads: int = 0) -> None:
        """``context``: [the reference of the driver's one :class:`RowsContext`], put in the object
        store once and shared by every actor."""
        import ray

        use_threads(threads)
        self.ctx: RowsContext = ray.get(context[0])
        self.device = pick_device()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return rows_block(self.ctx, batch, self.device)


def rows_block(ctx: RowsContext, batch: pa.Table, device: str) -> pa.Table:
    """The weights and composed rows of one block (id, vector) of bridged target tokens: what an
    :class:`InitRowsUDF` actor returns for it."""
    from sembridge_ray.embed_init.bridge import VECTOR
    from sembridge_ray.embed_init.pipeline import compute_rows, rows_table

    ids = batch.column(ID).to_numpy()
    vecs = np.stack(batch.column(VECTOR).to_numpy(zero_copy_only=False)).astype(np.float32)
    return rows_table(compute_rows(ctx, ids, vecs, device=device))
