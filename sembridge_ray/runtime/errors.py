"""The errors a user can fix: bad input (:class:`InputError`) and an environment that refuses (disk
full, read-only, permission). Jobs print either as one line and exit 2; a traceback is left for
bugs."""

from __future__ import annotations

import errno
import re
import sqlite3
import threading


class InputError(ValueError):
    """Bad input (a missing model, a malformed row, an unknown config key); the message names it."""


class Terminated(KeyboardInterrupt):
    """The job was asked to stop by a signal (SIGTERM: a scheduler's preemption, ``kill``, ``docker
    stop``).

    :func:`sembridge_ray.cli.run_job` raises it in the main thread when the signal arrives, so every
    context manager unwinds (the output lock is released, a directory the run created and left empty
    is removed) before the job exits 143. A ``KeyboardInterrupt``, because that is what libraries
    already treat as "stop now": ``except Exception`` lets it pass, Ray Data shuts its executor down
    on it, and a ``ray.get`` it interrupts raises a ``KeyboardInterrupt`` (any other exception from
    a signal handler becomes a ``SystemError`` there, which a failing grid cell's ``except
    Exception`` would record as a failure and go on)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


terminating = threading.Event()
"""Set by the command line's SIGTERM handler (``sembridge_ray.cli``): the job is on its way out, and
what runs at exit takes the quick way (a Ray cluster's shutdown bounded, then its processes killed;
the interpreter's own finalization skipped), so the process ends within seconds of the signal,
before a scheduler's SIGKILL."""


ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
    errno.ENAMETOOLONG: "name too long",
    errno.EFBIG: "file too large",
}
# How libraries that raise no OSError, or one without its errno, report an errno: Rust's "(os error
# 28)" (safetensors, tokenizers) and its debug form "Os { code: 28, kind: StorageFull, .. }"
# (Seismic's index writer), and Arrow's "[errno 28]" (pyarrow filesystems, which Ray Train uploads
# checkpoints with).
_OS_ERROR = re.compile(r"\(os error (\d+)\)|\[errno (\d+)\]|\bOs \{ code: (\d+)", re.IGNORECASE)
_SQLITE = {sqlite3.SQLITE_FULL: errno.ENOSPC, sqlite3.SQLITE_READONLY: errno.EROFS}
"""SQLite's result codes for a full disk and a read-only database (Qdrant's local mode stores in
SQLite), as errnos; its message for the first is fixed: "database or disk is full"."""


def environment_errno(err: BaseException) -> int | None:
    """The errno of an error the environment caused (see :data:`ENVIRONMENT_ERRNOS`), else None."""
    code = err.errno if isinstance(err, OSError) else None
    if code is None and (match := _OS_ERROR.search(str(err))):
        code = int(next(group for group in match.groups() if group))
    if code is None and isinstance(err, sqlite3.Error):
        found = getattr(err, "sqlite_errorcode", None)
        full = str(err).strip() == "database or disk is full"
        code = errno.ENOSPC if full else _SQLITE.get(found & 0xFF if found is not None else -1)
    return code if code in ENVIRONMENT_ERRNOS else None


def _causes(err: BaseException) -> list[BaseException]:
    """What an exception wraps: its explicit ``__cause__``, a Ray task error's ``cause``, a Ray
    Train failure's per-worker errors, an exception group's members (not the implicit
    ``__context__``: an error raised while handling another is a new failure)."""
    found = [getattr(err, "cause", None), err.__cause__]
    failures = getattr(err, "worker_failures", None)
    if isinstance(failures, dict):
        found.extend(failures.values())
    found.extend(getattr(err, "exceptions", None) or ())
    return [e for e in found if isinstance(e, BaseException)]


def find_user_error(err: BaseException) -> BaseException | None:
    """The error caused by the user's input or environment, wherever it sits in the chain of causes
    (Ray wraps what its workers raise); None when it is a bug."""
    stack, seen = [err], set()
    while stack:
        current = stack.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        wrapped = _causes(current)
        # a Ray wrapper: also an instance of what it wraps
        if getattr(current, "cause", None) is not None:
            stack = wrapped + stack
            continue
        if isinstance(current, InputError) or environment_errno(current) is not None:
            return current
        stack.extend(wrapped)
    return None


def user_error(err: BaseException) -> str | None:
    """The one-line message of :func:`find_user_error`'s error (None for a bug)."""
    found = find_user_error(err)
    if found is None or isinstance(found, InputError):
        return None if found is None else str(found)
    code = environment_errno(found)
    where = getattr(found, "filename", None) or ""
    text = found.strerror if isinstance(found, OSError) and found.strerror else str(found)
    return f"{where + ': ' if where else ''}{text.strip().splitlines()[0]} ({ENVIRONMENT_ERRNOS[code or 0]})"
