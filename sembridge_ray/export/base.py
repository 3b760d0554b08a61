"""What every target shares: the vectors it exports (:class:`Vectors`), an engine's interface
(:class:`Engine`), the check that its Python package is there, and the size of what it wrote."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import numpy as np

from sembridge_ray.errors import InputError
from sembridge_ray.retrieval.index import SparseBatch


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
    def from_rows(
        cls, ids: Sequence[str], indices: Sequence[np.ndarray], values: Sequence[np.ndarray]
    ) -> Vectors:
        """Per-row arrays (what :func:`sembridge_ray.sparse.encode.encode_texts` returns) ->
        :class:`Vectors`."""
        indptr = np.zeros(len(indices) + 1, np.int64)
        np.cumsum([len(i) for i in indices], out=indptr[1:])
        flat_i = (
            np.concatenate([np.asarray(i, np.int32) for i in indices])
            if indices
            else np.zeros(0, np.int32)
        )
        flat_v = (
            np.concatenate([np.asarray(v, np.float32) for v in values])
            if values
            else np.zeros(0, np.float32)
        )
        return cls(
            list(ids), SparseBatch(indptr, flat_i.astype(np.int32), flat_v.astype(np.float32))
        )


Hits = list[list[str]]
"""Per query, the document ids a target returned, best first."""


class Engine(Protocol):
    """An index built by a target, searchable for the parity check."""

    def search(self, queries: Vectors, k: int) -> Hits: ...

    def close(self) -> None: ...


def require_package(module: str, package: str, target: str) -> None:
    """InputError naming the pip package when the target's Python module is not installed."""
    if importlib.util.find_spec(module) is None:
        raise InputError(
            f"target {target!r} needs the Python package {package!r}: pip install 'sembridge-ray[export]'"
        )


def require_reachable(url: str, timeout: float = 3.0) -> None:
    """InputError naming ``url`` unless a TCP connection to its host and port opens (before any
    encoding)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname:
        raise InputError(f"--url {url!r}: not a URL (http://host:port)")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            pass
    except OSError as err:
        raise InputError(f"--url {url!r}: unreachable ({err.strerror or err})") from None


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
