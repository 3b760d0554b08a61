"""The output lock across pid namespaces (containers sharing a hostname and an NFS output) and a
missing output."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sembridge_ray.cli import run_job
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.locks import (
    LOCK,
    SAME_HOST_STALE_S,
    STALE_AFTER_S,
    OutputLock,
    OutputLocked,
    check_unlocked,
    heartbeat_age,
    pid_namespace,
)
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
def test_a_dead_pid_of_another_namespace_is_held_while_its_heartbeat_is_fresh(
    tmp_path: Path, recorded: str
) -> None:
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
    """Another namespace, heartbeat past the same-host limit, but the pid runs here: it may be the
    owner (held until the heartbeat is older than STALE_AFTER_S, as for another host)."""
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


def test_an_output_under_a_dangling_symlink_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "out")
    with pytest.raises(
        InputError, match=f"output {link} is a symbolic link to {tmp_path / 'gone' / 'out'}, which"
    ):
        OutputLock(link).acquire()

    def body() -> int:
        OutputLock(link).acquire()
        return 0

    assert run_job(body) == 2
    target = tmp_path / "gone" / "out"
    assert error_lines(capsys) == [
        f"error: output {link} is a symbolic link to {target}, which does not exist"
    ]
    assert not (tmp_path / "gone").exists()


def test_a_live_owner_in_this_namespace_keeps_its_lock_however_old_its_heartbeat(
    tmp_path: Path,
) -> None:
    """The pid decides for a holder on this host and pid namespace: an owner paused for an hour
    (SIGSTOP, a frozen container) or an output filesystem whose clock is far behind must not lose
    its lock to an --overwrite."""
    from sembridge_ray.runtime.locks import _proc_start

    out = tmp_path / "out"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _write_lock(out, owner.pid, HOST, age_s=10 * STALE_AFTER_S, pid_ns=pid_namespace())
        lock = json.loads((out / LOCK).read_text())
        (out / LOCK).write_text(json.dumps({**lock, "proc_start": _proc_start(owner.pid)}))
        os.utime(out / LOCK, (time.time() - 10 * STALE_AFTER_S,) * 2)
        with pytest.raises(OutputLocked, match=f"pid {owner.pid} on host {HOST}"):
            OutputLock(out).acquire()
        with pytest.raises(OutputLocked):
            check_unlocked(out)
    finally:
        owner.kill()
        owner.wait()
    with OutputLock(out):  # once the owner is gone, its pid decides the other way at once
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()


def test_another_hosts_heartbeat_is_aged_on_the_output_filesystems_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine's clock an hour ahead of the output filesystem's (NFS with clock skew): another
    host's lock touched just now is fresh, as the filesystem stamps it; one touched longer ago than
    STALE_AFTER_S on that clock is stale."""
    out = tmp_path / "out"
    _write_lock(out, 4242, "another-host")
    os.utime(out / LOCK)  # touched now, on the filesystem's clock
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert heartbeat_age(out / LOCK) < 60
    with pytest.raises(OutputLocked, match="pid 4242 on host another-host"):
        OutputLock(out).acquire()
    monkeypatch.setattr(time, "time", real)
    os.utime(out / LOCK, (real() - STALE_AFTER_S - 60,) * 2)
    check_unlocked(out)
    assert [p.name for p in out.iterdir()] == [LOCK]  # the clock probes leave nothing behind
