"""OpenSearch and Elasticsearch: the index mapping, the bulk NDJSON and the search bodies, as files;
``url`` pushes them to a running server and searches there.

- ``elasticsearch``: a ``sparse_vector`` field keyed by token strings. Elasticsearch reads a ``.``
  in a key as an object path, so keys are escaped: ``%`` -> ``%25``, then ``.`` -> ``%2E``
  (:func:`escape`; :func:`unescape` undoes it; ``##ing``, ``▁de`` and CJK tokens pass unchanged).
  Query: ``sparse_vector`` with ``query_vector``.
- ``opensearch``: a ``rank_features`` field keyed by the same escaped token strings; query:
  ``neural_sparse`` with ``query_tokens``.
- ``opensearch-sparse-vector`` (OpenSearch 3.3+): a ``sparse_vector`` field (SEISMIC) keyed by the
  term id as a string; weights above the ingest ceiling (``quantization_ceiling_ingest``,
  :data:`CEILING_INGEST` as OpenSearch's default) are clipped to it here, as the engine would, and
  queries at the search ceiling.

Weights are positive finite float32; the token-string targets keep 9 significant bits of a weight,
which the parity without a server reproduces (:func:`stored`); with ``url``, the server's own answer
is compared instead."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sembridge_ray.export.base import (
    Exported,
    ExportJob,
    Hits,
    Package,
    Tally,
    Tolerance,
    Vectors,
    server_errors,
    untallied,
)
from sembridge_ray.export.parity import exact_topk, width_of
from sembridge_ray.runtime.errors import InputError

INDEX, FIELD = "sembridge", "sparse"
MAPPING, BULK, SEARCHES = "mapping.json", "bulk.ndjson", "searches.ndjson"
CEILING_INGEST, CEILING_SEARCH = 3.0, 16.0
FLOAT_MIN_NORMAL = float(np.finfo(np.float32).tiny)
BULK_BYTES = 10 << 20
"""The largest ``_bulk`` request sent: Elasticsearch advises requests of a few to tens of MB, and
both engines refuse one above ``http.max_content_length`` (100 MB by default), which the bulk file
of a few thousand near-dense documents passes."""
SEARCH_BATCH = 100
"""Queries per ``_msearch`` request."""


def escape(token: str) -> str:
    return token.replace("%", "%25").replace(".", "%2E")


def unescape(name: str) -> str:
    return name.replace("%2E", ".").replace("%25", "%")


class TokenKeys:
    """Keys are the escaped token strings (:func:`escape`); the engine keeps 9 significant bits of
    a weight (Lucene's ``FeatureField``: the float's bits shifted right by 15), and no ceiling."""

    ceiling_ingest = ceiling_search = math.inf

    def names(self, vocab: list[str]) -> list[str]:
        names = [escape(t) for t in vocab]
        if "" in names:
            raise InputError(
                f"the tokenizer has an empty token (id {names.index('')}): no engine accepts it"
            )
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InputError(
                f"the tokenizer has token {unescape(dup)!r} twice: the features would merge"
            )
        return names

    def key_problems(self, key: str) -> list[str]:
        return [f"feature name {key!r}"] if not key or "." in key else []

    def stored(self, vectors: Vectors) -> Vectors:
        bits = vectors.rows.values.astype(np.float32).view(np.int32)
        kept = ((bits >> 15) << 15).view(np.float32)
        return Vectors(vectors.ids, vectors.rows._replace(values=kept))

    details: ClassVar[dict[str, object]] = {
        "keys": "token strings, '%' -> '%25' then '.' -> '%2E'",
        "precision": "9 significant bits",
    }


class TermIdKeys:
    """Keys are the term ids as strings; weights are clipped at the ingest ceiling (queries at the
    search ceiling), as OpenSearch's ``sparse_vector`` would, and kept as written."""

    ceiling_ingest, ceiling_search = CEILING_INGEST, CEILING_SEARCH

    def names(self, vocab: list[str]) -> list[str]:
        return [str(i) for i in range(len(vocab))]

    def key_problems(self, key: str) -> list[str]:
        named = [f"feature name {key!r}"] if not key else []
        return named + ([] if key.isdigit() else [f"key {key!r} is not a term id"])

    def stored(self, vectors: Vectors) -> Vectors:
        return vectors

    details: ClassVar[dict[str, object]] = {
        "keys": "term ids as strings",
        "ceiling_ingest": CEILING_INGEST,
        "ceiling_search": CEILING_SEARCH,
    }


