"""The ``_SUCCESS`` manifest of an output directory: the sha256 of every artefact and the run's
fingerprint, written last; reading and verifying it; and the fingerprint of a finished output as an
input identity.

It knows files and JSON only (no run identities, locks or claims: :mod:`sembridge_ray.runtime.outputs`
builds on it), so :mod:`sembridge_ray.runtime.identity` can ask it whether a path is a finished output of
this project."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from sembridge_ray.runtime.atomic import TMP_PREFIX, atomic_write_json, sha256_file
from sembridge_ray.runtime.locks import LOCK

SUCCESS = "_SUCCESS"
IDENTITY = "identity.json"
log = logging.getLogger(__name__)


class Manifest(TypedDict):
    """``_SUCCESS``, in its key order; a run may add keys of its own after these
    (``write_success``'s extras)."""

    files: dict[str, str]
    """Relative path -> sha256 of every artefact."""
    exclude: list[str]
    finished_at: float
    job: NotRequired[str]
    fingerprint: NotRequired[str]
    """The run's, from ``identity.json``, when it has one."""


def _artefacts(out_dir: Path, exclude: tuple[str, ...]) -> list[Path]:
    files = []
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir)
        skipped = rel.name == SUCCESS or any(p.startswith(TMP_PREFIX) for p in rel.parts)
        if rel.parts[0] in exclude or rel.as_posix() in exclude or rel.parts[0].startswith(LOCK):
            skipped = True
        if path.is_file() and not skipped:
            files.append(path)
    return files


def _umask() -> int:
    try:  # thread-safe where /proc has it; os.umask() must set a value to read one
        line = next(
            x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Umask:")
        )
        return int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def publish(out_dir: Path, files: list[Path]) -> None:
    """Give ``files`` and the directories between them and ``out_dir`` the modes the umask
    allows."""
    mask = _umask()
    dirs = {out_dir}
    for path in files:
        path.chmod((0o777 if path.stat().st_mode & stat.S_IXUSR else 0o666) & ~mask)
        dirs.update(p for p in path.parents if p.is_relative_to(out_dir))
    for directory in dirs:
        directory.chmod(0o777 & ~mask)


def write_success(out_dir: Path, exclude: tuple[str, ...] = (), **extra: object) -> Manifest:
    """Publish every artefact (but the ``exclude`` subdirs and relative file paths, e.g. a run's
    checkpoints and caches) and write the ``_SUCCESS`` manifest of their checksums,
    last. The run's fingerprint comes from ``identity.json`` when the run has one."""
    out_dir = Path(out_dir)
    artefacts = _artefacts(out_dir, exclude)
    if not artefacts:  # read_manifest would not take it: a run that wrote nothing is not complete
        raise RuntimeError(f"{out_dir}: no artefact to list in {SUCCESS}")
    publish(out_dir, artefacts)
    files = {str(p.relative_to(out_dir)): sha256_file(p) for p in artefacts}
    manifest: Manifest = {"files": files, "exclude": list(exclude), "finished_at": time.time()}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # no run identity
        data = json.loads((out_dir / IDENTITY).read_text(encoding="utf-8"))
        manifest |= {"job": str(data["job"]), "fingerprint": str(data["fingerprint"])}
    # a Manifest with the run's extra keys after its own
    written = cast(Manifest, {**manifest, **extra})
    atomic_write_json(out_dir / SUCCESS, written)
    (out_dir / SUCCESS).chmod(0o666 & ~_umask())
    return written


def read_manifest(out_dir: Path) -> Manifest | None:
    """The ``_SUCCESS`` of ``out_dir``, or None when it is missing, unreadable or lists no files."""
    try:
        manifest = json.loads((Path(out_dir) / SUCCESS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    # an empty list is no manifest: every job writes artefacts, so a _SUCCESS naming none vouches
    # for nothing
    if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) and manifest["files"]:
        return cast(Manifest, manifest)  # written by write_success; only its file list is relied on
    return None


def is_complete(out_dir: Path) -> bool:
    """True when ``_SUCCESS`` exists and every artefact it lists is present with the same
    checksum."""
    manifest = read_manifest(out_dir)
    if manifest is None:
        return False
    for rel, digest in manifest["files"].items():
        path = Path(out_dir) / rel
        if not path.is_file() or sha256_file(path) != digest:
            log.warning(
                "%s: %s changed or is missing; the directory no longer counts as complete",
                out_dir,
                rel,
            )
            return False
    return True


def output_fingerprint(path: Path) -> str | None:
    """``run:<job>:<fingerprint>[/<sub>]`` when ``path`` is a complete output of this project or a
    folder listed in one (an init output's ``model/``); None otherwise."""
    path = Path(path)
    for root, sub in ((path, ""), (path.parent, path.name)):
        manifest = read_manifest(root)
        if not manifest or "fingerprint" not in manifest:
            continue
        if sub and not any(f.startswith(sub + "/") for f in manifest["files"]):
            continue
        if is_complete(root):
            return f"run:{manifest.get('job', '')}:{manifest['fingerprint']}" + (
                f"/{sub}" if sub else ""
            )
    return None
