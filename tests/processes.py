"""The processes of a session, for the tests that a job's Ray processes do not outlive it."""

from __future__ import annotations

import subprocess
import time


def session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies are exited: only their parent's wait is
    missing)."""
    ps = subprocess.run(
        ["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True
    ).stdout.split()
    rows = zip(ps[::3], ps[1::3], ps[2::3], strict=True)
    return [int(pid) for pid, s, stat in rows if int(s) == sid and not stat.startswith("Z")]


def outliving(sid: int, timeout: float = 30.0) -> list[str]:
    """The command lines of the processes of session ``sid`` still alive after ``timeout`` seconds:
    a process that is exiting on its own when the check starts (a loaded machine) is not left
    behind."""
    deadline = time.monotonic() + timeout
    while (left := session(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return []
    pids = ",".join(map(str, left))
    ps = subprocess.run(
        ["ps", "-o", "pid=,stat=,args=", "-p", pids], capture_output=True, text=True
    )
    return ps.stdout.splitlines()
