"""Cache entries that verify what they serve and appear whole or not at all, whatever runs beside
them.

An entry is a directory: the data files and ``_CACHE.json``, the sha256 of every file in it. Not
a digest in each file's metadata: one rule for every format, the digest covers every byte (a
Parquet footer cannot hold the hash of the file it ends), and one rename publishes both.

- **Writing** (:func:`publish`): ``build(tmp)`` writes into a temporary sibling
  ``.tmp-<name>@<host>-<pid>-<random>``, the manifest goes in last, and ``os.rename`` moves the
  directory into place. Renaming onto a non-empty directory fails, so when another writer finished
  first its entry is kept (after it verifies) and ours discarded: readers never see a half-written
  entry, and concurrent writers agree on one entry without a lock. No fsync either: a write torn by
  a power cut fails its digests and is rebuilt.
- **Reading** (:func:`load`): every file is hashed before the value is served. Small files are read
  once, hashed and parsed from the same buffer (:meth:`Entry.read_bytes`); files that other
  processes read by path are streamed through sha256 (:meth:`Entry.verify_rest`), at about 0.9 GB/s
  on one core, a tenth of the time pyarrow takes to parse the same bytes of bridge vectors.
- **A bad entry** (a digest that differs, a file missing or extra, no or an unreadable manifest,
  content that does not parse or is not what its key promises): one warning naming the file, the
  entry renamed to ``<name>.corrupt-<UTC time>`` beside it (kept for a person to look at), and
  recomputed. Never served, never a traceback.
- **Shipped entries** (:func:`load_shipped`), read-only: verified the same way, only ever refused.
- **Leftovers**: a temporary sibling whose writer is gone is removed by the next writer
  (:func:`_abandoned`)."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import time
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import psutil

# TMP_PREFIX: what an output's manifest skips (manifest._artefacts): an entry being built is none
from sembridge_ray.runtime.atomic import TMP_PREFIX, sha256_file

log = logging.getLogger(__name__)
T = TypeVar("T")
MANIFEST = "_CACHE.json"
VERSION = 1
CORRUPT = ".corrupt-"
QUIET_S = 600.0
# What reading a damaged file raises: npz (BadZipFile, EOFError, KeyError), pyarrow (ArrowInvalid is
# a ValueError, ArrowIOError an OSError), json (ValueError), a dataclass from bad JSON (TypeError).
UNREADABLE = (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile)
# what rename says when the entry exists
_TAKEN = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR)
# the environment refusing, not a damaged entry: raised, not set aside
_NOT_OURS = (errno.EACCES, errno.EPERM)


class Corrupt(Exception):
    """An entry that must not be served: ``file`` is at fault, ``problem`` says why in a few words."""

    def __init__(self, file: Path, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file, self.problem = file, problem


class Entry:
    """A published entry being read: what it hands out has been checked against its manifest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.current = path / MANIFEST  # the file being read, named when it turns out bad
        self.digests = _manifest(path)
        self._unread = set(self.digests)

    def read_bytes(self, name: str) -> bytes:
        """``name``'s bytes (relative to the entry), read once and hashed: parse them, not the file."""
        data = self._file(name).read_bytes()
        self._check(name, hashlib.sha256(data).hexdigest())
        return data

    def verify_rest(self) -> None:
        """Stream the files not read by :meth:`read_bytes` (those read by path) through sha256."""
        for name in sorted(self._unread):
            self._check(name, sha256_file(self._file(name)))

    def _file(self, name: str) -> Path:
        self.current = self.path / name
        if name not in self.digests:
            raise Corrupt(self.current, "not in the entry's manifest")
        return self.current

    def _check(self, name: str, digest: str) -> None:
        if digest != self.digests[name]:
            raise Corrupt(self.current, "content does not match its sha256")
        self._unread.discard(name)


