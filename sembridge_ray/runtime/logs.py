"""One logging setup for every process of a job: the command line, the Ray drivers and every Ray
worker.

``setup_logging`` gives the format every log line has (``LOG_FORMAT``) and demotes third-party noise
that says nothing a user of these jobs can act on (hub progress bars, model-load reports,
beta-feature warnings).

Ray's own output is handled where it is made (see ``docs/operations.md``, "Logs"):

- :data:`FALSE_ALARMS`: lines Ray prints, some at ERROR level, that report nothing wrong with the
  job. Those its C++ core writes in a worker are skipped where Ray forwards them to the driver, by
  Ray's own ``RAY_DEDUP_LOGS_SKIP_REGEX`` (:func:`ray_environment`); those Ray logs through a Python
  logger are filtered at that logger, in every Ray worker and in the job's own process
  (:func:`filter_false_alarm_records`; a library's alarm, such as Milvus Lite's, comes from there).
  The driver's own stderr is not filtered: on the demo (every stage of the paper's pipeline) Ray
  wrote none of them there.
- Ray colours the ``(Actor pid=..)`` prefix of forwarded worker lines; ``RAY_COLOR_PREFIX=0`` turns
  that off unless both stdout and stderr are terminals.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import TextIO

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_QUIET_LOGGERS = (
    "transformers",
    "sentence_transformers",
    "huggingface_hub",
    "datasets",
    "filelock",
    "urllib3",
    "matplotlib",
    "PIL",
    # which of its CPU builds it loads (four INFO lines; pymilvus imports it)
    "faiss",
)
_QUIET_WARNINGS = (
    "Sparse CSR tensor support is in beta",
    "The given NumPy array is not writable",
    "Converting a tensor with requires_grad",
    "TypedStorage is deprecated",
    # its replacement (torch.distributed._functional_collectives) is private; the autograd gather
    # still works
    "torch.distributed.nn.functional.all_gather is deprecated",
)


@dataclass(frozen=True, kw_only=True)
class FalseAlarm:
    """Something Ray prints that reports nothing wrong with the job, and why it is dropped.
    ``pattern``: a regular expression searched in the line (without colour codes), or, with
    ``logger``, in the message of that Python logger's records (in every Ray worker:
    :func:`filter_false_alarm_records`), only those carrying an ``exception`` of that class name
    when one is given; the first ``dropped`` of them per process are dropped and the next ones shown
    (0: all dropped), so that one that persists is seen."""

    pattern: str
    why: str
    logger: str = ""
    exception: str = ""
    raised_in: str = ""
    """With ``exception``: only when it was raised in a function of this name."""
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
    FalseAlarm(
        pattern=r"^Exception calling application: Method not implemented!$",
        why="pymilvus (3.x) asks the server for a timestamp (AllocTimestamp) after every write; Milvus Lite's "
        "in-process gRPC server does not implement it, and grpc logs that at ERROR level with a traceback in the "
        "job's own process on every successful Milvus Lite export. pymilvus goes on without the timestamp.",
        logger="grpc._server",
        exception="NotImplementedError",
        raised_in="AllocTimestamp",
    ),
)

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""A terminal control sequence (colours, bold, cursor moves)."""

_ALARM = re.compile("|".join(f"(?:{a.pattern})" for a in FALSE_ALARMS if not a.logger))


def is_false_alarm(line: str) -> bool:
    """Whether ``line`` (colour codes or not) is one of :data:`FALSE_ALARMS`."""
    return _ALARM.search(ANSI.sub("", line)) is not None


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
        if self.alarm.raised_in and _raised_in(error) != self.alarm.raised_in:
            return True
        if self.alarm.dropped and self.count >= self.alarm.dropped:
            return True
        self.count += 1
        return False


def _raised_in(error: BaseException | None) -> str:
    """The name of the function that raised ``error`` (its innermost traceback frame), or ""."""
    tb = error.__traceback__ if error is not None else None
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name if tb is not None else ""


def filter_false_alarm_records() -> None:
    """Attach an :class:`AlarmFilter` to the logger of every :data:`FALSE_ALARMS` entry that has one
    (once)."""
    for alarm in FALSE_ALARMS:
        if alarm.logger:
            logger = logging.getLogger(alarm.logger)
            if not any(isinstance(f, AlarmFilter) and f.alarm == alarm for f in logger.filters):
                logger.addFilter(AlarmFilter(alarm))


def quiet_third_parties() -> None:
    """Demote known third-party noise (hub progress bars, model-load reports, beta-feature warnings)
    to WARNING."""
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
    filter_false_alarm_records()


def project_handler(stream: TextIO | None = None) -> None:
    """This project's loggers (``sembridge_ray.*``) print through a handler of their own, in
    :data:`LOG_FORMAT`, at INFO: in a Ray worker, whose root logger has no handler (a Ray Data
    actor) or one of Ray Train's (message only), so a worker's progress lines read like the
    driver's. Idempotent."""
    logger = logging.getLogger("sembridge_ray")
    if any(getattr(h, "_sembridge", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler._sembridge = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


# ---- Ray's environment ----


def terminal_output() -> bool:
    """Whether both stdout and stderr are terminals (only then do colour codes belong in them)."""
    return os.isatty(1) and os.isatty(2)


def ray_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables that quieten Ray's forwarded worker lines, as set by
    :func:`apply_ray_environment`: ``RAY_COLOR_PREFIX=0`` unless both outputs are terminals, and
    :data:`FALSE_ALARMS` added to ``RAY_DEDUP_LOGS_SKIP_REGEX`` (read once, when Ray is imported). A
    value the user set is kept (a skip regex is extended)."""
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
    """Set :func:`ray_environment` in this process (before ``import ray`` for the skip regex to
    count)."""
    os.environ.update(ray_environment())


# ---- `ray job submit`'s own lines (cluster/local.sh) ----

_SUBMIT_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|SUCC|WARN|WARNING|ERR|ERROR)\s+\w+\.py:\d+ -- "
)
_SUBMIT_QUIET_WARNINGS = (
    # local.sh passes --working-dir as well as cluster/runtime_env.yaml's working_dir: the same
    # directory
    "Overriding runtime_env working_dir with --working-dir option",
    # cluster/runtime_env.yaml excludes them already
    "is now ignored by default when packaging the working directory",
)
_SUBMITTED = re.compile(r"Job '(raysubmit_\w+)' submitted successfully")


def job_submit_line(line: str, address: str = "") -> str | None:
    """A line of ``ray job submit``'s output as ``cluster/local.sh`` shows it: the CLI's own INFO
    and SUCC lines (packaging, banners, "next steps", the job supervisor's start-up) dropped but
    one, which says which job runs and how to stop it; its warnings and errors kept, but for two
    about local.sh's own settings and the rules around its banners; colour codes removed; the job's
    output as it is."""
    text = ANSI.sub("", line).rstrip("\r\n")
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
    return None if text.startswith("Running entrypoint for job raysubmit_") else text


def main() -> int:
    """``python -m sembridge_ray.runtime.logs ray-job-submit``: stdin through :func:`job_submit_line` to
    stdout, a line at a time (``cluster/local.sh`` pipes ``ray job submit`` through it)."""
    if sys.argv[1:] != ["ray-job-submit"]:
        print("usage: python -m sembridge_ray.runtime.logs ray-job-submit", file=sys.stderr)
        return 2
    address = os.environ.get("RAY_ADDRESS", "")
    for line in sys.stdin:
        if (shown := job_submit_line(line, address)) is not None:
            print(shown, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
