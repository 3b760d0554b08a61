"""Exact top-k against PISA and Seismic on two corpora (one process, one thread, interleaved
repeats).

Corpora: ``synthetic`` (:mod:`benchmarks.synthetic`: Zipf terms, uniform weights, adversarial for
pruning) and ``encoder`` (:mod:`benchmarks.corpus`: resampled from the bundled MiniLM SPLADE's
statistics, real queries). Sides: the project's term-major scan
(:func:`~sembridge_ray.retrieval.index.shard_topk`); Seismic's exact scan
(``SeismicDataset.batch_search``) and its approximate index (``SeismicIndex``, recall@10 against the
exact answer printed); PISA through ``pyterrier-pisa`` (the ``bench`` extra): a learned-sparse index
of the documents' weights quantised to integers (``toks_indexer``, scale 100, the PISA default for
learned sparse), searched with MaxScore, block-max WAND and its exhaustive ``ranked_or``; PISA's
top-k is exact on the quantised scores, so its recall@10 against the float answer is printed too.
"""

from __future__ import annotations

import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sembridge_ray.export.seismic import quiet  # native code's progress lines off stdout
from sembridge_ray.retrieval.index import SparseBatch, build_shard, shard_topk

Search = Callable[[], list[list[int]]]


def make_corpus(
    name: str, docs: int, queries: int, seed: int = 0
) -> tuple[SparseBatch, SparseBatch]:
    if name == "encoder":
        from benchmarks.corpus import encoder_corpus

        return encoder_corpus(docs, queries, seed)
    from benchmarks.synthetic import BenchConfig, sparse_vectors, zipf_probs

    cfg = BenchConfig()
    rng = np.random.default_rng(seed)
    probs = zipf_probs(cfg.vocab_size, cfg.zipf_exponent, rng)
    return sparse_vectors(docs, cfg.doc_draws, probs, rng), sparse_vectors(
        queries, cfg.query_draws, probs, rng
    )


def project_sides(docs: SparseBatch, queries: SparseBatch, k: int) -> dict[str, Search]:
    shard = build_shard(docs, np.arange(docs.rows, dtype=np.int64), 30522)

    def scan() -> list[list[int]]:
        return [[int(r) for r in row if r >= 0] for row in shard_topk(shard, queries, k).ranks]

    return {"project_scan": scan}


def seismic_sides(
    docs: SparseBatch, queries: SparseBatch, k: int, approximate: bool = True, exact: bool = True
) -> dict[str, Search]:
    import seismic

    data = seismic.SeismicDataset()
    data.add_documents_by_id(
        [str(i) for i in range(docs.rows)],
        docs.indices.astype(np.int64),
        docs.values.astype(np.float32),
        docs.indptr.astype(np.int64),
    )
    qids = np.array([str(i) for i in range(queries.rows)], dtype=seismic.get_seismic_string())
    comps = [
        np.array(
            [str(t) for t in queries.slice(i, i + 1).indices], dtype=seismic.get_seismic_string()
        )
        for i in range(queries.rows)
    ]
    vals = [queries.slice(i, i + 1).values.astype(np.float32) for i in range(queries.rows)]

    def ids(results: list[list[tuple[str, float, str]]]) -> list[list[int]]:
        # rows come unordered
        by_query = {int(row[0][0]): [int(doc) for _, _, doc in row] for row in results if row}
        return [by_query.get(i, []) for i in range(queries.rows)]

    sides: dict[str, Search] = {}
    if exact:
        sides["seismic_exact"] = lambda: ids(
            data.batch_search(qids, comps, vals, k=k, num_threads=1)
        )
    if approximate:  # clustering the postings takes minutes at 200k documents
        with quiet():  # Seismic's Rust code prints its progress
            index = seismic.SeismicIndex.build_from_dataset(data, num_threads=1)
        sides["seismic_approx"] = lambda: ids(
            index.batch_search(qids, comps, vals, k=k, query_cut=20, heap_factor=0.7, num_threads=1)
        )
    return sides


PISA_SCALE = 100.0
PISA_ALGORITHMS = {
    "pisa_maxscore": "maxscore",
    "pisa_bmw": "block_max_wand",
    "pisa_ranked_or": "ranked_or",
}


