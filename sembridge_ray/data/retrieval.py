"""Retrieval datasets in the formats they are published in: BEIR directories, MIRACL
topics/qrels/corpus and WebFAQ on the hub (``data.squad``: SQuAD-format reading comprehension). A
dataset spec is parsed in ``data.registry``.

| spec               | source                                                                                  |
|--------------------|-----------------------------------------------------------------------------------------|
| ``webfaq:<lang>``  | hub ``PaDaS-Lab/webfaq-retrieval``, configs ``<iso3>-corpus/-queries/-qrels`` (``ara``…) |
| ``miracl:<lang>``  | hub ``miracl/miracl`` topics + qrels (Anserini TSV) and ``miracl/miracl-corpus`` JSONL   |
| ``miracl:<lang>@DIR`` | the same files from a local mirror: ``DIR/<lang>/topics.miracl-v1.0-<lang>-<split>.tsv``, |
|                    | ``…/qrels…tsv`` and ``DIR/<lang>/corpus/*.jsonl[.gz]`` (air-gapped clusters)             |
| a directory        | BEIR layout: ``corpus.jsonl`` (_id, title, text), ``queries.jsonl`` (_id, text),           |
|                    | ``qrels/<split>.tsv`` (query-id, corpus-id, score; header)                                |

Documents are ``title + " " + text``. Corpora are streamed in Arrow batches, never held whole:
MIRACL ru has 9.5M passages. Queries and qrels are small and held in memory."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.languages import iso639_3
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.text import nonblank_lines, text_lines

Qrels = dict[str, dict[str, int]]
CORPUS_SCHEMA = pa.schema([(ID, pa.string()), (TEXT, pa.string())])
MIRACL_CORPUS_FILES = {
    "ar": 5,
    "bn": 1,
    "en": 66,
    "es": 21,
    "fa": 5,
    "fi": 4,
    "fr": 30,
    "hi": 2,
    "id": 3,
    "ja": 14,
    "ko": 3,
    "ru": 20,
    "sw": 1,
    "te": 2,
    "th": 2,
    "zh": 10,
    "de": 32,
    "yo": 1,
}


@dataclass(frozen=True)
class Corpus:
    """A streamable corpus: ``batches(n)`` yields Arrow tables (id, text) of at most n rows."""

    name: str
    batches: Callable[[int], Iterator[pa.Table]] = field(repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class RetrievalData:
    name: str
    split: str
    queries: dict[str, str]
    qrels: Qrels
    corpus: Corpus


def doc_text(title: str | None, text: str | None) -> str:
    return f"{title or ''} {text or ''}".strip()


def jsonl_batches(paths: list[Path], id_key: str, size: int) -> Iterator[pa.Table]:
    """Stream JSONL(.gz) documents {id_key, title?, text} as (id, text) tables; bad lines name
    file:line."""
    ids: list[str] = []
    texts: list[str] = []
    for path in paths:
        for lineno, line in nonblank_lines(path):
            try:
                row = json.loads(line)
                ids.append(str(row[id_key]))
                texts.append(doc_text(row.get("title"), row.get("text")))
            except (ValueError, KeyError, TypeError):
                raise InputError(
                    f"{path}:{lineno}: not a JSON object with {id_key!r} and 'text'"
                ) from None
            if len(ids) == size:
                yield pa.table({ID: ids, TEXT: texts}, schema=CORPUS_SCHEMA)
                ids, texts = [], []
    if ids:
        yield pa.table({ID: ids, TEXT: texts}, schema=CORPUS_SCHEMA)


def read_jsonl_queries(path: Path) -> dict[str, str]:
    """BEIR ``queries.jsonl``; a query id that appears twice is an error naming it."""
    queries: dict[str, str] = {}
    for lineno, line in nonblank_lines(path):
        try:
            row = json.loads(line)
            qid, text = str(row["_id"]), str(row["text"])
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}:{lineno}: not a JSON object with '_id' and 'text'") from None
        _add_query(queries, qid, text, f"{path}:{lineno}")
    return queries


def _add_query(queries: dict[str, str], qid: str, text: str, where: str) -> None:
    if qid in queries:
        raise InputError(f"{where}: query id {qid!r} appears twice")
    queries[qid] = text


def read_tsv_topics(path: Path) -> dict[str, str]:
    """Anserini topics: ``qid<TAB>text``, no header."""
    queries: dict[str, str] = {}
    for lineno, line in nonblank_lines(path):
        qid, sep, text = line.rstrip("\r\n").partition("\t")
        if not sep:
            raise InputError(f"{path}:{lineno}: expected 'qid<TAB>text'")
        _add_query(queries, qid, text, f"{path}:{lineno}")
    return queries


def read_qrels(path: Path) -> Qrels:
    """TREC qrels (``qid Q0 docid rel``, no header) or BEIR qrels (``query-id corpus-id score``,
    header)."""
    qrels: Qrels = {}
    for lineno, line in text_lines(path):
        fields = line.split()
        if not fields or (lineno == 1 and fields[0] == "query-id"):
            continue
        if len(fields) not in (3, 4):
            raise InputError(
                f"{path}:{lineno}: expected 3 (BEIR) or 4 (TREC) columns, got {len(fields)}"
            )
        qid, doc, rel = fields[0], fields[-2], fields[-1]  # TREC's second column is "Q0"
        try:
            qrels.setdefault(qid, {})[doc] = int(float(rel))
        except ValueError:
            raise InputError(f"{path}:{lineno}: relevance {rel!r} is not a number") from None
    return qrels


def load_beir(root: Path, split: str) -> RetrievalData:
    root = Path(root)
    for rel in ("corpus.jsonl", "queries.jsonl"):
        if not (root / rel).is_file():
            raise InputError(f"BEIR directory {root}: {rel} not found")
    qrels_path = root / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        raise InputError(
            f"BEIR directory {root}: no qrels for split {split!r} ({qrels_path} not found)"
        )
    return RetrievalData(
        name=str(root),
        split=split,
        queries=read_jsonl_queries(root / "queries.jsonl"),
        qrels=read_qrels(qrels_path),
        corpus=Corpus(str(root), lambda n: jsonl_batches([root / "corpus.jsonl"], "_id", n)),
    )


def load_miracl(lang: str, split: str, mirror: Path | None = None) -> RetrievalData:
    # MIRACL publishes train/dev judgements; its test sets are hidden, so test evaluates on dev
    sp = "dev" if split == "test" else split
    topics = f"topics.miracl-v1.0-{lang}-{sp}.tsv"
    qrels = f"qrels.miracl-v1.0-{lang}-{sp}.tsv"
    if mirror is not None:
        base = Path(mirror) / lang
        if not (base / topics).is_file() or not (base / qrels).is_file():
            raise InputError(f"MIRACL mirror {mirror}: no {lang} {sp} topics/qrels under {base}")
        doc_files = sorted((base / "corpus").glob("*.jsonl*")) if (base / "corpus").is_dir() else []
        queries, judged = read_tsv_topics(base / topics), read_qrels(base / qrels)
    else:
        queries = read_tsv_topics(_hub_file("miracl/miracl", f"miracl-v1.0-{lang}/topics/{topics}"))
        judged = read_qrels(_hub_file("miracl/miracl", f"miracl-v1.0-{lang}/qrels/{qrels}"))
        doc_files = [
            _hub_file("miracl/miracl-corpus", f"miracl-corpus-v1.0-{lang}/docs-{i}.jsonl.gz")
            for i in range(MIRACL_CORPUS_FILES.get(lang, 0))
        ]

    def batches(n: int) -> Iterator[pa.Table]:
        if not doc_files:
            raise InputError(
                f"MIRACL {lang}: no corpus files (hub miracl/miracl-corpus or {mirror}/{lang}/corpus/)"
            )
        return jsonl_batches(doc_files, "docid", n)

    return RetrievalData(
        name=f"miracl:{lang}",
        split=sp,
        queries=queries,
        qrels=judged,
        corpus=Corpus(f"miracl-corpus:{lang}", batches),
    )


def _hub_file(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename, repo_type="dataset"))
    except Exception as err:  # the hub client raises many types; all mean "cannot have this file"
        raise InputError(
            f"cannot fetch {filename} from hub dataset {repo}: {type(err).__name__}"
        ) from None


def load_webfaq(lang: str, split: str) -> RetrievalData:
    """WebFAQ retrieval configs ``<iso3>-corpus`` (split corpus), ``<iso3>-queries``,
    ``<iso3>-qrels``."""
    import datasets

    code = iso639_3(lang)

    def hub(config: str, hub_split: str) -> Any:
        try:
            return datasets.load_dataset(
                "PaDaS-Lab/webfaq-retrieval", f"{code}-{config}", split=hub_split
            )
        except Exception as err:  # datasets raises many types; all mean "cannot have this data"
            raise InputError(
                f"cannot load PaDaS-Lab/webfaq-retrieval {code}-{config}[{hub_split}]: {type(err).__name__}"
            ) from None

    qrels: Qrels = {}
    for row in hub("qrels", split):
        qrels.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(float(row["score"]))
    try:
        query_rows = hub("queries", split)
    # older revisions had one "queries" split for all: filtered by the qrels below
    except InputError:
        query_rows = hub("queries", "queries")
    queries: dict[str, str] = {}
    for row in query_rows:
        _add_query(queries, str(row["_id"]), str(row["text"]), f"webfaq {code}-queries")

    def batches(n: int) -> Iterator[pa.Table]:
        for chunk in hub("corpus", "corpus").iter(batch_size=n):
            texts = [doc_text(t, x) for t, x in zip(chunk["title"], chunk["text"], strict=True)]
            yield pa.table({ID: [str(i) for i in chunk["_id"]], TEXT: texts}, schema=CORPUS_SCHEMA)

    return RetrievalData(
        name=f"webfaq:{lang}",
        split=split,
        queries={q: queries[q] for q in queries if q in qrels} or queries,
        qrels=qrels,
        corpus=Corpus(f"webfaq-corpus:{code}", batches),
    )


def positives(qrels: Qrels) -> Qrels:
    """Only the relevant judgements (grade > 0)."""
    return {
        q: {d: g for d, g in docs.items() if g > 0}
        for q, docs in qrels.items()
        if any(g > 0 for g in docs.values())
    }
