"""What an evaluation reads, resolved and fingerprinted: the model, the dataset, and cached encodings.

Encodings are cached under ``<cache>/<kind>-<fingerprint>/vectors/``. The fingerprint covers the model's files
(their content; a hub model's commit), the dataset spec (a local directory's file sizes and times), the split
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

from sembridge_ray.errors import InputError
from sembridge_ray.outputs import SUCCESS, atomic_path, is_complete, write_success
from sembridge_ray.retrieval.store import directory_digest, parquet_files

log = logging.getLogger(__name__)
VECTORS = "vectors"
FIXTURE_PREFIX = "fixture:"
SICK_SPEC = "sick"


def resolve_model(spec: str, cache: Path) -> tuple[str, str]:
    """A model spec -> (what encoder actors load, a fingerprint of its files). A missing model names itself."""
    if spec.startswith(FIXTURE_PREFIX):
        from sembridge_ray.testing import FIXTURES, build_fixture

        name = spec[len(FIXTURE_PREFIX):]
        if name not in FIXTURES:
            raise InputError(f"model {spec!r}: no such fixture (known: {', '.join(FIXTURES)})")
        spec = str(build_fixture(name, cache / "fixtures"))
    path = Path(spec)
    if path.is_dir():
        if not any((path / name).is_file() for name in ("modules.json", "config.json")):
            raise InputError(f"model {spec!r} is not a model directory (no modules.json or config.json)")
        return str(path.resolve()), directory_digest(path)
    if path.exists() or spec.startswith(("/", ".", "~")) or spec.count("/") != 1:
        raise InputError(f"model {spec!r} not found")
    return spec, f"hub:{spec}@{_hub_commit(spec)}"


def _hub_commit(repo: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo)).name  # .../snapshots/<commit>; from the cache when offline
    except Exception as err:  # the hub client raises many types; all mean "cannot have this model"
        raise InputError(f"model {repo!r} not found (not a directory; hub: {type(err).__name__})") from None


def resolve_dataset(spec: str, cache: Path) -> tuple[str, str]:
    """A dataset spec -> (what ``load_retrieval`` reads, a fingerprint). ``sick`` builds the SICK test set as BEIR."""
    if spec == SICK_SPEC:
        from sembridge_ray.data.sick import write_sick_beir
        from sembridge_ray.resources import SICK_DIR

        target = cache / "sick-beir"
        if not (target / "qrels" / "test.tsv").is_file():
            write_sick_beir(SICK_DIR, target)
        return str(target), "sick-beir:v1"
    if Path(spec).is_dir():
        return spec, f"{Path(spec).resolve()}:{directory_digest(Path(spec), contents=False)}"
    return spec, spec


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
