"""What every target shares: the vectors it exports (:class:`Vectors`), the protocol each target
implements (:class:`ExportTarget`: its facts, its :class:`Tolerance`, and ``export``, which builds
it from an :class:`ExportJob` and searches it), an engine's interface (:class:`Engine`), the check
that its Python package is there, and the size of what it wrote."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from urllib.parse import urlsplit

import numpy as np

from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.export.report import ExportReport
from sembridge_ray.retrieval.index import SparseBatch
from sembridge_ray.retrieval.store import parquet_files, read_vectors
from sembridge_ray.runtime.errors import InputError, environment_errno
from sembridge_ray.runtime.progress import Progress

if TYPE_CHECKING:
    from sembridge_ray.data.retrieval import RetrievalData


@dataclass(frozen=True)
class Vectors:
    """Sparse vectors with their ids: ``ids[i]`` is row ``i`` of ``rows`` (CSR, term ids ascending,
    weights > 0)."""

    ids: list[str]
    rows: SparseBatch

    def __post_init__(self) -> None:
        if len(self.ids) != self.rows.rows:
            raise ValueError(f"{len(self.ids)} ids for {self.rows.rows} rows")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def postings(self) -> int:
        return len(self.rows.indices)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        one = self.rows.slice(i, i + 1)
        return one.indices, one.values

    @classmethod
    def read(cls, directory: Path) -> Vectors:
        """The vectors an encoding wrote in ``directory`` (:mod:`sembridge_ray.retrieval.store`)."""
        return cls(*read_vectors(parquet_files(directory)))

    @classmethod
    def from_rows(
        cls, ids: Sequence[str], indices: Sequence[np.ndarray], values: Sequence[np.ndarray]
    ) -> Vectors:
        """Per-row arrays (what :func:`sembridge_ray.sparse.encode.encode_texts` returns) ->
        :class:`Vectors`."""
        indptr = np.zeros(len(indices) + 1, np.int64)
        np.cumsum([len(i) for i in indices], out=indptr[1:])
        # each flattened into its dtype; the empty first array lets an empty batch concatenate
        flat_i, flat_v = (
            np.concatenate([np.zeros(0, dtype), *(np.asarray(a, dtype) for a in arrays)])
            for arrays, dtype in ((indices, np.int32), (values, np.float32))
        )
        return cls(list(ids), SparseBatch(indptr, flat_i, flat_v))


Hits = list[list[str]]
"""Per query, the document ids a target returned, best first."""

Tally = Callable[[int], None]
"""Told how many more documents (a build, an upload) or queries (a search) are done: the job's
progress lines (:class:`sembridge_ray.runtime.progress.Progress`'s ``add``)."""


def untallied(count: int) -> None:
    """No progress kept (a target used outside the job)."""


class Engine(Protocol):
    """An index built by a target, searchable for the parity check."""

    def search(self, queries: Vectors, k: int, tally: Tally = untallied) -> Hits: ...

    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Rates:
    """How fast an embedded engine builds and searches on the project's 2-CPU machine, measured by
    ``benchmarks/export_rates.py`` (each adapter says when), as a cost model of the vectors'
    density: building ``n`` documents of ``p`` postings each takes ``n * (per_doc + per_posting *
    p ** exponent)`` seconds; searching them with ``q`` queries of ``p_q`` postings each takes ``q *
    n * (per_pair + per_merged * (p + p_q))`` (an engine that scores every document against every
    query walks both posting lists of each pair)."""

    build_s_per_doc: float = 0.0
    build_s_per_posting: float = 0.0
    build_exponent: float = 1.0
    """Above 1 where a document's cost grows faster than its postings (Seismic's summaries)."""
    search_s_per_pair: float = 0.0
    search_s_per_merged: float = 0.0

    def seconds(self, docs: Vectors, queries: Vectors) -> tuple[float, float]:
        """(build, search) seconds expected for ``docs`` and ``queries``."""
        n, q = len(docs), len(queries)
        p, p_q = docs.postings / max(n, 1), queries.postings / max(q, 1)
        build = n * (self.build_s_per_doc + self.build_s_per_posting * p**self.build_exponent)
        search = q * n * (self.search_s_per_pair + self.search_s_per_merged * (p + p_q))
        return build, search


@dataclass(frozen=True)
class Package:
    """The Python module a target imports and the pip package that provides it."""

    module: str
    pip: str


def require_package(module: str, package: str, target: str) -> None:
    """InputError naming the pip package when the target's Python module is not installed."""
    if importlib.util.find_spec(module) is None:
        raise InputError(
            f"target {target!r} needs the Python package {package!r}: pip install 'sembridge-ray[export]'"
        )


def require_reachable(url: str, schemes: Sequence[str]) -> None:
    """InputError naming ``url`` unless it is a URL of one of ``schemes`` (the target's client
    takes no other: a typo would fail only after the encoding) and a TCP connection to its host and
    port opens (before any encoding)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is not a number
        port = 0
    if parts.scheme.lower() not in schemes or not parts.hostname or not port:
        forms = " or ".join(f"{scheme}://host:port" for scheme in schemes)
        raise InputError(f"--url {url!r}: not a URL this target takes ({forms})")
    try:
        with socket.create_connection((parts.hostname, port), timeout=3.0):
            pass
    except OSError as err:
        raise InputError(f"--url {url!r}: unreachable ({err.strerror or err})") from None


CLIENT_MODULES = ("qdrant_client", "pymilvus", "grpc", "httpx", "httpcore", "urllib3", "http")
"""Where the errors of the engines' clients and their transports come from."""


@contextlib.contextmanager
def server_errors(url: str, schemes: Sequence[str] = ("http", "https")) -> Iterator[None]:
    """A failure of the server at ``url`` while it is written or searched (it stopped answering
    since the check, or answers as something else) as one InputError naming it; errors of this
    machine (a full disk) and of the code itself pass unchanged, and without ``url`` everything
    does."""
    try:
        yield
    except InputError:
        raise
    except Exception as err:
        if not url or environment_errno(err) is not None or not _from_client(err):
            raise
        require_reachable(url, schemes)  # gone since the check: "unreachable"
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise InputError(
            f"--url {url!r}: the server failed ({type(err).__name__}: {first})"
        ) from err


def _from_client(err: BaseException) -> bool:
    """Whether ``err``, or what it wraps, is a connection error (an OSError: refused, reset, timed
    out, a URLError) or comes from an engine's client."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) or type(current).__module__.split(".")[0] in CLIENT_MODULES:
            return True
        current = current.__cause__ or current.__context__
    return False


TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
)
"""One of these makes a tokenizer (transformers would otherwise build an empty one from the config
alone)."""


def require_tokenizer(model_dir: str) -> None:
    """InputError naming a model directory that holds no tokenizer file (the exported terms need its
    strings)."""
    path = Path(model_dir)
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"model {model_dir!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
        )


def size_on_disk(path: Path) -> int:
    """Bytes of a file, or of every file under a directory."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """What a target's parity (:mod:`sembridge_ray.export.parity`) must reach on the evaluation
    queries, or the export fails (exit 2): an exact target equals the exact top-10 up to ties on
    every query; a quantised or approximate one loses at most its measured share of overlap@10 and
    of nDCG@10 (``docs/export.md`` gives the measurement behind each number); a target that is
    another model (``held`` False) is scored beside the full model, not held to anything."""

    exact: bool = True
    """Whether the target must equal the exact top-10 up to ties on every query."""
    min_overlap: float = 1.0
    """Quantised or approximate targets: the lowest mean overlap@10 accepted."""
    max_ndcg_loss: float = 0.0
    """Quantised or approximate targets: the largest nDCG@10 drop (exact minus target) accepted."""
    held: bool = True
    """False for another model (the doc-only variant): reported, never failed."""

    @classmethod
    def within(cls, min_overlap: float, max_ndcg_loss: float) -> Tolerance:
        return cls(exact=False, min_overlap=min_overlap, max_ndcg_loss=max_ndcg_loss)

    def rule(self) -> dict[str, object]:
        """The tolerance as ``export_report.json`` states it."""
        if not self.held:
            return {"rule": "scored beside the full model, not held to a tolerance (another model)"}
        if self.exact:
            return {"rule": "identical up to ties on every query"}
        return {"min_overlap@10": self.min_overlap, "max_ndcg@10_loss": self.max_ndcg_loss}

    def passes(self, report: ExportReport) -> bool:
        if not self.held:
            return True
        if self.exact:
            return bool(report["identical_up_to_ties"] == 1.0)
        loss = (report["ndcg@10_exact"] or 0.0) - (report["ndcg@10_target"] or 0.0)
        return bool(report["overlap@10"] >= self.min_overlap and loss <= self.max_ndcg_loss + 1e-9)


EXACT = Tolerance()
NOT_HELD = Tolerance(exact=False, held=False)


@dataclass(frozen=True, kw_only=True)
class ExportJob:
    """What a target is built from: the encoded corpus and judged queries, the model they were
    encoded with, and the job's settings; ``log`` is the job's logger, which a target's progress
    lines go to."""

    out: Path
    """The output directory (a target writes under it; its report names paths relative to it)."""
    model: str
    """The SparseEncoder directory the vectors come from."""
    docs: Vectors
    queries: Vectors
    data: RetrievalData
    """The dataset's split (the texts, for targets that encode again)."""
    dataset: str
    """The dataset as given (``--dataset``)."""
    tokenizer_size: int
    url: str = ""
    max_query_length: int = 64
    max_doc_length: int = 256
    threads: int = 0
    """Threads a target's own encoder may use (0: its runtime's default)."""
    k: int = 10
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(__name__))

    @contextlib.contextmanager
    def counted(
        self, what: str, total: int, unit: str, expected_s: float | None = None
    ) -> Iterator[Tally]:
        """Progress lines of the job's (done / total, ETA) while inside, counted by the yielded
        tally; the closing line once the block is done."""
        progress = Progress(self.log, what, total, unit, expected_s=expected_s)
        with progress.watch():
            yield progress.add
        progress.finish()

    def corpus_texts(self) -> dict[str, str]:
        """Document id -> text, for the whole corpus."""
        texts: dict[str, str] = {}
        for batch in self.data.corpus.batches(10_000):
            ids, bodies = batch.column(ID).to_pylist(), batch.column(TEXT).to_pylist()
            texts.update(zip(ids, bodies, strict=True))
        return texts


@dataclass(frozen=True, kw_only=True)
class Exported:
    """A target built and searched: its top-k per query, what the report says about it, and what
    it wrote (its size is reported)."""

    hits: Hits
    details: dict[str, object]
    files: Path


@runtime_checkable
class ExportTarget(Protocol):
    """An export target (``--target NAME``): its facts beside its code, and how it is built.

    The registry (:data:`sembridge_ray.export.targets.TARGETS`) maps each name to the object that
    implements this; the job checks ``package`` and ``schemes`` before it encodes anything, calls
    :meth:`export`, compares the hits with the exact search and holds them to ``tolerance``."""

    @property
    def name(self) -> str:
        """The ``--target`` value."""

    @property
    def summary(self) -> str: ...

    @property
    def package(self) -> Package | None:
        """The Python package it needs beyond the project's (None: none)."""

    @property
    def schemes(self) -> tuple[str, ...]:
        """The URL schemes its client takes for ``--url`` (empty: no server, ``--url`` refused)."""

    @property
    def tolerance(self) -> Tolerance: ...

    def export(self, job: ExportJob) -> Exported:
        """Build the target under ``job.out`` and search it with ``job.queries`` (top ``job.k``)."""