def features(
    target: str, names: list[str], terms: np.ndarray, weights: np.ndarray, query: bool
) -> dict[str, float]:
    """One vector as the target's key -> weight object (weights below float32's smallest normal are
    left out: Lucene rejects them)."""
    keys = _BY_NAME[target].keys
    keep = weights >= FLOAT_MIN_NORMAL
    values = np.minimum(
        weights[keep].astype(np.float64), keys.ceiling_search if query else keys.ceiling_ingest
    )
    return {names[t]: float(v) for t, v in zip(terms[keep].tolist(), values.tolist(), strict=True)}


def search_lines(
    target: str, names: list[str], queries: Vectors, chosen: range, k: int, ensure_ascii: bool
) -> Iterator[str]:
    """The ``_msearch`` lines of the queries ``chosen``: a header, then the search body."""
    for i in chosen:
        vector = features(target, names, *queries.row(i), query=True)
        body = {"size": k, "_source": False, "query": _BY_NAME[target].query(vector, k)}
        yield f"{json.dumps({'index': INDEX})}\n{json.dumps(body, ensure_ascii=ensure_ascii)}\n"


def bulk_lines(target: str, names: list[str], docs: Vectors) -> Iterator[str]:
    for i, doc_id in enumerate(docs.ids):
        yield json.dumps({"index": {"_index": INDEX, "_id": doc_id}}, ensure_ascii=False) + "\n"
        source = {FIELD: features(target, names, *docs.row(i), query=False)}
        yield json.dumps(source, ensure_ascii=False) + "\n"


def write(
    out: Path, target: str, docs: Vectors, queries: Vectors, vocab: list[str], k: int
) -> dict[str, object]:
    """mapping.json, bulk.ndjson (``_bulk``) and searches.ndjson (``_msearch``, one body per query)
    in ``out``."""
    found = _BY_NAME[target]
    names = found.keys.names(vocab)
    out.mkdir(parents=True, exist_ok=True)
    (out / MAPPING).write_text(json.dumps(found.mapping(), indent=2) + "\n", encoding="utf-8")
    with open(out / BULK, "w", encoding="utf-8") as fh:
        fh.writelines(bulk_lines(target, names, docs))
    with open(out / SEARCHES, "w", encoding="utf-8") as fh:
        fh.writelines(search_lines(target, names, queries, range(len(queries)), k, False))
    details: dict[str, object] = {
        "index": INDEX,
        "field": FIELD,
        "files": [MAPPING, BULK, SEARCHES],
    }
    return details | found.keys.details


def validate(path: Path, target: str) -> list[str]:
    """Problems of a bulk NDJSON file under the engine's field rules ([] = none): action/source line
    pairs, keys non-empty (no ``.`` for token strings; decimal ids for
    ``opensearch-sparse-vector``), weights positive finite (at most the ingest ceiling for
    ``opensearch-sparse-vector``)."""
    keys = _BY_NAME[target].keys
    problems: list[str] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) % 2:
        problems.append(f"{len(lines)} lines: not action/source pairs")
    for n in range(0, len(lines) - 1, 2):
        action, source = json.loads(lines[n]), json.loads(lines[n + 1])
        if set(action) != {"index"} or not action["index"].get("_id"):
            problems.append(f"line {n + 1}: not an index action with an _id")
        vector = source.get(FIELD)
        if not isinstance(vector, dict):
            problems.append(f"line {n + 2}: no {FIELD!r} object")
            continue
        for key, weight in vector.items():
            problems += [f"line {n + 2}: {problem}" for problem in keys.key_problems(key)]
            if not (isinstance(weight, float | int) and math.isfinite(weight) and weight > 0):
                problems.append(
                    f"line {n + 2}: weight {weight!r} of {key!r} is not positive finite"
                )
            elif weight > keys.ceiling_ingest:
                problems.append(
                    f"line {n + 2}: weight {weight!r} of {key!r} above the ceiling "
                    f"{keys.ceiling_ingest}"
                )
    return problems


def from_features(
    ids: list[str], vectors: list[dict[str, float]], target: str, vocab: list[str]
) -> Vectors:
    """Key -> weight objects back to vectors (term ids ascending)."""
    lookup = {name: i for i, name in enumerate(_BY_NAME[target].keys.names(vocab))}
    indices, values = [], []
    for vector in vectors:
        pairs = sorted((lookup[k], w) for k, w in vector.items())
        indices.append(np.array([t for t, _ in pairs], np.int32))
        values.append(np.array([w for _, w in pairs], np.float32))
    return Vectors.from_rows(ids, indices, values)


