"""The output contract every job and every stage of ``jobs.reproduce`` follows.

- **Atomic artefacts.** Files and directories are written to a temporary sibling and renamed into place.
- **A run's identity.** ``identity.json``, written when a run starts, holds its
  :class:`~sembridge_ray.identity.RunIdentity` (the settings and inputs that shape the result, and their fingerprint).
- **A manifest, last.** ``_SUCCESS`` lists the sha256 of every artefact and the run's fingerprint; a directory is
  complete only when every listed file is present with the same checksum.
- **Reruns.** :func:`claim_output` decides: same fingerprint and a verifying manifest -> skip; an unfinished run
  with the same fingerprint -> resume; other settings -> refuse, naming the keys that differ (old → new), and leave
  the directory untouched, unless ``overwrite`` (then start from scratch). Paths are not part of the identity, so a
  finished output that was moved or copied still skips.
- **One writer.** The claim holds the directory's lock (:mod:`sembridge_ray.locks`) while the run writes.
- **Readable artefacts.** The manifest step gives every artefact the permissions the umask allows (0644 / 0755
  under the usual 022), whatever the library that wrote it chose (safetensors, tempfile: 0600).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sembridge_ray.errors import InputError, environment_errno
from sembridge_ray.identity import RunIdentity
from sembridge_ray.locks import LOCK, OutputLock, check_unlocked

SUCCESS = "_SUCCESS"
IDENTITY = "identity.json"
_TMP_PREFIX = ".tmp-"
log = logging.getLogger(__name__)


# ---- atomic writes ------------------------------------------------------------------------------------------


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


# ---- manifests ----------------------------------------------------------------------------------------------


def _artefacts(out_dir: Path, exclude: tuple[str, ...]) -> list[Path]:
    files = []
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir)
        if not path.is_file() or rel.name == SUCCESS or any(p.startswith(_TMP_PREFIX) for p in rel.parts):
            continue
        if rel.parts[0] in exclude or rel.parts[0].startswith(LOCK):
            continue
        files.append(path)
    return files


def _umask() -> int:
    try:  # thread-safe where /proc has it; os.umask() must set a value to read one
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def publish(out_dir: Path, files: list[Path]) -> None:
    """Give ``files`` and the directories between them and ``out_dir`` the modes the umask allows."""
    mask = _umask()
    dirs = {out_dir}
    for path in files:
        path.chmod((0o777 if path.stat().st_mode & stat.S_IXUSR else 0o666) & ~mask)
        dirs.update(p for p in path.parents if p.is_relative_to(out_dir))
    for directory in dirs:
        directory.chmod(0o777 & ~mask)


def write_success(out_dir: Path, exclude: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """Publish every artefact (but the ``exclude`` subdirs) and write the ``_SUCCESS`` manifest of their checksums,
    last. The run's fingerprint comes from ``identity.json`` when the run has one."""
    out_dir = Path(out_dir)
    artefacts = _artefacts(out_dir, exclude)
    publish(out_dir, artefacts)
    files = {str(p.relative_to(out_dir)): sha256_file(p) for p in artefacts}
    manifest: dict[str, Any] = {"files": files, "exclude": list(exclude), "finished_at": time.time()}
    identity = read_identity(out_dir)
    if identity is not None:
        manifest |= {"job": identity.job, "fingerprint": identity.fingerprint}
    manifest |= extra
    atomic_write_json(out_dir / SUCCESS, manifest)
    (out_dir / SUCCESS).chmod(0o666 & ~_umask())
    return manifest


