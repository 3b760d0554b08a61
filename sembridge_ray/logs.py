"""One logging setup for every process of a job: the command line, the Ray drivers and every Ray worker.

``setup_logging`` gives the format every log line has (``LOG_FORMAT``) and demotes third-party noise that says
nothing a user of these jobs can act on (hub progress bars, model-load reports, beta-feature warnings).

Ray's own output is handled where it is made (see ``docs/operations.md``, "Logs"):

- :data:`FALSE_ALARMS`: lines Ray prints, some at ERROR level, that report nothing wrong with the job. A driver
  routes its stderr through :func:`filter_stderr`, which drops them (they are written by Ray's C++ core straight
  to file descriptor 2, where no Python logging filter can see them) and strips colour codes unless stderr is a
  terminal; worker lines Ray forwards to the driver are skipped by Ray's own ``RAY_DEDUP_LOGS_SKIP_REGEX`` as well
  (:func:`ray_environment`). Those Ray logs through a Python logger are filtered at that logger, in every Ray worker
  (:func:`filter_false_alarm_records`).
- Ray colours the ``(Actor pid=..)`` prefix of forwarded worker lines; ``RAY_COLOR_PREFIX=0`` turns that off unless
  both stdout and stderr are terminals.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Third-party messages that say nothing a user of these jobs can act on.
_QUIET_LOGGERS = (
    "transformers",
    "sentence_transformers",
    "huggingface_hub",
    "datasets",
    "filelock",
    "urllib3",
    "matplotlib",
    "PIL",
)
_QUIET_WARNINGS = (
    "Sparse CSR tensor support is in beta",
    "The given NumPy array is not writable",
    "Converting a tensor with requires_grad",
    "TypedStorage is deprecated",
    # its replacement (torch.distributed._functional_collectives) is private; the autograd gather still works
    "torch.distributed.nn.functional.all_gather is deprecated",
)


@dataclass(frozen=True, kw_only=True)
class FalseAlarm:
    """Something Ray prints that reports nothing wrong with the job, and why it is dropped. ``pattern``: a regular
    expression searched in the line (without colour codes), or, with ``logger``, in the message of that Python
    logger's records (in every Ray worker: :func:`filter_false_alarm_records`), only those carrying an
    ``exception`` of that class name when one is given; the first ``dropped`` of them per process are dropped and
    the next ones shown (0: all dropped), so that one that persists is seen."""

    pattern: str
    why: str
    logger: str = ""
    exception: str = ""
    dropped: int = 0


FALSE_ALARMS = (
    FalseAlarm(
        pattern=r"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store and "
        r"max_restarts > 0",
        why="Ray's C++ core logs this at ERROR level for every restartable actor created with arguments in the object "
        "store (ray-project/ray#53727): every Ray Data actor pool (Ray Data puts the map function there) and Ray "
        "Train's PreemptionWatcher, once per pool or training run. Nothing failed; should a node be lost and a "
        "restart miss its arguments, the stage fails then with Ray's own error.",
    ),
    FalseAlarm(
        pattern=r"^Failed to (send|cancel) resource request for ",
        why="Ray Train's controller tells Ray's autoscaling coordinator (an actor of its own) what the run needs, "
        "waiting 5 s for an answer; on a busy machine the coordinator's first answer comes later, and Ray logs a "
        "warning with a 20-line traceback (its own text: safe to ignore when transient). The request is only for "
        "an autoscaler (none on a local cluster) and is sent again every 20 s. The first two timeouts of a run are "
        "dropped; later ones show, as they persist.",
        logger="ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client",
        exception="GetTimeoutError",
        dropped=2,
    ),
)

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""A terminal control sequence (colours, bold, cursor moves)."""

_ALARM = re.compile("|".join(f"(?:{a.pattern})" for a in FALSE_ALARMS if not a.logger))


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def is_false_alarm(line: str) -> bool:
    """Whether ``line`` (colour codes or not) is one of :data:`FALSE_ALARMS`."""
    return _ALARM.search(strip_ansi(line)) is not None