def read_bulk(path: Path, target: str, vocab: list[str]) -> Vectors:
    """A bulk NDJSON file back to vectors: the round trip of :func:`write`."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    ids = [action["index"]["_id"] for action in lines[::2]]
    return from_features(ids, [source[FIELD] for source in lines[1::2]], target, vocab)


def stored(target: str, vectors: Vectors) -> Vectors:
    """The vectors as the engine keeps them (``TokenKeys``/``TermIdKeys.stored``)."""
    return _BY_NAME[target].keys.stored(vectors)


class FilesEngine:
    """Parity without a server: the bulk file read back, stored as the engine stores it, searched
    exactly."""

    def __init__(self, docs: Vectors, target: str, vocab: list[str]) -> None:
        self.docs, self.target, self.vocab = docs, target, vocab

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits:
        names = _BY_NAME[self.target].keys.names(self.vocab)
        bodies = [  # the queries as their bodies carry them
            features(self.target, names, *queries.row(i), query=True) for i in range(len(queries))
        ]
        asked = from_features(queries.ids, bodies, self.target, self.vocab)
        found = exact_topk(self.docs, asked, k)
        tally(len(queries))
        return found

    def close(self) -> None:
        pass


class ServerEngine:
    """Parity against a running server: the search bodies sent to ``_msearch``, the hits' ``_id``s
    read back."""

    def __init__(self, url: str, target: str, vocab: list[str]) -> None:
        self.url, self.target, self.vocab = url.rstrip("/"), target, vocab

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits:
        names = _BY_NAME[self.target].keys.names(self.vocab)
        out: Hits = []
        for start in range(0, len(queries), SEARCH_BATCH):
            chosen = range(start, min(start + SEARCH_BATCH, len(queries)))
            body = "".join(search_lines(self.target, names, queries, chosen, k, True))
            answer = request(self.url + "/_msearch", body, "application/x-ndjson")
            out += [
                [str(h["_id"]) for h in r.get("hits", {}).get("hits", [])]
                for r in answer["responses"]
            ]
            tally(len(chosen))
        return out

    def close(self) -> None:
        pass


def request(
    url: str, body: str | None, content_type: str = "application/json", method: str = "POST"
) -> Any:
    data = None if body is None else body.encode("utf-8")
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": content_type}
    )
    with urllib.request.urlopen(req, timeout=120) as response:
        return json.loads(response.read().decode("utf-8") or "null")


def push(out: Path, url: str, tally: Tally = untallied) -> None:
    """Create the index from mapping.json (an existing one is deleted first), send bulk.ndjson
    (in requests of at most :data:`BULK_BYTES`), refresh."""
    base = url.rstrip("/")
    try:
        request(f"{base}/{INDEX}", None, method="DELETE")
    except urllib.error.HTTPError as err:
        if err.code != 404:
            raise
    request(f"{base}/{INDEX}", (out / MAPPING).read_text(encoding="utf-8"), method="PUT")
    for body, docs in bulk_requests(out / BULK):
        result = request(f"{base}/_bulk", body, "application/x-ndjson")
        if result.get("errors"):
            first = next(i for i in result["items"] if "error" in next(iter(i.values())))
            raise InputError(
                f"--url {url!r}: the bulk request was refused: {json.dumps(first)[:300]}"
            )
        tally(docs)
    request(f"{base}/{INDEX}/_refresh", None)


def bulk_requests(path: Path, limit: int = BULK_BYTES) -> Iterator[tuple[str, int]]:
    """The bulk file as request bodies of whole (action, source) pairs, each at most ``limit``
    bytes (or one pair, when a pair alone is larger), with the number of documents in each."""
    body: list[str] = []
    size = 0
    with open(path, encoding="utf-8") as fh:
        for action in fh:
            pair = action + fh.readline()
            grown = size + len(pair.encode("utf-8"))
            if body and grown > limit:
                yield "".join(body), len(body)
                body, grown = [], len(pair.encode("utf-8"))
            body.append(pair)
            size = grown
    if body:
        yield "".join(body), len(body)


def build(
    out: Path,
    target: str,
    docs: Vectors,
    queries: Vectors,
    vocab: list[str],
    k: int,
    url: str = "",
    tally: Tally = untallied,
) -> tuple[FilesEngine | ServerEngine, dict[str, object]]:
    """The files in ``out/<target>``, pushed to ``url`` when given (``tally`` counts the documents
    uploaded, or written)."""
    folder = out / target
    details = write(folder, target, docs, queries, vocab, k)
    if problems := validate(folder / BULK, target):
        raise ValueError(f"{folder / BULK}: {problems[0]} ({len(problems)} problems)")
    if url:
        push(folder, url, tally)
        return ServerEngine(url, target, vocab), details | {"url": url}
    tally(len(docs))
    return FilesEngine(
        stored(target, read_bulk(folder / BULK, target, vocab)), target, vocab
    ), details


def vocabulary(model: str, width: int) -> list[str]:
    """Token strings of term ids 0..width-1 from the model's (target) tokenizer; an id past the
    tokenizer (a padded vocabulary) is ``[unused-id-N]``."""
    from sembridge_ray.sparse.model import load_tokenizer

    tokenizer = load_tokenizer(model)
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(size, width))))
    return [str(t) for t in tokens] + [f"[unused-id-{i}]" for i in range(size, width)]


@dataclass(frozen=True, kw_only=True)
class FilesTarget:
    """One of the server targets (its name is its index flavour in the functions above) as an
    :class:`~sembridge_ray.export.base.ExportTarget`: the files written under ``<output>/<name>``,
    pushed to ``--url`` when given."""

    name: str
    summary: str
    tolerance: Tolerance
    keys: TokenKeys | TermIdKeys
    field: dict[str, object]
    """The field's mapping (``mapping.json``)."""
    query: Callable[[dict[str, float], int], dict[str, object]]
    """A query vector (key -> weight) and k -> the search body's ``query``."""
    settings: dict[str, object] | None = None
    """The index's settings in ``mapping.json``, if any."""
    package: Package | None = None
    schemes: tuple[str, ...] = ("http", "https")

    def mapping(self) -> dict[str, object]:
        index: dict[str, object] = {"settings": self.settings} if self.settings else {}
        return index | {"mappings": {"properties": {FIELD: self.field}}}

    def export(self, job: ExportJob) -> Exported:
        docs, queries = job.docs, job.queries
        width = max(job.tokenizer_size, width_of(docs, queries))
        with server_errors(job.url, self.schemes):
            doing = "uploading" if job.url else "writing the files"
            with job.counted(f"{self.name}: {doing}", len(docs), "documents") as sent:
                vocab = vocabulary(job.model, width)
                files, details = build(
                    job.out, self.name, docs, queries, vocab, job.k, job.url, sent
                )
            with job.counted(f"{self.name}: searching", len(queries), "queries") as searched:
                hits = files.search(queries, job.k, tally=searched)
        return Exported(hits=hits, details=details, files=job.out / self.name)


