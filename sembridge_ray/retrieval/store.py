"""Sparse vectors on disk and runs on disk: Parquet shards in, CSR row ranges out; TREC run files;
fingerprints.

Vector files have ``id`` string, ``indices`` list<int32>, ``values`` list<float32>
(``data.schema.SPARSE_SCHEMA``). They are read in a fixed order (sorted file names, then row order),
so row numbers are stable between passes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sembridge_ray.data.schema import ID, INDICES, VALUES
from sembridge_ray.retrieval.index import PAD, SparseBatch, TopK


def parquet_files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).rglob("*.parquet") if p.is_file())


def read_ids(files: Sequence[Path]) -> pa.Array:
    """Every row's id, in file then row order."""
    chunks = [pq.read_table(f, columns=[ID]).column(ID) for f in files]
    return pa.chunked_array([c for ch in chunks for c in ch.chunks], pa.string()).combine_chunks()


def sparse_batch(table: pa.Table) -> SparseBatch:
    """An (id, indices, values) table -> its rows in CSR form (zero-copy where Arrow allows)."""
    lengths = pc.list_value_length(table.column(INDICES)).to_numpy(zero_copy_only=False)
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    indices, values = (
        pc.list_flatten(table.column(name)).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        for name, dtype in ((INDICES, np.int32), (VALUES, np.float32))
    )
    return SparseBatch(indptr, indices, values)


def read_vectors(files: Sequence[Path]) -> tuple[list[str], SparseBatch]:
    """All rows of (small) vector files, sorted by id: ids and CSR rows."""
    table = pa.concat_tables([pq.read_table(f) for f in files]) if files else None
    if table is None or table.num_rows == 0:
        return [], SparseBatch(
            np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32)
        )
    table = table.sort_by(ID)
    return table.column(ID).to_pylist(), sparse_batch(table)


def iter_row_ranges(
    files: Sequence[Path], bounds: Sequence[tuple[int, int]], chunk: int = 65536
) -> Iterator[SparseBatch]:
    """One CSR batch per consecutive ``[start, stop)`` range of rows, streaming: one range in memory
    at a time."""
    stream = (
        b
        for f in files
        for b in pq.ParquetFile(f).iter_batches(batch_size=chunk, columns=[INDICES, VALUES])
    )
    held: list[pa.RecordBatch] = []
    have = 0
    for start, stop in bounds:
        while have < stop - start:
            batch = next(stream, None)
            if batch is None:
                raise ValueError(f"vector files end before row {stop}")
            held.append(batch)
            have += batch.num_rows
        table = pa.Table.from_batches(held)
        yield sparse_batch(table.slice(0, stop - start))
        rest = table.slice(stop - start)
        held, have = rest.to_batches(), rest.num_rows


def fingerprint(*parts: object) -> str:
    """A short stable hash of JSON-able parts (cache keys)."""
    text = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def format_score(score: float) -> str:
    """Nine significant digits: every float32 round-trips, so trec_eval sees the order we
    computed."""
    return f"{float(score):.9g}"


def run_lines(qids: Sequence[str], top: TopK, sorted_ids: pa.Array, tag: str) -> Iterator[str]:
    """TREC run lines ``qid Q0 docid rank score tag`` (rank from 1), padding skipped."""
    for row, qid in enumerate(qids):
        valid = top.ranks[row] != PAD
        docids = sorted_ids.take(pa.array(top.ranks[row][valid])).to_pylist()
        for rank, (doc, score) in enumerate(
            zip(docids, top.scores[row][valid], strict=True), start=1
        ):
            yield f"{qid} Q0 {doc} {rank} {format_score(score)} {tag}\n"


def read_run(path: Path) -> dict[str, dict[str, float]]:
    """A TREC run file -> {qid: {docid: score}} (what trec_eval reads: the rank column is
    ignored)."""
    with open(path, encoding="utf-8") as fh:
        return parse_run(fh)


def parse_run(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """TREC run lines -> {qid: {docid: score}}: the scores as the run file holds them (see
    :func:`format_score`)."""
    run: dict[str, dict[str, float]] = {}
    for line in lines:
        fields = line.split()
        if len(fields) == 6:
            run.setdefault(fields[0], {})[fields[2]] = float(fields[4])
    return run


def stage_corpus(batches: Iterator[pa.Table], directory: Path) -> list[Path]:
    """Write a streamed (id, text) corpus as one Parquet file per batch; returns the files, in
    order."""
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for number, table in enumerate(batches):
        files.append(directory / f"part-{number:06d}.parquet")
        pq.write_table(table, files[-1])
    return files