class AlarmFilter(logging.Filter):
    """Drops the records of one :class:`FalseAlarm` with a ``logger`` (see there)."""

    def __init__(self, alarm: FalseAlarm) -> None:
        super().__init__()
        self.alarm, self.pattern, self.count = alarm, re.compile(alarm.pattern), 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.pattern.search(record.getMessage()):
            return True
        error = record.exc_info[1] if record.exc_info else None
        if self.alarm.exception and type(error).__name__ != self.alarm.exception:
            return True
        if self.alarm.dropped and self.count >= self.alarm.dropped:
            return True
        self.count += 1
        return False


def filter_false_alarm_records() -> None:
    """Attach an :class:`AlarmFilter` to the logger of every :data:`FALSE_ALARMS` entry that has one (once)."""
    for alarm in FALSE_ALARMS:
        if alarm.logger:
            logger = logging.getLogger(alarm.logger)
            if not any(isinstance(f, AlarmFilter) and f.alarm == alarm for f in logger.filters):
                logger.addFilter(AlarmFilter(alarm))


def quiet_third_parties() -> None:
    """Demote known third-party noise (hub progress bars, model-load reports, beta-feature warnings) to WARNING."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for text in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=f".*{text}.*")


def setup_logging(level: str | int = "INFO", force: bool = True) -> None:
    """The job's root logger at ``level`` with :data:`LOG_FORMAT`, and third parties quietened."""
    numeric = getattr(logging, level) if isinstance(level, str) else level
    logging.basicConfig(level=numeric, format=LOG_FORMAT, force=force)
    quiet_third_parties()


