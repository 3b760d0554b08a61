"""One writer per output directory: an exclusive lock file, ``<output>/.lock``, taken before
anything is written.

The lock is a file created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and on NFSv3+),
holding its owner: pid, host, pid namespace, the process's start time and the command. The owner
touches the file every :data:`HEARTBEAT_S` seconds while it holds the lock. A lock whose owner is
gone is broken with a warning:

- same host and the same pid namespace (the kernel's boot id and the namespace's inode match):
  decided by the pid alone, never by age: the lock is stale when the pid is not running or now
  belongs to another process (a different start time). A live owner that has not touched its lock
  for hours (stopped with SIGSTOP, a frozen container, an output filesystem whose clock is far
  behind) still holds it;
- same host name but another or an unknown pid namespace (two containers sharing a hostname and an
  NFS output; a lock written by an older version): the pid is not running here *and* the heartbeat
  is older than :data:`SAME_HOST_STALE_S`, or the heartbeat is older than :data:`STALE_AFTER_S`,
  since a live owner's pid may simply not exist in this namespace;
- another host: its heartbeat is older than :data:`STALE_AFTER_S`, since a pid on another machine
  cannot be checked.

A heartbeat's age is measured on the output filesystem's own clock, never this machine's: the lock's
mtime against the mtime the filesystem gives a file created beside it now (:func:`filesystem_now`).
An NFS server sets both, so a client whose clock is ahead or behind, or two hosts that disagree,
cannot make a live lock look old.

A live owner is reported, never waited for: the second run exits at once naming it. On object
storage (s3://, gs://) there is no exclusive create, so outputs must be on a POSIX filesystem (local
disk, NFS, Lustre, …); checkpoints alone may go to object storage (``storage=``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sembridge_ray.runtime.errors import InputError

LOCK = ".lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
SAME_HOST_STALE_S = 3 * HEARTBEAT_S
"""How old the heartbeat of a same-host lock from another pid namespace must be, besides its pid not
running here."""
log = logging.getLogger(__name__)


class OutputLocked(InputError):
    """Another live run holds the output's lock."""


@dataclass(frozen=True, kw_only=True)
class Holder:
    """Who holds a lock."""

    pid: int
    host: str
    started: float
    proc_start: str
    command: str
    pid_ns: str = ""
    """The boot id and pid namespace the pid belongs to (:func:`pid_namespace`); "" where unknown
    (older locks)."""

    @classmethod
    def me(cls) -> Holder:
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.time(),
            proc_start=_proc_start(os.getpid()),
            command=" ".join(sys.argv)[:300],
            pid_ns=pid_namespace(),
        )

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Holder:
        """From the lock's JSON; keys a newer version may add are ignored."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})  # type: ignore[arg-type]

    def here(self) -> bool:
        """Whether its pid is one of this machine's and pid namespace's (so that checking the pid
        means something)."""
        return (
            self.host == socket.gethostname()
            and bool(self.pid_ns)
            and self.pid_ns == pid_namespace()
        )

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started))
        where = ""
        if self.host == socket.gethostname() and not self.here():
            where = ", in another pid namespace" if self.pid_ns else ", pid namespace not recorded"
        return f"pid {self.pid} on host {self.host} (started {when}{where})"


def pid_namespace() -> str:
    """``<boot id>/<pid namespace inode>``: the namespace's inode is unique on one running kernel,
    the boot id tells kernels (machines, reboots) apart; two containers sharing a hostname differ in
    one of them. "" where /proc does not say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def _proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); "" where
    unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]  # fields after "(comm)", which may hold spaces


def _alive(holder: Holder) -> bool:
    """Whether the holder's pid still runs here with the start time it recorded (True for another
    host's lock: decided by the heartbeat age instead)."""
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's live process
    return not holder.proc_start or _proc_start(holder.pid) in ("", holder.proc_start)


def read_holder(path: Path) -> Holder | None:
    """The lock's holder, or None when the file is absent or unreadable (being written, or
    damaged)."""
    try:
        return Holder.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def filesystem_now(directory: Path) -> float:
    """The current time on the clock of the filesystem holding ``directory``: the mtime it gives a
    file created there now (an NFS server stamps it, as it stamps the heartbeats). This machine's
    clock where the directory takes no file (read-only, gone)."""
    probe = Path(directory) / f"{LOCK}.clock-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return time.time()
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            probe.unlink()


def heartbeat_age(path: Path) -> float:
    """Seconds since the lock file at ``path`` was last touched, on its filesystem's clock
    (:func:`filesystem_now`); infinite when it is gone."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")
    return filesystem_now(path.parent) - mtime


def _stale(path: Path, holder: Holder | None) -> bool:
    if not path.exists():
        return True
    if holder is None:
        # a lock that stays unreadable was left half-written by a crash
        return heartbeat_age(path) > 10.0
    if holder.here():
        # the pid decides: a paused owner or a clock far behind never breaks a live lock
        return not _alive(holder)
    age = heartbeat_age(path)
    if holder.host == socket.gethostname():
        # same host name, another (or an unknown) pid namespace: a pid missing here may run there,
        # but its heartbeat would then be fresh
        return age > STALE_AFTER_S or (age > SAME_HOST_STALE_S and not _alive(holder))
    return age > STALE_AFTER_S


def check_unlocked(out_dir: Path) -> None:
    """Raise :class:`OutputLocked` naming the holder when a live run holds ``out_dir``'s lock
    (read-only)."""
    path = Path(out_dir) / LOCK
    holder = read_holder(path)
    if not _stale(path, holder):  # stale when there is none
        raise OutputLocked(_locked_message(out_dir, holder))


def _locked_message(out_dir: Path, holder: Holder | None) -> str:
    who = holder.describe() if holder else "a run whose lock is being written"
    return (
        f"output {out_dir} is locked by {who}: another run is writing it; wait for it, or remove "
        f"{Path(out_dir) / LOCK} if that run is gone"
    )


def _missing_message(out_dir: Path) -> str:
    if out_dir.is_symlink():
        return (
            f"output {out_dir} is a symbolic link to {os.readlink(out_dir)}, which does not exist"
        )
    return f"output {out_dir} does not exist (removed while this run was starting?)"


class OutputLock:
    """The exclusive lock of one output directory; a context manager. The directory must exist."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / LOCK
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> None:
        data = json.dumps(asdict(Holder.me())).encode()
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileNotFoundError:
                raise InputError(_missing_message(self.path.parent)) from None
            except FileExistsError:
                seen = _read_bytes(self.path)
                holder = read_holder(self.path)
                if not _stale(self.path, holder):
                    raise OutputLocked(_locked_message(self.path.parent, holder)) from None
                self._break(holder, seen)
                continue
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            self._beat = threading.Thread(
                target=self._heartbeat, name="output-lock-heartbeat", daemon=True
            )
            self._beat.start()
            return
        raise OutputLocked(_locked_message(self.path.parent, read_holder(self.path)))

    def _break(self, holder: Holder | None, seen: bytes | None) -> None:
        if _read_bytes(self.path) != seen:
            return  # someone else broke it and took a fresh lock meanwhile: the retry sees that one
        who = holder.describe() if holder else "an unreadable owner"
        log.warning(
            "breaking the stale lock of %s held by %s (no longer running)", self.path.parent, who
        )
        grave = self.path.with_name(f"{LOCK}.stale-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path, grave)
            grave.unlink()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def moved_to(self, directory: Path) -> None:
        """The held lock's directory is about to be renamed to ``directory`` (an ``--overwrite``
        swap): follow it."""
        self.path = Path(directory) / LOCK

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        holder = read_holder(self.path)
        if holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
