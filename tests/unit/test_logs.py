"""The logging setup without Ray: Ray's known false alarms dropped, real errors kept, no colour
codes in a log file, the report after every log line, and ``ray job submit``'s own lines as
cluster/local.sh shows them."""

from __future__ import annotations

import logging
import re

import pytest

from sembridge_ray.runtime import logs
from sembridge_ray.runtime.logs import is_false_alarm, job_submit_line, ray_environment

# Ray's lines as they come: the driver's own C++ core (straight to fd 2), and a worker's, forwarded
# with its coloured prefix.
DRIVER_ALARM = (
    "[2026-12-03 06:23:13,876 E 19994 19994] core_worker.cc:2465: Actor with class name: "
    "'MapWorker(MapBatches(SparseEncodeUDF))' and ID: '56a52f15bafbe29cc3996f8b01000000' has constructor arguments "
    "in the object store and max_restarts > 0. If the arguments in the object store go out of scope or are lost, "
    "the actor restart will fail. See https://github.com/ray-project/ray/issues/53727 for more details."
)
WORKER_ALARM = (
    "\x1b[36m(TrainController pid=20767)\x1b[0m [2026-12-03 06:22:44,949 E 20767 20831] core_worker.cc:2465: "
    "Actor with class name: 'PreemptionWatcher' and ID: '8b1a' has constructor arguments in the object store and "
    "max_restarts > 0. If the arguments in the object store go out of scope or are lost, the actor restart will fail."
)
REAL_ERROR = "[2026-12-03 06:23:14,000 E 19994 19994] core_worker.cc:812: Failed to register worker to Raylet: IOError"


def test_the_known_false_alarms_and_nothing_else() -> None:
    assert is_false_alarm(DRIVER_ALARM) and is_false_alarm(WORKER_ALARM)
    assert not is_false_alarm(REAL_ERROR)
    assert not is_false_alarm(
        "2026-12-03 06:24:15,002 ERROR sembridge_ray.recipes.reproduce.run: cell x failed"
    )
    # not the C++ core's line
    assert not is_false_alarm("Actor with class name: 'A' has constructor arguments")
    assert all(alarm.why for alarm in logs.FALSE_ALARMS)


class GetTimeoutError(Exception):
    """Named as Ray's: the filter matches the class name, so these tests need no Ray."""


def test_ray_trains_transient_timeouts_are_dropped_twice_then_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    alarm = next(a for a in logs.FALSE_ALARMS if a.logger)
    logger = logging.getLogger(f"{alarm.logger}.test")  # a child: the filter is the test's alone
    logger.addFilter(logs.AlarmFilter(alarm))
    caplog.set_level(logging.WARNING, logger=logger.name)

    def warn(error: Exception, what: str = "send") -> None:
        try:
            raise error
        except Exception:
            logger.warning(
                "Failed to %s resource request for train-1. If this only happens ...",
                what,
                exc_info=True,
            )

    warn(ValueError("another cause"))  # shown: not the transient timeout
    warn(GetTimeoutError("Get timed out"))
    warn(GetTimeoutError("Get timed out"), "cancel")
    assert [r.exc_info[1].__class__.__name__ for r in caplog.records if r.exc_info] == [
        "ValueError"
    ]
    warn(GetTimeoutError("Get timed out"))  # the third: it persists, so it shows
    assert len(caplog.records) == 2
    logs.filter_false_alarm_records()
    logs.filter_false_alarm_records()
    assert (
        sum(isinstance(f, logs.AlarmFilter) for f in logging.getLogger(alarm.logger).filters) == 1
    )


def test_ray_environment_no_colour_in_files_and_the_alarms_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logs, "terminal_output", lambda: False)
    env = ray_environment({})
    assert env["RAY_COLOR_PREFIX"] == "0"
    skip = env["RAY_DEDUP_LOGS_SKIP_REGEX"]
    assert re.search(skip, WORKER_ALARM) and not re.search(skip, REAL_ERROR)
    assert ray_environment({"RAY_COLOR_PREFIX": "1", "RAY_DEDUP_LOGS_SKIP_REGEX": "mine"}) == {
        "RAY_DEDUP_LOGS_SKIP_REGEX": f"mine|{skip}"
    }
    assert ray_environment({"RAY_DEDUP_LOGS_SKIP_REGEX": skip, "RAY_COLOR_PREFIX": "0"}) == {}
    monkeypatch.setattr(logs, "terminal_output", lambda: True)
    assert "RAY_COLOR_PREFIX" not in ray_environment({})


SUBMIT = """\
2026-12-03 06:28:41,770\tINFO cli.py:42 -- Job submission server address: http://127.0.0.1:59265
2026-12-03 06:28:41,772\tWARN dashboard_sdk.py:71 -- Overriding runtime_env working_dir with --working-dir option
2026-12-03 06:28:41,772\tWARNING working_dir.py:101 -- Directory '.git' is now ignored by default when packaging \
the working directory. To disable this behavior, set the `RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES=''` variable.
2026-12-03 06:28:41,774\tINFO packaging.py:385 -- Ignoring upload to cluster for these files: [PosixPath('x')]
2026-12-03 06:28:42,878\tSUCC cli.py:66 -- \x1b[32m-------------------------------------------------------\x1b[39m
2026-12-03 06:28:42,878\tSUCC cli.py:67 -- \x1b[32mJob 'raysubmit_xT9r3xEVx2ZtxcQQ' submitted successfully\x1b[39m
2026-12-03 06:28:42,878\tINFO cli.py:333 -- ray job logs raysubmit_xT9r3xEVx2ZtxcQQ
2026-12-03 06:28:42,683\tINFO job_manager.py:581 -- Runtime env is setting up.
Running entrypoint for job raysubmit_xT9r3xEVx2ZtxcQQ: python -m jobs.demo --output /x
2026-12-03 06:28:49,000 INFO sembridge_ray.distributed.cluster: Ray cluster at 127.0.0.1:1: 1 node(s), 2 CPUs
2026-12-03 06:28:49,100\tWARN dashboard_sdk.py:90 -- Something the user should see
2026-12-03 06:28:49,943\tERR cli.py:74 -- ---------------------------------------
2026-12-03 06:28:49,943\tERR cli.py:70 -- Job 'raysubmit_xT9r3xEVx2ZtxcQQ' failed
"""


def test_ray_job_submit_says_which_job_and_keeps_what_matters() -> None:
    shown = [
        s
        for line in SUBMIT.splitlines()
        if (s := job_submit_line(line, "http://127.0.0.1:59265")) is not None
    ]
    assert shown == [
        "[local.sh] submitted job raysubmit_xT9r3xEVx2ZtxcQQ (to stop it: ray job stop raysubmit_xT9r3xEVx2ZtxcQQ "
        "--address http://127.0.0.1:59265)",
        "2026-12-03 06:28:49,000 INFO sembridge_ray.distributed.cluster: Ray cluster at 127.0.0.1:1: 1 node(s), 2 CPUs",
        "2026-12-03 06:28:49,100\tWARN dashboard_sdk.py:90 -- Something the user should see",
        "2026-12-03 06:28:49,943\tERR cli.py:70 -- Job 'raysubmit_xT9r3xEVx2ZtxcQQ' failed",
    ]
