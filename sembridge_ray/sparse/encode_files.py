"""The worker of the evaluate and export jobs' encoding pool
(:class:`sembridge_ray.runtime.executor.Pool`): staged (id, text) Parquet files in, sparse vector
files out."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.runtime.atomic import atomic_path
from sembridge_ray.runtime.executor import use_threads
from sembridge_ray.runtime.placement import pick_device
from sembridge_ray.runtime.progress import Progress
from sembridge_ray.sparse.encode import encode_texts, sparse_table

PATH, ROWS = "path", "rows"
log = logging.getLogger(__name__)


class SparseEncodeUDF:
    """A pool's worker: holds a SparseEncoder on its device; turns staged (id, text) Parquet files
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
        self.max_active_dims, self.batch_size = max_active_dims, batch_size
        self.precision, self.out_dir, self.role = precision, Path(out_dir), role

    def __call__(self, batch: pa.Table) -> pa.Table:
        written, counts = [], []
        for path in batch.column(PATH).to_pylist():
            table = pq.read_table(path, columns=[ID, TEXT])
            texts = [str(t) for t in table.column(TEXT).to_pylist()]
            # a staged file can take minutes: this actor says how far it is, every EVERY_S seconds
            side = "queries" if self.role == "query" else "documents"
            progress = Progress(log, f"encoding {side} ({Path(path).name})", len(texts), "texts")
            indices, values = encode_texts(
                self.model,
                texts,
                self.batch_size,
                self.role,
                self.max_active_dims,
                self.precision,
                done=progress.add,
            )
            ids = [str(i) for i in table.column(ID).to_pylist()]
            target = self.out_dir / Path(path).name
            with atomic_path(target) as tmp:
                pq.write_table(sparse_table(ids, indices, values), tmp)
            written.append(str(target))
            counts.append(table.num_rows)
        return pa.table({PATH: written, ROWS: pa.array(counts, pa.int64())})