def _read_verified(path: Path, read: Callable[[Entry], T], bad: Callable[[str], None]) -> T | None:
    """``read(entry)`` once every file of the entry at ``path`` verifies, else None after
    ``bad("FILE: problem")``."""
    entry = None
    try:
        entry = Entry(path)
        value = read(entry)
        entry.verify_rest()
        return value
    except Corrupt as err:
        problem = f"{err.file}: {err.problem}"
    except UNREADABLE as err:
        if isinstance(err, OSError) and err.errno in _NOT_OURS:
            raise
        file = entry.current if entry is not None else path / MANIFEST
        text = str(err).strip()
        first = f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
        problem = f"{file}: unreadable ({first})"
    bad(problem)
    return None


def load(path: Path, read: Callable[[Entry], T], what: str) -> T | None:
    """``read(entry)`` of the entry at ``path`` once every file in it verifies; None when there is
    none, or when it is bad (then it is moved aside with one warning). ``read`` parses (raising
    :class:`Corrupt` for content that is not what the key promises) and must not return None;
    ``what`` names the cache in the warning."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    inode = _inode(path)
    return _read_verified(path, read, lambda problem: set_aside(path, inode, f"{what} {problem}"))


def load_shipped(path: Path, read: Callable[[Entry], T], what: str) -> T | None:
    """:func:`load` of an entry shipped read-only with the package: a bad one gets one warning and is
    left as it is (never moved aside or rewritten: the caller computes the value instead)."""
    path = Path(path)
    if not path.is_dir():
        return None
    return _read_verified(path, read, lambda problem: log.warning("%s %s; not used", what, problem))


def publish(
    path: Path, build: Callable[[Path], T], read: Callable[[Entry], T], what: str
) -> tuple[T, bool]:
    """Write an entry at ``path``: ``build(tmp)`` creates the directory ``tmp`` (and its parents)
    when it has something to write, fills it and returns its value; so a long or failing computation
    leaves no directory behind. Returns (value, True) when ours was published, or (``read`` of the
    other writer's verified entry, False) when one finished first."""
    path = Path(path)
    _sweep(path)
    tmp = _temporary(path)
    try:
        value = build(tmp)
        _write_manifest(tmp)
        # each failure moved a bad entry aside; more means something else keeps writing bad ones
        for _ in range(3):
            try:
                os.rename(tmp, path)
                return value, True
            except OSError as err:
                if err.errno not in _TAKEN:
                    raise
            theirs = load(path, read, what)
            if theirs is not None:
                log.info("%s %s was written meanwhile by another run; keeping that one", what, path)
                return theirs, False
        log.warning(
            "%s %s: could not replace the entry there; using this run's result uncached", what, path
        )
        return value, False
    finally:
        _remove(tmp)


def fetch(
    path: Path, read: Callable[[Entry], T], build: Callable[[Path], T], what: str
) -> tuple[T, bool]:
    """(value, whether it came from the cache): :func:`load`, else :func:`publish`."""
    value = load(path, read, what)
    if value is not None:
        return value, True
    return publish(path, build, read, what)[0], False


VERIFIED: dict[Path, str] = {}
"""Model directories hashed in this process, each with its manifest's text: a rebuild (a new
manifest) is hashed again."""


def model_directory(
    entry: Path, build: Callable[[Path], Path], what: str, mark: Callable[[Path, bool], None]
) -> str:
    """A bundled sentence-transformers directory ``entry``: :func:`fetch` with ``build``, hashed
    once per process while its manifest is unchanged. ``mark(entry, hit)`` marks it with its licence
    (``hit``: it was there already)."""
    if entry in VERIFIED and VERIFIED[entry] == _manifest_text(entry):
        return str(entry)
    _, hit = fetch(entry, _read_model, build, what)
    mark(entry, hit)
    VERIFIED[entry] = _manifest_text(entry)
    return str(entry)


def _read_model(entry: Entry) -> Path:
    """The entry's path once ``modules.json`` parses (:func:`load` hashes the other files after
    this); a ValueError is an unreadable entry, set aside."""
    modules = json.loads(entry.read_bytes("modules.json"))
    if not isinstance(modules, list) or not modules:
        raise Corrupt(entry.path / "modules.json", "lists no sentence-transformers modules")
    return entry.path


def _manifest_text(entry: Path) -> str:
    try:
        return (entry / MANIFEST).read_text(encoding="utf-8")
    except OSError:
        return ""


def entries(directory: Path, prefix: str = "") -> list[Path]:
    """The published entries in ``directory`` whose names start with ``prefix``, by name (no
    temporaries, nothing moved aside)."""
    if not Path(directory).is_dir():
        return []
    names = (
        p
        for p in Path(directory).iterdir()
        if p.name.startswith(prefix) and not p.name.startswith(TMP_PREFIX)
    )
    return sorted(p for p in names if CORRUPT not in p.name and p.is_dir())


def discard(path: Path) -> None:
    """Remove an entry no longer needed: renamed away first, so readers lose it at once."""
    # named like a writer's: if this process dies mid-removal, the sweep ends it
    gone = _temporary(Path(path))
    try:
        os.rename(path, gone)
    except FileNotFoundError:
        return
    _remove(gone)


def set_aside(path: Path, inode: int | None, message: str) -> None:
    """Move the bad entry at ``path`` to ``<name>.corrupt-<UTC time>`` and log ``message`` once;
    leave it be when it is no longer the one read (another run moved or replaced it)."""
    aside = path.with_name(f"{path.name}{CORRUPT}{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")
    if _inode(path) != inode:
        log.info("%s; another run has moved it aside already", message)
        return
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        log.info("%s; another run has moved it aside already", message)
        return
    except OSError as err:
        log.warning("%s; could not move it aside (%s); recomputing", message, err.strerror)
        return
    log.warning("%s; moved aside to %s; recomputing", message, aside.name)


def _manifest(path: Path) -> dict[str, str]:
    """The file -> sha256 map of the entry at ``path``, checked to list exactly the files there."""
    file = path / MANIFEST
    if not path.is_dir():
        raise Corrupt(path, "not a directory")
    try:
        manifest = json.loads(file.read_bytes())
    except FileNotFoundError:
        raise Corrupt(file, "missing (written by an older version, or not by this cache)") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("version") != VERSION:
        raise Corrupt(file, f"not a version-{VERSION} cache manifest")
    on_disk = _listing(path)
    missing, extra = sorted(set(files) - on_disk), sorted(on_disk - set(files))
    if missing or extra:
        raise Corrupt(
            path / (missing or extra)[0],
            "listed but missing" if missing else "not listed in the manifest",
        )
    if absent := [d for d in manifest.get("dirs", []) if not (path / d).is_dir()]:
        raise Corrupt(path / absent[0], "directory listed but missing")
    return files


def _listing(path: Path) -> set[str]:
    return {
        str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p != path / MANIFEST
    }


def _write_manifest(tmp: Path) -> None:
    if not tmp.is_dir():
        raise FileNotFoundError(errno.ENOENT, "the cache entry's build wrote nothing", str(tmp))
    manifest = {
        "version": VERSION,
        "files": {name: sha256_file(tmp / name) for name in sorted(_listing(tmp))},
        "dirs": sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_dir()),
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "by": socket.gethostname(),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _temporary(path: Path) -> Path:
    return path.with_name(
        f"{TMP_PREFIX}{path.name}@{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    )


def _sweep(path: Path) -> None:
    """Remove the temporary siblings of ``path`` left by writers on this host that are gone."""
    prefix = f"{TMP_PREFIX}{path.name}@"
    for tmp in path.parent.iterdir() if path.parent.is_dir() else ():
        if tmp.name.startswith(prefix) and _abandoned(tmp, tmp.name[len(prefix) :]):
            log.info("removing %s, left by a writer that is gone", tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def _abandoned(tmp: Path, owner: str) -> bool:
    """Same host, pid not running, nothing written for :data:`QUIET_S`: a pid alone could be a live
    writer in another container with this hostname (another pid namespace) sharing the cache over
    NFS."""
    host, pid, _ = [*owner.rsplit("-", 2), "", ""][:3]
    if host != socket.gethostname() or not pid.isdigit() or psutil.pid_exists(int(pid)):
        return False
    try:
        newest = max(p.lstat().st_mtime for p in (tmp, *tmp.rglob("*")))
    except OSError:
        return False  # being removed or renamed by someone else
    return time.time() - newest > QUIET_S


def _inode(path: Path) -> int | None:
    try:
        return path.lstat().st_ino
    except OSError:
        return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
