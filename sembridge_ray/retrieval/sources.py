"""What an evaluation reads, resolved and fingerprinted: the model, the dataset, and cached encodings.

Encodings are cached under ``<cache>/<kind>-<fingerprint>/vectors/``. The fingerprint covers the model and the
dataset by their identities (:mod:`sembridge_ray.identity`: content, or the run that wrote them), the split
(queries only: one corpus encoding serves every split), the maximum length and the pruning. An entry is complete
when its ``_SUCCESS`` manifest lists every vector file with its size; sizes, not hashes, because hashing a
multi-GB encoding on every rerun would cost more than the check is worth.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sembridge_ray.bundled import resolve
from sembridge_ray.data.retrieval import dataset_identity
from sembridge_ray.errors import InputError
from sembridge_ray.identity import hub_identity, looks_like_hub_id, path_identity
from sembridge_ray.outputs import SUCCESS, atomic_path, is_complete, write_success
from sembridge_ray.retrieval.store import parquet_files

log = logging.getLogger(__name__)
VECTORS = "vectors"


def resolve_model(spec: str) -> tuple[str, str]:
    """A model spec (path, hub id or bundled name) -> (what encoder actors load, its identity). A missing model
    names itself."""
    path = Path(resolve(spec)).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in ("modules.json", "config.json")):
            raise InputError(f"model {spec!r} is not a model directory (no modules.json or config.json)")
        return str(path.resolve()), path_identity(path)
    if path.exists() or not looks_like_hub_id(spec):
        raise InputError(f"model {spec!r} not found")
    return spec, hub_identity(spec)


def resolve_dataset(spec: str) -> tuple[str, str]:
    """A dataset spec -> (what ``load_retrieval`` reads, its identity); ``sick`` is the bundled SICK retrieval set."""
    spec = resolve(spec)
    return spec, dataset_identity(spec)


def cached(entry: Path, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, bool]:
    """The vectors of a cache entry, built by ``build(tmp)`` (writing ``tmp/vectors``) unless complete already.

    Returns (vectors directory, whether it came from the cache).
    """
    if cache_ready(entry):
        log.info("encodings from the cache: %s", entry)
        return entry / VECTORS, True
    with atomic_path(entry) as tmp:
        tmp.mkdir(parents=True)
        info = build(tmp)
        (tmp / VECTORS).mkdir(exist_ok=True)
        write_success(tmp, exclude=(VECTORS,), sizes=_sizes(tmp), **info)
    return entry / VECTORS, False


def cache_ready(entry: Path) -> bool:
    if not is_complete(entry):
        return False
    manifest = json.loads((entry / SUCCESS).read_text(encoding="utf-8"))
    return manifest.get("sizes") == _sizes(entry)


def _sizes(entry: Path) -> dict[str, int]:
    return {str(p.relative_to(entry)): p.stat().st_size for p in parquet_files(entry / VECTORS)}