_SEISMIC = {
    "name": "seismic",
    "parameters": {
        "quantization_ceiling_ingest": CEILING_INGEST,
        "quantization_ceiling_search": CEILING_SEARCH,
    },
}

TARGETS = (
    FilesTarget(
        name="opensearch",
        summary="OpenSearch rank_features: mapping, bulk NDJSON (token strings), "
        "neural_sparse query body",
        tolerance=Tolerance.within(min_overlap=0.97, max_ndcg_loss=0.01),
        keys=TokenKeys(),
        field={"type": "rank_features"},
        query=lambda vector, k: {"neural_sparse": {FIELD: {"query_tokens": vector}}},
    ),
    FilesTarget(
        name="opensearch-sparse-vector",
        summary="OpenSearch 3.3+ sparse_vector: ids as strings, weights clipped at the ingest "
        "ceiling",
        tolerance=Tolerance.within(min_overlap=0.9, max_ndcg_loss=0.03),
        keys=TermIdKeys(),
        field={"type": "sparse_vector", "method": _SEISMIC},
        query=lambda vector, k: {
            "neural_sparse": {FIELD: {"query_tokens": vector, "method_parameters": {"k": k}}}
        },
        settings={"index": {"sparse": True}},
    ),
    FilesTarget(
        name="elasticsearch",
        summary="Elasticsearch sparse_vector: mapping, bulk NDJSON (token strings, '.' escaped), "
        "query body",
        tolerance=Tolerance.within(min_overlap=0.97, max_ndcg_loss=0.01),
        keys=TokenKeys(),
        field={"type": "sparse_vector"},
        query=lambda vector, k: {"sparse_vector": {"field": FIELD, "query_vector": vector}},
    ),
)


_BY_NAME = {found.name: found for found in TARGETS}
