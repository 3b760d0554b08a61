"""Progress of the export path (issue 42, point 8): every engine counts the documents it indexes and
the queries it searches as it goes, the job turns the counts into lines with done / total and an
ETA, and a build its measured rates expect to be slow says so, and why, before it starts. No Ray."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.synthetic import sparse_vectors, zipf_probs
from sembridge_ray.export import base, engine
from sembridge_ray.export.base import ExportJob, Rates, Vectors
from sembridge_ray.export.engine import EngineTarget
from sembridge_ray.export.targets import TARGETS
from sembridge_ray.recipes.export import run as driver
from sembridge_ray.runtime.progress import Progress


@pytest.fixture(scope="module")
def corpus() -> tuple[Vectors, Vectors]:
    rng = np.random.default_rng(3)
    probs = zipf_probs(2000, 1.1, rng)
    docs = Vectors([f"d{i}" for i in range(1100)], sparse_vectors(1100, 20, probs, rng))
    return docs, Vectors([f"q{i}" for i in range(150)], sparse_vectors(150, 6, probs, rng))


class Tallies:
    def __init__(self) -> None:
        self.counts: list[int] = []

    def __call__(self, count: int) -> None:
        self.counts.append(count)


def engine_target(name: str) -> EngineTarget:
    """The engine target ``name``, skipped when its package is not installed."""
    found = TARGETS[name]
    assert isinstance(found, EngineTarget) and found.package
    pytest.importorskip(found.package.module)
    return found


BATCHED = {"qdrant": 256, "milvus": 1000, "pisa": 1}
"""Engines that write in batches (documents per batch): counted batch by batch."""


@pytest.mark.parametrize("name", ["qdrant", "milvus", "seismic", "pisa"])
def test_every_engine_counts_what_it_indexed_and_searched(
    name: str, corpus: tuple[Vectors, Vectors], tmp_path: Path
) -> None:
    found = engine_target(name)
    docs, queries = corpus
    indexed, searched = Tallies(), Tallies()
    built, _ = found.build(tmp_path, docs, tally=indexed)
    try:
        built.search(queries, 10, tally=searched)
    finally:
        built.close()
    assert sum(indexed.counts) == len(docs) and sum(searched.counts) == len(queries)
    if name in BATCHED:  # counted as it goes, not once at the end
        per = BATCHED[name]
        assert indexed.counts[0] == per and len(indexed.counts) == -(-len(docs) // per)


def test_a_server_upload_is_sent_in_bounded_requests_and_counted(tmp_path: Path) -> None:
    """The whole bulk file was one request: past the engines' 100 MB request limit for a few
    thousand near-dense documents, and silent while it went."""
    from sembridge_ray.export import lucene

    rng = np.random.default_rng(0)
    probs = zipf_probs(300, 1.0, rng)
    docs = Vectors([f"d{i}" for i in range(200)], sparse_vectors(200, 40, probs, rng))
    vocab = [f"tok{i}" for i in range(300)]
    lucene.write(tmp_path, "elasticsearch", docs, docs, vocab, 10)
    whole = (tmp_path / lucene.BULK).read_text(encoding="utf-8")
    limit = len(whole.encode("utf-8")) // 7
    bodies = list(lucene.bulk_requests(tmp_path / lucene.BULK, limit))
    assert "".join(b for b, _ in bodies) == whole  # every line, in order, once
    assert all(len(b.encode("utf-8")) <= limit for b, _ in bodies) and len(bodies) >= 7
    assert all(b.count("\n") == 2 * n for b, n in bodies) and sum(n for _, n in bodies) == 200


def test_rates_are_the_cost_model_they_state() -> None:
    rng = np.random.default_rng(1)
    probs = zipf_probs(5000, 0.8, rng)
    docs = Vectors([str(i) for i in range(300)], sparse_vectors(300, 200, probs, rng))
    queries = Vectors([str(i) for i in range(40)], sparse_vectors(40, 50, probs, rng))
    rates = Rates(
        build_s_per_doc=1e-3,
        build_s_per_posting=2e-7,
        build_exponent=2.0,
        search_s_per_pair=3e-6,
        search_s_per_merged=4e-7,
    )
    lengths = np.diff(docs.rows.indptr)
    mean_p = lengths.mean()
    build = sum(1e-3 + 2e-7 * mean_p**2 for _ in lengths)
    search = sum(
        3e-6 + 4e-7 * (mean_p + np.diff(queries.rows.indptr).mean())
        for _ in range(len(queries))
        for _ in range(len(docs))
    )
    assert rates.seconds(docs, queries) == pytest.approx((build, search))


@pytest.fixture
def every_add(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The job's progress lines on every count (not every 10 s), so that a test sees them."""

    class Eager(Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "every_s": 0.0})

    monkeypatch.setattr(base, "Progress", Eager)
    yield


