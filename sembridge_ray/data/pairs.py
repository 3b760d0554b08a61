"""Training pairs: ``query``, ``positive`` and optional ``negative_1..k`` columns, materialised to
Parquet once.

From a Parquet file of pairs they are read as they are; from a retrieval dataset (see
``data.retrieval``) each judged query with a relevant document gives one row (its best-graded
positive, lowest doc id on ties), with up to ``hard_negatives`` judged non-relevant documents
(MIRACL ships annotator-judged negatives). Qrels naming unknown queries or documents are counted and
skipped, with a warning."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.data.registry import load_retrieval, parts
from sembridge_ray.data.retrieval import RetrievalData
from sembridge_ray.data.schema import ID, NEGATIVE_PREFIX, POSITIVE, QUERY, TEXT
from sembridge_ray.runtime.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PairStats:
    rows: int
    unknown_queries: int = 0
    unknown_docs: int = 0
    without_negatives: int = 0


def negative_columns(k: int) -> list[str]:
    return [f"{NEGATIVE_PREFIX}_{i}" for i in range(1, k + 1)]


def read_pairs(path: Path) -> pa.Table:
    """A Parquet file with ``query``, ``positive`` and optional ``negative…`` string columns."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise InputError(f"cannot read pairs Parquet {path}: {err}") from None
    if missing := [c for c in (QUERY, POSITIVE) if c not in table.column_names]:
        raise InputError(f"pairs file {path} lacks column(s) {', '.join(missing)}")
    keep = [
        QUERY,
        POSITIVE,
        *sorted(c for c in table.column_names if c.startswith(NEGATIVE_PREFIX)),
    ]
    # Parquet readers do not check that a string column's bytes are UTF-8: a bad one would fail
    # later, in a training worker, with a traceback.
    for name in keep:
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise InputError(
                f"pairs file {path}: column {name!r} holds {column.type}, not text (string)"
            )
        try:
            column.validate(full=True)
        except pa.ArrowInvalid as err:
            raise InputError(
                f"pairs file {path}: column {name!r} is not valid UTF-8 text ({err})"
            ) from None
    return table.select(keep)


def pairs_from_retrieval(
    data: RetrievalData, hard_negatives: int = 0, batch: int = 50_000
) -> tuple[pa.Table, PairStats]:
    """One row per judged query with a relevant document; streams the corpus once for the needed
    texts."""
    plan, unknown_q = _pair_plan(data, hard_negatives)
    texts = _corpus_texts(data, {d for _, p, negs in plan for d in (p, *negs)}, batch)
    rows, unknown_d, without_neg = _pair_rows(data, plan, texts, hard_negatives)
    stats = PairStats(
        rows=len(rows[QUERY]),
        unknown_queries=unknown_q,
        unknown_docs=unknown_d,
        without_negatives=without_neg,
    )
    if unknown_q or unknown_d or without_neg:
        log.warning(
            "%s/%s: skipped %d qrels queries not in the topics, %d positives not in the corpus, "
            "%d queries with fewer than %d judged negatives",
            data.name,
            data.split,
            unknown_q,
            unknown_d,
            without_neg,
            hard_negatives,
        )
    return pa.table(rows), stats


_Planned = list[tuple[str, str, list[str]]]
"""(query id, best positive, judged negatives) per judged query with a relevant document, in query
id order."""


def _pair_plan(data: RetrievalData, hard_negatives: int) -> tuple[_Planned, int]:
    """Each judged query's best-graded positive (lowest id on ties) and negatives; how many are not
    in the topics."""
    plan: _Planned = []
    unknown_q = 0
    for qid in sorted(data.qrels):
        docs = data.qrels[qid]
        pos = sorted((d for d, g in docs.items() if g > 0), key=lambda d: (-docs[d], d))
        if not pos:
            continue
        if qid not in data.queries:
            unknown_q += 1
            continue
        plan.append((qid, pos[0], sorted(d for d, g in docs.items() if g <= 0)[:hard_negatives]))
    return plan, unknown_q


def _corpus_texts(data: RetrievalData, needed: set[str], batch: int) -> dict[str, str]:
    """doc id -> text of the ``needed`` documents, in one pass over the corpus."""
    texts: dict[str, str] = {}
    for table in data.corpus.batches(batch):
        for doc_id, text in zip(
            table.column(ID).to_pylist(), table.column(TEXT).to_pylist(), strict=True
        ):
            if doc_id in needed:
                texts[doc_id] = text
    return texts


def _pair_rows(
    data: RetrievalData, plan: _Planned, texts: dict[str, str], hard_negatives: int
) -> tuple[dict[str, list[str]], int, int]:
    """The pairs' columns, and how many were skipped: positive not in the corpus, too few negatives
    in it."""
    negative_names = negative_columns(hard_negatives)
    rows: dict[str, list[str]] = {QUERY: [], POSITIVE: [], **{c: [] for c in negative_names}}
    unknown_d = without_neg = 0
    for qid, positive, negs in plan:
        negs = [d for d in negs if d in texts]
        if positive not in texts:
            unknown_d += 1
            continue
        if len(negs) < hard_negatives:
            without_neg += 1
            continue
        rows[QUERY].append(data.queries[qid])
        rows[POSITIVE].append(texts[positive])
        for col, doc in zip(negative_names, negs, strict=True):
            rows[col].append(texts[doc])
    return rows, unknown_d, without_neg


def training_pairs(
    spec: str, split: str = "train", hard_negatives: int = 0
) -> tuple[pa.Table, PairStats]:
    """Pairs for a dataset spec or a ``.parquet`` pairs file, or for several joined by ``+`` (their
    pairs one after the other: ``xquad:zh+cmrc2018:zh``); an empty result is an error naming the
    spec."""
    done = [_part_pairs(part, split, hard_negatives) for part in parts(spec)]
    tables = [table for table, _ in done]
    found = PairStats(
        **{f.name: sum(getattr(s, f.name) for _, s in done) for f in fields(PairStats)}
    )
    if len({t.num_columns for t in tables}) > 1:
        raise InputError(
            f"training set {spec!r}: its parts have different columns (hard negatives in some only)"
        )
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if table.num_rows == 0:
        raise InputError(f"training set {spec!r} ({split}) is empty")
    return table, found


def _part_pairs(spec: str, split: str, hard_negatives: int) -> tuple[pa.Table, PairStats]:
    if spec.endswith(".parquet") or (Path(spec).is_file() and not Path(spec).is_dir()):
        table = read_pairs(Path(spec))
        return table, PairStats(rows=table.num_rows)
    return pairs_from_retrieval(load_retrieval(spec, split), hard_negatives)
