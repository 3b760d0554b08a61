"""The targets that are an index searched in this process or on a server (``qdrant``, ``milvus``,
``seismic``, ``pisa``): one :class:`EngineTarget` per engine module, which gives its ``build``
(``build(out, docs, url, tally) -> (Engine, details)``), where it writes, and how fast it is."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sembridge_ray.export.base import (
    EXACT,
    Engine,
    Exported,
    ExportJob,
    Hits,
    Package,
    Rates,
    Tally,
    Tolerance,
    Vectors,
    server_errors,
    untallied,
)
from sembridge_ray.runtime.progress import duration

NOTICE_S = 60.0
"""An embedded engine expected to take longer than this (build and search) says so, and why, before
it starts."""


class BuildEngine(Protocol):
    def __call__(
        self, out: Path, docs: Vectors, url: str = "", tally: Tally = untallied
    ) -> tuple[Engine, dict[str, object]]: ...


@dataclass(frozen=True, kw_only=True)
class EngineTarget:
    """An engine as an :class:`~sembridge_ray.export.base.ExportTarget`."""

    name: str
    summary: str
    package: Package | None
    build: BuildEngine
    location: str
    """What it writes under the output directory (embedded)."""
    schemes: tuple[str, ...] = ()
    tolerance: Tolerance = EXACT
    rates: Rates | None = None
    """Its measured speed embedded (None: fast enough never to warn)."""
    why_slow: str = ""

    def export(self, job: ExportJob) -> Exported:
        with server_errors(job.url, self.schemes):
            hits, details = self.build_and_search(job)
        return Exported(hits=hits, details=details, files=job.out / self.location)

    def build_and_search(self, job: ExportJob) -> tuple[Hits, dict[str, object]]:
        """Build the engine and search it, with progress lines (done / total, ETA) at least every
        :data:`~sembridge_ray.runtime.progress.EVERY_S` seconds, after a line saying how long an embedded
        engine will take when its measured :attr:`rates` make that long."""
        docs, queries = job.docs, job.queries
        build_s: float | None = None
        search_s: float | None = None
        if self.rates is not None and not job.url:
            build_s, search_s = self.rates.seconds(docs, queries)
            notice_slow(job.log, self.name, self.why_slow, docs, queries, build_s, search_s)
        with job.counted(f"{self.name}: indexing", len(docs), "documents", build_s) as built:
            engine, details = self.build(job.out, docs, job.url, tally=built)
        try:
            with job.counted(f"{self.name}: searching", len(queries), "queries", search_s) as done:
                hits = engine.search(queries, job.k, tally=done)
        finally:
            engine.close()
        return hits, details


def close_on_error(engine: Engine, fill: Callable[[], object]) -> None:
    """``fill()``, the build's indexing into ``engine``; should it fail, ``engine`` closed (an
    embedded engine's file closed, its lock released) before the error goes up."""
    try:
        fill()
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the build is the one to see
            engine.close()
        raise


def notice_slow(
    log: logging.Logger,
    name: str,
    why: str,
    docs: Vectors,
    queries: Vectors,
    build_s: float,
    search_s: float,
) -> None:
    """One line, before a build its measured rates expect to take longer than :data:`NOTICE_S`:
    how long and why."""
    if build_s + search_s <= NOTICE_S:
        return
    log.warning(
        "%s will take about %s here (%s to build, %s to search): %s documents of %s postings each, "
        "%s queries of %s, at the rates measured for it; %s (a server through --url, or "
        "--target pisa, is much faster)",
        name,
        duration(build_s + search_s),
        duration(build_s),
        duration(search_s),
        f"{len(docs):,}",
        f"{docs.postings / max(len(docs), 1):,.0f}",
        f"{len(queries):,}",
        f"{queries.postings / max(len(queries), 1):,.0f}",
        why,
    )
