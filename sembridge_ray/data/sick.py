"""SICK 2014 relatedness pairs (TSV with a header; ``relatedness_score`` on 1-5)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from sembridge_ray.runtime.errors import InputError
from sembridge_ray.text import text_lines

SICK_FILES = {
    "train": "SICK_train.txt",
    "trial": "SICK_trial.txt",
    "test": "SICK_test_annotated.txt",
}
BEIR_SPLITS = {"train": "train", "dev": "trial", "test": "test"}
"""BEIR split -> the SICK file it is built from: SICK's trial split is the development set, never
trained on."""
_REQUIRED = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score")


@dataclass(frozen=True, kw_only=True)
class Pair:
    """A scored sentence pair; ``pair_id`` is SICK's ``pair_ID`` or ``<file>:<line>`` for STS."""

    pair_id: str
    a: str
    b: str
    score: float


def read_sick(path: Path) -> list[Pair]:
    """Read one SICK file; a malformed row is an :class:`InputError` naming ``file:line``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"SICK file not found: {path}")
    rows = list(
        csv.reader((line for _, line in text_lines(path)), delimiter="\t", quoting=csv.QUOTE_NONE)
    )
    if not rows or any(col not in rows[0] for col in _REQUIRED):
        raise InputError(f"{path}:1: header must contain {', '.join(_REQUIRED)}")
    header = rows[0]
    index = [header.index(col) for col in _REQUIRED]
    pairs = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise InputError(f"{path}:{lineno}: expected {len(header)} columns, got {len(row)}")
        pid, a, b, score = (row[i] for i in index)
        try:
            value = float(score)
        except ValueError:
            raise InputError(
                f"{path}:{lineno}: relatedness_score {score!r} is not a number"
            ) from None
        pairs.append(Pair(pair_id=pid, a=a, b=b, score=value))
    if not pairs:
        raise InputError(f"{path}: no pairs")
    return pairs


def read_sick_split(sick_dir: Path, split: str) -> list[Pair]:
    if split not in SICK_FILES:
        raise InputError(f"unknown SICK split {split!r} (known: {', '.join(SICK_FILES)})")
    return read_sick(Path(sick_dir) / SICK_FILES[split])


_Qrels = dict[str, list[tuple[str, str, int]]]
"""split -> (query id, doc id, grade) judgements."""


def write_sick_beir(
    sick_dir: Path,
    out_dir: Path,
    min_score: float = 4.0,
    limit: int | None = None,
    splits: tuple[str, ...] = ("train", "test"),
) -> Path:
    """A BEIR-layout retrieval set from real SICK judgements.

    Queries are sentence A, documents are sentence B (both deduplicated, ids ``q<n>``/``d<n>`` in
    first-seen order over ``splits``). A pair with relatedness >= ``min_score`` makes B relevant to
    A: grade 2 from 4.5, else 1 (graded, so nDCG's gains matter). ``qrels/<split>.tsv`` comes from
    the SICK file :data:`BEIR_SPLITS` names (``train`` from train, ``dev`` from trial, ``test`` from
    test), so a fine-tuning that trains on ``train`` and selects on ``dev`` never sees its
    development pairs; ``limit`` keeps the first n pairs of each split (smoke runs); ``splits``
    picks which splits feed the corpus and qrels."""
    from sembridge_ray.runtime.outputs import atomic_path

    if unknown := [s for s in splits if s not in BEIR_SPLITS]:
        raise InputError(
            f"unknown SICK BEIR split {unknown[0]!r} (known: {', '.join(BEIR_SPLITS)})"
        )
    pairs_of = {name: read_sick_split(sick_dir, BEIR_SPLITS[name]) for name in splits}
    queries, docs, qrels = _beir_judgements(pairs_of, min_score, limit)
    with atomic_path(Path(out_dir)) as tmp:
        _write_beir(tmp, queries, docs, qrels)
    return Path(out_dir)


def _beir_judgements(
    pairs_of: dict[str, list[Pair]], min_score: float, limit: int | None
) -> tuple[dict[str, str], dict[str, str], _Qrels]:
    """(query text -> id, document text -> id, qrels per split) from the first ``limit`` pairs of
    each split."""
    queries: dict[str, str] = {}
    docs: dict[str, str] = {}
    qrels: _Qrels = {}
    for split, pairs in pairs_of.items():
        qrels[split] = []
        for pair in pairs[:limit]:
            qid = queries.setdefault(pair.a, f"q{len(queries)}")
            did = docs.setdefault(pair.b, f"d{len(docs)}")
            if pair.score >= min_score:
                qrels[split].append((qid, did, 2 if pair.score >= 4.5 else 1))
    return queries, docs, qrels


def _write_beir(folder: Path, queries: dict[str, str], docs: dict[str, str], qrels: _Qrels) -> None:
    """corpus.jsonl, queries.jsonl and qrels/<split>.tsv in ``folder``."""
    import json

    (folder / "qrels").mkdir(parents=True)
    for name, texts, title in (("corpus", docs, {"title": ""}), ("queries", queries, {})):
        lines = [
            json.dumps({"_id": i, **title, "text": t}, ensure_ascii=False) for t, i in texts.items()
        ]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for split, rows in qrels.items():
        body = "".join(f"{q}\t{d}\t{g}\n" for q, d, g in sorted(set(rows)))
        (folder / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + body, encoding="utf-8"
        )