def read_manifest(out_dir: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((Path(out_dir) / SUCCESS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def is_complete(out_dir: Path) -> bool:
    """True when ``_SUCCESS`` exists and every artefact it lists is present with the same checksum."""
    manifest = read_manifest(out_dir)
    if manifest is None:
        return False
    for rel, digest in manifest["files"].items():
        path = Path(out_dir) / rel
        if not path.is_file() or sha256_file(path) != digest:
            log.warning("%s: %s changed or is missing; the directory no longer counts as complete", out_dir, rel)
            return False
    return True


def read_identity(out_dir: Path) -> RunIdentity | None:
    try:
        return RunIdentity.from_dict(json.loads((Path(out_dir) / IDENTITY).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def output_fingerprint(path: Path) -> str | None:
    """``run:<job>:<fingerprint>[/<sub>]`` when ``path`` is a complete output of this project or a folder listed in
    one (an init output's ``model/``); None otherwise."""
    path = Path(path)
    for root in (path, path.parent):
        manifest = read_manifest(root)
        if not manifest or "fingerprint" not in manifest:
            continue
        sub = "" if root == path else path.name
        if sub and not any(f.startswith(sub + "/") for f in manifest["files"]):
            continue
        if is_complete(root):
            return f"run:{manifest.get('job', '')}:{manifest['fingerprint']}" + (f"/{sub}" if sub else "")
    return None


# ---- claiming an output for a run ---------------------------------------------------------------------------


class SettingsChanged(InputError):
    """The output holds a run with another identity."""


def check_output_path(out_dir: Path) -> None:
    """Fail, naming the path, when ``out_dir`` cannot be an output directory here (read-only; creates nothing)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"output {out_dir} exists and is not a directory")
    existing = out_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"output {out_dir}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        readonly = os.statvfs(existing).f_flag & os.ST_RDONLY
        raise InputError(
            f"output {out_dir}: {existing} is not writable "
            f"({'read-only file system' if readonly else 'permission denied'})"
        )


def _entries(out_dir: Path) -> set[str]:
    """The names in ``out_dir`` but its lock."""
    return {p.name for p in out_dir.iterdir() if not p.name.startswith(LOCK)} if out_dir.is_dir() else set()


def _foreign(out_dir: Path) -> bool:
    """A non-empty directory with none of this project's files: never written into, never cleared."""
    names = _entries(out_dir)
    return bool(names) and not names & {IDENTITY, SUCCESS, "config.yaml"}


def conflict(out_dir: Path, new: RunIdentity) -> str | None:
    """What keeps ``out_dir`` from taking a run of ``new`` without ``overwrite``, in a few words (the settings that
    differ, old → new); None when nothing does: it is absent, empty, or holds a run with the same identity."""
    out_dir = Path(out_dir)
    if not _entries(out_dir):
        return None
    if _foreign(out_dir):
        return "not empty, and not written by sembridge_ray"
    old = read_identity(out_dir)
    if old is None:
        return "no recorded identity: an older version wrote it"
    changes = new.differences(old)
    if not changes:
        return None
    return "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")


def refusal(out_dir: Path, new: RunIdentity) -> str | None:
    """The one-line error for :func:`conflict`, or None."""
    detail = conflict(out_dir, new)
    if detail is None:
        return None
    if _foreign(Path(out_dir)):
        return f"output {out_dir} is {detail}; choose an empty or new directory"
    state = "finished" if read_manifest(out_dir) else "unfinished"
    return (
        f"output {out_dir} holds a {state} run with other settings ({detail}); rerun with --overwrite to "
        "replace it, or choose another output"
    )


@dataclass
class Claim:
    """An output directory held by this run. ``done``: already complete with the same identity (skip it);
    ``resumed``: an unfinished run with the same identity was there (keep its partial work)."""

    path: Path
    identity: RunIdentity
    done: bool = False
    resumed: bool = False

    def finish(self, exclude: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
        """Mark the output complete: publish the artefacts and write the manifest, last."""
        return write_success(self.path, exclude=exclude, **extra)


def is_done(out_dir: Path, identity: RunIdentity) -> bool:
    """Complete, verified, and written by a run with this identity."""
    old = read_identity(out_dir)
    return old is not None and old.fingerprint == identity.fingerprint and is_complete(out_dir)


def preflight(out_dir: Path, identity: RunIdentity, overwrite: bool = False) -> bool:
    """The read-only half of :func:`claim_output`: True when ``out_dir`` is complete with this identity (skip);
    raises :class:`InputError` when the run may not write there (path, live lock, other settings)."""
    out_dir = Path(out_dir)
    check_output_path(out_dir)
    check_unlocked(out_dir)
    if out_dir.is_dir() and is_done(out_dir, identity):
        log.info("%s is complete with the same settings (run %s); skipping", out_dir, identity.fingerprint)
        return True
    reason = refusal(out_dir, identity)
    if reason and (not overwrite or _foreign(out_dir)):
        raise SettingsChanged(reason)
    return False


@contextlib.contextmanager
def claim_output(out_dir: Path, identity: RunIdentity, overwrite: bool = False) -> Iterator[Claim]:
    """Hold ``out_dir`` for a run of ``identity`` (see the module docstring for the rules).

    Everything that can refuse (path, lock, identity) is checked before anything is written. A refusal is an
    :class:`InputError` and leaves the directory as it was. A run that fails before writing anything into a
    directory it created removes that directory again.
    """
    out_dir = Path(out_dir)
    if preflight(out_dir, identity, overwrite):
        yield Claim(out_dir, identity, done=True)
        return
    try:
        out_dir.mkdir(parents=True)
        created = True
    except FileExistsError:
        created = False
    lock = OutputLock(out_dir)
    try:
        lock.acquire()
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only while still empty: another run may hold it now
        raise
    try:
        yield _take(out_dir, identity, overwrite, created)
    except BaseException as err:
        if created and _entries(out_dir) <= {IDENTITY}:
            (out_dir / IDENTITY).unlink(missing_ok=True)
            lock.release()
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        code = environment_errno(err) if isinstance(err, Exception) and not hasattr(err, "cause") else None
        if code is not None and not getattr(err, "filename", None):  # e.g. safetensors: no path in its message
            raise OSError(code, f"writing {out_dir}: {os.strerror(code)}") from err
        raise
    finally:
        lock.release()


def _take(out_dir: Path, identity: RunIdentity, overwrite: bool, created: bool) -> Claim:
    """Under the lock: re-check (another run may have finished meanwhile), clear when overwriting, record identity."""
    if is_done(out_dir, identity):
        log.info("%s was completed by another run with the same settings; skipping", out_dir)
        return Claim(out_dir, identity, done=True)
    reason = refusal(out_dir, identity)
    if reason:
        if not overwrite:
            raise SettingsChanged(reason)
        log.warning("%s: %s; --overwrite: starting from scratch", out_dir, reason.split(" (", 1)[0])
        for item in out_dir.iterdir():
            if not item.name.startswith(LOCK):
                _remove(item)
    resumed = not created and read_identity(out_dir) is not None
    (out_dir / SUCCESS).unlink(missing_ok=True)  # a partial output must never look complete
    atomic_write_json(out_dir / IDENTITY, identity.to_dict())
    return Claim(out_dir, identity, resumed=resumed)
