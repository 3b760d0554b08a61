"""What an evaluation reads, resolved and fingerprinted: the model, the dataset, and cached
encodings.

Encodings are cached under ``<cache>/<kind>-<fingerprint>/vectors/``. The fingerprint covers the
model and the dataset by their identities (:mod:`sembridge_ray.runtime.identity`: content, or the run that
wrote them), the split (of the queries; of the corpus only where each split has its own,
``registry.corpus_split``), the maximum length and the pruning. Each entry is a
:mod:`sembridge_ray.cache` entry: its manifest holds the sha256 of every vector file, checked on
every reuse before the files are served (streamed, at about 0.9 GB/s here: about a second per GB of
encodings, against the minutes to hours of encoding it saves), so a damaged encoding is set aside
and re-encoded rather than searched. Two evaluations of the same model and corpus that encode at
once publish one entry and both use it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from sembridge_ray import cache
from sembridge_ray.bundled import resolve
from sembridge_ray.data.registry import dataset_identity
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import hub_identity, looks_like_hub_id, path_identity
from sembridge_ray.sparse.model import check_mlm

log = logging.getLogger(__name__)
VECTORS, INFO = "vectors", "info.json"


def resolve_model(spec: str, trust_remote_code: bool = False) -> tuple[str, str]:
    """A model spec (path, hub id or bundled name) -> (what encoder actors load, its identity). A
    missing model names itself."""
    path = Path(resolve(spec)).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in ("modules.json", "config.json")):
            raise InputError(
                f"model {spec!r} is not a model directory (no modules.json or config.json)"
            )
        check_mlm(str(path), trust_remote_code)
        return str(path.resolve()), path_identity(path)
    if path.exists() or not looks_like_hub_id(spec):
        raise InputError(f"model {spec!r} not found")
    return spec, hub_identity(spec)


def resolve_dataset(spec: str) -> tuple[str, str]:
    """A dataset spec -> (what ``load_retrieval`` reads, its identity); ``sick`` is the bundled SICK
    retrieval set."""
    spec = resolve(spec)
    return spec, dataset_identity(spec)


def cached(entry: Path, build: Callable[[Path], Mapping[str, object]]) -> tuple[Path, bool]:
    """The vectors of a cache entry, built by ``build(tmp)`` (writing ``tmp/vectors``; its result is
    kept in the entry's ``info.json``) unless a verified entry is there already.

    Returns (vectors directory, whether it came from the cache).
    """

    def write(tmp: Path) -> Path:
        tmp.mkdir(parents=True)
        info = build(tmp)
        (tmp / VECTORS).mkdir(exist_ok=True)
        (tmp / INFO).write_text(json.dumps(info, sort_keys=True) + "\n", encoding="utf-8")
        return entry / VECTORS

    vectors, hit = cache.fetch(entry, lambda found: found.path / VECTORS, write, "encode cache")
    if hit:
        log.info("encodings from the cache: %s", entry)
    return vectors, hit


def cache_ready(entry: Path) -> bool:
    """Whether ``entry`` holds encodings that verify (a bad entry is moved aside, with a
    warning)."""
    return cache.load(entry, lambda found: True, "encode cache") is not None