def pisa_sides(
    docs: SparseBatch, queries: SparseBatch, k: int, folder: str, names: list[str]
) -> dict[str, Search]:
    """PISA's index of ``docs`` in ``folder`` (built here, not timed) and a search per side in
    ``names`` (keys of :data:`PISA_ALGORITHMS`)."""
    import pandas as pd
    from pyterrier_pisa import PisaIndex

    def toks(batch: SparseBatch, i: int) -> dict[str, float]:
        row = batch.slice(i, i + 1)
        return dict(zip(map(str, row.indices.tolist()), row.values.tolist(), strict=True))

    def documents() -> Iterator[dict[str, object]]:
        for i in range(docs.rows):
            yield {"docno": str(i), "toks": toks(docs, i)}

    index = PisaIndex(folder, stemmer="none", threads=1, overwrite=True)
    with quiet():
        index.toks_indexer(scale=PISA_SCALE).index(documents())
    frame = pd.DataFrame(
        {
            "qid": [str(i) for i in range(queries.rows)],
            "query_toks": [toks(queries, i) for i in range(queries.rows)],
        }
    )

    def side(algorithm: str) -> Search:
        with quiet():  # loading the index for search logs too
            retriever = index.quantized(
                num_results=k, threads=1, query_algorithm=algorithm, toks_scale=PISA_SCALE
            )

        def search() -> list[list[int]]:
            out = retriever.transform(frame)
            ranked = out.sort_values(["qid", "rank"])
            by_query = ranked.groupby("qid")["docno"].apply(lambda d: [int(x) for x in d]).to_dict()
            return [by_query.get(str(i), []) for i in range(queries.rows)]

        return search

    return {name: side(PISA_ALGORITHMS[name]) for name in names}


def _timed_sides(
    sides: dict[str, Search], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[list[int]]]]:
    """Seconds of every run of each side, alternating sides (load elsewhere hits all alike), and
    each answer."""
    times: dict[str, list[float]] = {s: [] for s in sides}
    answers: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for side, search in sides.items():
            start = time.perf_counter()
            answers[side] = search()
            times[side].append(time.perf_counter() - start)
    return times, answers


def recall(got: list[list[int]], exact: list[list[int]]) -> float:
    return float(
        np.mean([len(set(g) & set(e)) / max(1, len(e)) for g, e in zip(got, exact, strict=True)])
    )


SIDES = ("project_scan", "seismic_exact", "seismic_approx", *PISA_ALGORITHMS)
"""Every side; the scan is the exact answer the others are checked against, so it cannot be
skipped."""


def check_skip(skip: frozenset[str]) -> None:
    """``ValueError`` naming any side in ``skip`` that is unknown or is the scan."""
    if bad := sorted(skip - set(SIDES[1:])):
        raise ValueError(
            f"cannot skip {', '.join(bad)}: the sides that can be skipped are {', '.join(SIDES[1:])}"
        )


def compare_corpus(
    name: str,
    docs: int,
    queries: int,
    k: int = 10,
    repeats: int = 2,
    skip: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """One JSON-able line per peer on corpus ``name``: queries/s of both sides, ratio, recall@k of
    approximate ones. ``skip``: sides left out (at 1M documents, Seismic's clustering takes most
    of the time)."""
    check_skip(skip)
    d, q = make_corpus(name, docs, queries)
    sides = project_sides(d, q, k)
    notes = {}
    if importlib.util.find_spec("seismic") is not None:
        sides |= seismic_sides(
            d, q, k, approximate="seismic_approx" not in skip, exact="seismic_exact" not in skip
        )
    else:
        notes["seismic"] = (
            "skipped: pyseismic-lsr is not installed (pip install 'sembridge-ray[bench]')"
        )
    # PISA's index, read while it is timed
    with tempfile.TemporaryDirectory(prefix="pisa-") as folder:
        if importlib.util.find_spec("pyterrier_pisa") is None:
            notes["pisa"] = (
                "skipped: pyterrier-pisa is not installed (pip install 'sembridge-ray[bench]')"
            )
        elif wanted := [a for a in PISA_ALGORITHMS if a not in skip]:
            sides |= pisa_sides(d, q, k, folder, wanted)
        times, answers = _timed_sides(sides, repeats)
    qps = {s: queries / statistics.median(t) for s, t in times.items()}
    exact = answers["project_scan"]
    best = "project_scan"
    lines = [
        {
            "comparison": f"retrieval_{name}_{side}",
            "corpus": name,
            "docs": docs,
            "queries": queries,
            "project": {"side": best, "queries_per_s": round(qps[best], 2)},
            "peer": {
                "side": side,
                "queries_per_s": round(qps[side], 2),
                f"recall@{k}": round(recall(answers[side], exact), 4),
            },
            "throughput_ratio": round(qps[best] / qps[side], 3),
            "identical_to_scan": answers[side] == exact,
        }
        for side in sides
        if side != best
    ]
    return lines + [
        {"comparison": f"retrieval_{name}_{peer}", "note": note} for peer, note in notes.items()
    ]
