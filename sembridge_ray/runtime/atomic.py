"""Files and directories written whole or not at all: a temporary sibling renamed into place; and
their sha256."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"
"""The prefix of a file or directory being written (never an artefact)."""


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (file or directory) and rename it onto ``path`` on
    success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    remove(tmp)
    try:
        yield tmp
        if tmp.is_dir() and path.is_dir():
            remove(path)  # os.replace cannot replace a non-empty directory
        os.replace(tmp, path)
    finally:
        remove(tmp)


@contextlib.contextmanager
def atomic_new_path(path: Path) -> Iterator[Path]:
    """:func:`atomic_path` for a ``path`` that must not exist: the temporary sibling is renamed onto
    it only while nothing is there (a rename never replaces a non-empty directory), so of two
    writers racing for one new output the second fails with :class:`FileExistsError` naming ``path``
    instead of replacing the first's work. An error of the filesystem while writing names ``path``,
    never the temporary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # writers never share it
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}-{secrets.token_hex(4)}")
    try:
        try:
            yield tmp
        except OSError as err:
            if err.filename is None or TMP_PREFIX not in str(err.filename):
                raise
            raise type(err)(err.errno, f"writing {path}: {err.strerror or err}", str(path)) from err
        taken = FileExistsError(errno.EEXIST, "written meanwhile by another run", str(path))
        if path.exists() and not (path.is_dir() and not any(path.iterdir())):
            raise taken
        try:
            os.rename(tmp, path)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise taken from None
            raise
    finally:
        remove(tmp)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(text.encode("utf-8"))


def atomic_write_json(path: Path, obj: object) -> None:
    """``obj`` as indented JSON, in key order, written whole or not at all."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def sha256_file(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