def project_handler(stream: TextIO | None = None) -> None:
    """This project's loggers (``sembridge_ray.*``) print through a handler of their own, in :data:`LOG_FORMAT`, at
    INFO: in a Ray worker, whose root logger has no handler (a Ray Data actor) or one of Ray Train's (message only),
    so a worker's progress lines read like the driver's. Idempotent."""
    logger = logging.getLogger("sembridge_ray")
    if any(getattr(h, "_sembridge", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler._sembridge = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


# ---- Ray's environment, and the driver's stderr ----


def terminal_output() -> bool:
    """Whether both stdout and stderr are terminals (only then do colour codes belong in them)."""
    with contextlib.suppress(OSError, ValueError):
        return os.isatty(1) and os.isatty(2)
    return False


def ray_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables that quieten Ray's forwarded worker lines, as set by :func:`apply_ray_environment`:
    ``RAY_COLOR_PREFIX=0`` unless both outputs are terminals, and :data:`FALSE_ALARMS` added to
    ``RAY_DEDUP_LOGS_SKIP_REGEX`` (read once, when Ray is imported). A value the user set is kept (a skip regex
    is extended)."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    if "RAY_COLOR_PREFIX" not in env and not terminal_output():
        out["RAY_COLOR_PREFIX"] = "0"
    ours = _ALARM.pattern
    mine = env.get("RAY_DEDUP_LOGS_SKIP_REGEX", "")
    if ours not in mine:
        out["RAY_DEDUP_LOGS_SKIP_REGEX"] = f"{mine}|{ours}" if mine else ours
    return out


def apply_ray_environment() -> None:
    """Set :func:`ray_environment` in this process (before ``import ray`` for the skip regex to count)."""
    os.environ.update(ray_environment())


SYNC = b"\x00sembridge-log-sync\x00"
"""Written to a filtered stderr by :func:`sync_stderr`; the filter answers once everything before it is out."""


class StreamFilter:
    """The filter of :func:`filter_stderr`, without I/O: bytes in, bytes out. Whole lines are checked (a partial
    line waits for its end, or for :meth:`flush`); :data:`FALSE_ALARMS` are dropped; colour codes are removed when
    ``strip``. ``\\r`` ends a line too (progress bars on a terminal). :attr:`syncs` counts the :data:`SYNC` markers
    seen: everything written before one has been returned by the call that saw it."""

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.pending = b""
        self.syncs = 0

    def feed(self, data: bytes) -> bytes:
        data = self.pending + data
        self.pending = b""
        if SYNC in data:
            parts = data.split(SYNC)
            self.syncs += len(parts) - 1
            *before, after = parts
            out = b"".join(self._lines(part, final=True) for part in before)
            return out + self._lines(after, final=False)
        return self._lines(data, final=False)

    def flush(self) -> bytes:
        data, self.pending = self.pending, b""
        return self._lines(data, final=True)

    def _lines(self, data: bytes, final: bool) -> bytes:
        lines = data.splitlines(keepends=True)
        if lines and not final and not lines[-1].endswith((b"\n", b"\r")):
            self.pending = lines.pop()
        return b"".join(self._clean(line) for line in lines)

    def _clean(self, line: bytes) -> bytes:
        text = line.decode("utf-8", errors="replace")
        if is_false_alarm(text):
            return b""
        if self.strip and b"\x1b" in line:
            return ANSI.sub("", text).encode("utf-8")
        return line


@dataclass
class _Filter:
    proc: subprocess.Popen[bytes]
    ack: int
    """Read end of the pipe on which the filter answers :data:`SYNC`."""


_filter: _Filter | None = None


def filter_stderr() -> bool:
    """Route this process's stderr (file descriptor 2) through a filter process running :class:`StreamFilter`:
    Ray's :data:`FALSE_ALARMS` dropped, colour codes removed unless stderr is a terminal. A process, not a thread,
    so that what a crashing job writes last still comes out; it ignores SIGINT and SIGTERM and ends when the
    job's last copy of its stderr is closed. On a terminal the job writes to a pseudo-terminal of the same size,
    so what checks for a terminal (colours, progress bars) behaves as before. Nothing is done (False) where stderr
    is not the process's own (pytest's capture), outside POSIX, when ``SEMBRIDGE_LOG_FILTER=0``, or a second
    time. :func:`sync_stderr` waits until the filter has written everything so far (before a job's report, and
    at exit)."""
    global _filter
    if _filter is not None or os.name != "posix" or os.environ.get("SEMBRIDGE_LOG_FILTER", "1") == "0":
        return False
    try:
        if sys.__stderr__ is None or sys.stderr is not sys.__stderr__ or sys.stderr.fileno() != 2:
            return False
        read, write = _terminal_pair() if os.isatty(2) else os.pipe()
    except (OSError, ValueError, AttributeError, ImportError):
        return False
    sys.stderr.flush()
    ack_read, ack_write = os.pipe()
    original = os.dup(2)
    env = dict(os.environ, SEMBRIDGE_LOG_FILTER_ACK=str(ack_write), SEMBRIDGE_LOG_FILTER_MODULE=__name__)
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _PUMP],
            stdin=read,
            stdout=original,
            stderr=original,
            pass_fds=(ack_write,),
            env=env,
            close_fds=True,
        )
    except OSError:
        for fd in (read, write, ack_read, ack_write, original):
            os.close(fd)
        return False
    os.dup2(write, 2)
    for fd in (read, write, ack_write, original):
        os.close(fd)
    _filter = _Filter(proc=proc, ack=ack_read)
    atexit.register(sync_stderr)
    return True