def test_the_job_logs_done_total_and_eta_while_an_engine_builds_and_searches(
    corpus: tuple[Vectors, Vectors],
    tmp_path: Path,
    every_add: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = engine_target("qdrant")
    docs, queries = corpus
    job = ExportJob(
        out=tmp_path,
        model="",
        docs=docs,
        queries=queries,
        data=None,  # type: ignore[arg-type]  # an engine reads no text
        dataset="",
        tokenizer_size=0,
        log=driver.log,
    )
    with caplog.at_level(logging.INFO, logger=driver.__name__):
        hits, _ = found.build_and_search(job)
    lines = [r.getMessage() for r in caplog.records]
    assert len(hits) == len(queries)
    assert any(
        line.startswith("qdrant: indexing: 256/1,100 documents (23%)") and "ETA" in line
        for line in lines
    )
    assert any(line.startswith("qdrant: searching: 1/150 queries") for line in lines)
    assert lines[-1].startswith("qdrant: searching: 150 queries in ")


README_SHAPE = (4828, 1200, 1563, 1200)
"""The README's export example: SICK's test corpus and judged queries, encoded by the quick model
(near-dense: about 1,200 active dimensions)."""


def _shaped(rows: int, postings: int) -> Vectors:
    indptr = np.arange(rows + 1, dtype=np.int64) * postings
    indices = np.tile(np.arange(postings, dtype=np.int32), rows)
    from sembridge_ray.retrieval.index import SparseBatch

    batch = SparseBatch(indptr, indices, np.ones(rows * postings, np.float32))
    return Vectors([str(i) for i in range(rows)], batch)


@pytest.mark.parametrize("name", ["qdrant", "milvus", "seismic"])
def test_the_readme_example_says_before_it_starts_that_it_is_slow(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The README's ``--target qdrant`` on the quick model printed nothing for 19 minutes and
    more; a build expected past a minute says how long and why before it starts."""
    found = TARGETS[name]
    assert isinstance(found, EngineTarget) and found.rates
    docs, queries = _shaped(*README_SHAPE[:2]), _shaped(*README_SHAPE[2:])
    build_s, search_s = found.rates.seconds(docs, queries)
    with caplog.at_level(logging.INFO, logger=driver.__name__):
        engine.notice_slow(driver.log, name, found.why_slow, docs, queries, build_s, search_s)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert build_s + search_s > engine.NOTICE_S
    assert line.startswith(f"{name} will take about ") and found.why_slow in line
    assert "4,828 documents of 1,200 postings each, 1,563 queries of 1,200" in line


def test_a_quick_build_says_nothing_in_advance(caplog: pytest.LogCaptureFixture) -> None:
    docs, queries = _shaped(100, 20), _shaped(10, 5)
    with caplog.at_level(logging.INFO, logger=driver.__name__):
        engine.notice_slow(driver.log, "qdrant", "why", docs, queries, 1.0, 2.0)
    assert caplog.records == []


def test_native_output_is_silenced_but_the_jobs_own_lines_come_through(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Seismic and PISA print to descriptors 1 and 2, which the export silences while they build;
    the job's progress lines (to descriptor 2) went to /dev/null with them."""
    from sembridge_ray.export.seismic import quiet

    logger = logging.getLogger("tests.export_progress")
    handler = logging.StreamHandler(os.fdopen(2, "w", closefd=False))  # as the job's, on fd 2
    logger.addHandler(handler)
    logger.propagate = False  # only this handler (earlier tests may leave the root's stale)
    # a library's handler that follows sys.stderr and cannot be pointed elsewhere
    last_resort = logging.lastResort
    assert last_resort is not None
    logging.getLogger("tests.export_progress.library").addHandler(last_resort)
    try:
        with quiet():
            os.write(1, b"native progress on 1\n")
            os.write(2, b"native progress on 2\n")
            logger.warning("indexing: 3/10 documents")
        logger.warning("after")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logging.getLogger("tests.export_progress.library").removeHandler(last_resort)
    out, err = capfd.readouterr()
    assert "native progress" not in out + err
    assert "indexing: 3/10 documents\nafter\n" in err
