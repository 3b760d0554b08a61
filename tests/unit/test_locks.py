"""The output lock across pid namespaces (containers sharing a hostname and an NFS output) and a missing output."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from sembridge_ray.cli import run_job
from sembridge_ray.errors import InputError
from sembridge_ray.locks import LOCK, SAME_HOST_STALE_S, OutputLock, OutputLocked, check_unlocked, pid_namespace
from tests.conftest import error_lines
from tests.unit.test_outputs import _dead_pid, _write_lock

HOST = socket.gethostname()


def _other_namespace() -> str:
    boot, _, _ = pid_namespace().partition("/")
    return f"{boot}/pid:[1]"  # the same kernel, another namespace (a sibling container)


def test_the_namespace_names_this_kernel_and_pid_namespace() -> None:
    boot, _, namespace = pid_namespace().partition("/")
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert namespace == os.readlink("/proc/self/ns/pid")


@pytest.mark.parametrize("recorded", ["other", "unrecorded"])
def test_a_dead_pid_of_another_namespace_is_held_while_its_heartbeat_is_fresh(tmp_path: Path, recorded: str) -> None:
    out = tmp_path / "out"
    pid_ns = _other_namespace() if recorded == "other" else ""
    _write_lock(out, _dead_pid(), HOST, age_s=SAME_HOST_STALE_S / 3, pid_ns=pid_ns)
    hint = "in another pid namespace" if pid_ns else "pid namespace not recorded"
    with pytest.raises(OutputLocked, match=hint):
        OutputLock(out).acquire()
    with pytest.raises(OutputLocked):
        check_unlocked(out)
    _write_lock(out, _dead_pid(), HOST, age_s=SAME_HOST_STALE_S + 10, pid_ns=pid_ns)
    check_unlocked(out)
    with OutputLock(out):
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    assert not (out / LOCK).exists()


def test_an_old_heartbeat_does_not_break_a_lock_whose_pid_runs(tmp_path: Path) -> None:
    """Another namespace, heartbeat past the same-host limit, but the pid runs here: it may be the owner (held until
    the heartbeat is older than STALE_AFTER_S, as for another host)."""
    out = tmp_path / "out"
    _write_lock(out, os.getppid(), HOST, age_s=SAME_HOST_STALE_S + 10, pid_ns=_other_namespace())
    with pytest.raises(OutputLocked, match=f"pid {os.getppid()} on host {HOST}"):
        OutputLock(out).acquire()


def test_a_lock_written_by_a_newer_version_is_read(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write_lock(out, os.getpid(), HOST, pid_ns=pid_namespace())
    data = json.loads((out / LOCK).read_text())
    (out / LOCK).write_text(json.dumps({**data, "added_later": 1}))
    with pytest.raises(OutputLocked, match=f"pid {os.getpid()} on host {HOST} \\(started [^,]*\\)"):
        OutputLock(out).acquire()


def test_an_output_under_a_dangling_symlink_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "out")
    with pytest.raises(InputError, match=f"output {link} is a symbolic link to {tmp_path / 'gone' / 'out'}, which"):
        OutputLock(link).acquire()

    def body() -> int:
        OutputLock(link).acquire()
        return 0

    assert run_job(body) == 2
    target = tmp_path / "gone" / "out"
    assert error_lines(capsys) == [f"error: output {link} is a symbolic link to {target}, which does not exist"]
    assert not (tmp_path / "gone").exists()