def _terminal_pair() -> tuple[int, int]:
    """(reading end, writing end) of a pseudo-terminal as large as the terminal on stderr, passing bytes as they
    are (raw: no newline translation, no echo)."""
    import fcntl
    import termios
    import tty

    master, slave = os.openpty()
    try:
        tty.setraw(slave)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(2, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def filter_pids() -> list[int]:
    """The process id of the stderr filter, when this process started one."""
    return [_filter.proc.pid] if _filter is not None else []


def sync_stderr(timeout: float = 5.0) -> None:
    """Wait (at most ``timeout`` seconds) until the stderr filter has written everything this process wrote to
    stderr so far, so that what comes next on stdout (a job's report) is not overtaken. Nothing without a filter."""
    if _filter is None or _filter.proc.poll() is not None:
        return
    import select

    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        os.write(2, SYNC)
        ready, _, _ = select.select([_filter.ack], [], [], timeout)
        if ready:
            os.read(_filter.ack, 4096)


# The filter's command line names no "ray" (distributed.cluster's reaper waits for this job's processes that do):
# the module comes from the environment.
_PUMP = (
    "import importlib, os, signal\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "importlib.import_module(os.environ['SEMBRIDGE_LOG_FILTER_MODULE']).pump()\n"
)


def pump(source: int = 0, dest: int = 1, wait_s: float = 0.2) -> None:
    """The filter process of :func:`filter_stderr`: ``source`` through :class:`StreamFilter` to ``dest`` until the
    end of ``source``; a partial line is written as it is after ``wait_s`` without more input (a prompt)."""
    import select

    ack = int(os.environ.get("SEMBRIDGE_LOG_FILTER_ACK", "-1"))
    filt = StreamFilter(strip=not _isatty(dest))
    while True:
        ready, _, _ = select.select([source], [], [], wait_s if filt.pending else None)
        if not ready:
            _write(dest, filt.flush())
            continue
        try:
            chunk = os.read(source, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        syncs = filt.syncs
        _write(dest, filt.feed(chunk))
        if filt.syncs > syncs and ack >= 0:
            with contextlib.suppress(OSError):
                os.write(ack, b"." * (filt.syncs - syncs))
    _write(dest, filt.flush())


def _isatty(fd: int) -> bool:
    with contextlib.suppress(OSError):
        return os.isatty(fd)
    return False


def _write(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``; a closed destination (``| head``) is ignored, so the source is still drained."""
    while data:
        try:
            data = data[os.write(fd, data) :]
        except InterruptedError:
            continue
        except OSError:
            return


# ---- `ray job submit`'s own lines (cluster/local.sh) ----

_SUBMIT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|SUCC|WARN|WARNING|ERR|ERROR)\s+\w+\.py:\d+ -- ")
_SUBMIT_QUIET_WARNINGS = (
    # local.sh passes --working-dir as well as cluster/runtime_env.yaml's working_dir: the same directory
    "Overriding runtime_env working_dir with --working-dir option",
    # cluster/runtime_env.yaml excludes them already
    "is now ignored by default when packaging the working directory",
)
_SUBMITTED = re.compile(r"Job '(raysubmit_\w+)' submitted successfully")


def job_submit_line(line: str, address: str = "") -> str | None:
    """A line of ``ray job submit``'s output as ``cluster/local.sh`` shows it: the CLI's own INFO and SUCC lines
    (packaging, banners, "next steps", the job supervisor's start-up) dropped but one, which says which job runs
    and how to stop it; its warnings and errors kept, but for two about local.sh's own settings and the rules
    around its banners; colour codes removed; the job's output as it is."""
    text = strip_ansi(line).rstrip("\r\n")
    if (found := _SUBMITTED.search(text)) is not None:
        where = f" --address {address}" if address else ""
        return f"[local.sh] submitted job {found[1]} (to stop it: ray job stop {found[1]}{where})"
    record = _SUBMIT_RECORD.match(text)
    if record is not None and (
        record[1] in ("INFO", "SUCC")
        or any(w in text for w in _SUBMIT_QUIET_WARNINGS)
        or not text[record.end() :].strip("- ")  # a banner's rule
    ):
        return None
    if text.startswith("Running entrypoint for job raysubmit_"):
        return None
    return text


def main(argv: list[str] | None = None) -> int:
    """``python -m sembridge_ray.logs ray-job-submit``: stdin through :func:`job_submit_line` to stdout, a line at a
    time (``cluster/local.sh`` pipes ``ray job submit`` through it)."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["ray-job-submit"]:
        print("usage: python -m sembridge_ray.logs ray-job-submit", file=sys.stderr)
        return 2
    address = os.environ.get("RAY_ADDRESS", "")
    for line in sys.stdin:
        shown = job_submit_line(line, address)
        if shown is not None:
            print(shown, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
