"""Output directories that never look complete when they are not.

Artefacts are written to a temporary name in the same directory and renamed into place. A ``_SUCCESS`` manifest
with the sha256 of every artefact is written last; a rerun skips a directory whose manifest verifies and redoes
one without it (or whose files changed since).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SUCCESS = "_SUCCESS"
_TMP_PREFIX = ".tmp-"
log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (file or directory) and rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if tmp.is_dir() and path.is_dir():
            _remove(path)  # os.replace cannot replace a non-empty directory
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _artefacts(out_dir: Path, exclude: tuple[str, ...]) -> list[Path]:
    files = []
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir)
        if not path.is_file() or rel.name == SUCCESS or any(p.startswith(_TMP_PREFIX) for p in rel.parts):
            continue
        if rel.parts[0] in exclude:
            continue
        files.append(path)
    return files


def write_success(out_dir: Path, exclude: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """Write the ``_SUCCESS`` manifest (checksums of every artefact but the ``exclude`` subdirs), last."""
    out_dir = Path(out_dir)
    files = {str(p.relative_to(out_dir)): sha256_file(p) for p in _artefacts(out_dir, exclude)}
    manifest = {"files": files, "exclude": list(exclude), "finished_at": time.time(), **extra}
    atomic_write_json(out_dir / SUCCESS, manifest)
    return manifest


def is_complete(out_dir: Path) -> bool:
    """True when ``_SUCCESS`` exists and every artefact it lists is present with the same checksum."""
    manifest_path = Path(out_dir) / SUCCESS
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for rel, digest in files.items():
        path = Path(out_dir) / rel
        if not path.is_file() or sha256_file(path) != digest:
            log.warning("%s: %s changed or is missing; the directory will be redone", out_dir, rel)
            return False
    return True


def start_output(out_dir: Path) -> Path:
    """Create ``out_dir`` for a (re)run: drop a stale ``_SUCCESS`` so partial output never looks complete."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUCCESS).unlink(missing_ok=True)
    return out_dir
