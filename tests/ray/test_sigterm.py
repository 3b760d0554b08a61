"""SIGTERM (preemption, ``kill``, ``docker stop``) ends a running job with one line and exit 143
within 5 s (a scheduler's grace period): its output lock released, nothing marked complete, and the
in-process Ray cluster it started shut down with all its processes. Wall-clock bounds: these tests
are ``slow``, outside the default suite."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sembridge_ray.data.sick import write_sick_beir
from sembridge_ray.resources import sick_dir
from sembridge_ray.runtime.locks import LOCK
from sembridge_ray.runtime.outputs import SUCCESS
from tests.conftest import REPO
from tests.processes import outliving
from tests.ray.test_faults import _env

# Log lines, which may come at any time: this project's and Ray's Python loggers, Ray's C++ logs
# ("[2026-...]"), and what Ray's workers print, forwarded with their name and pid ("(MapWorker(...)
# pid=123) ...", colored).
LOG = re.compile(r"^\[?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|^(\x1b\[[0-9;]*m)?\(.*\bpid=\d+\)")


@pytest.mark.slow
def test_sigterm_while_encoding_ends_the_job_with_one_line_and_143(
    fixtures_root: Path, tmp_path: Path
) -> None:
    # all of SICK: ~5000 documents, encoding takes a while
    data = write_sick_beir(sick_dir(), tmp_path / "sick")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "jobs.evaluate",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--dataset",
        str(data),
        "--output",
        str(out),
        f"cache_dir={tmp_path / 'cache'}",
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    before = []
    assert proc.stderr is not None
    # running: its cluster is up, the output claimed, the corpus staged for encoding
    for line in proc.stderr:
        before.append(line)
        if "Ray cluster at" in line:
            break
    assert proc.poll() is None and (out / LOCK).is_file(), "".join(before)[-3000:]
    seconds, after = _terminate(proc)
    said = [line for line in after.splitlines() if line.strip() and not LOG.match(line)]
    assert (proc.returncode, said) == (143, ["error: terminated (SIGTERM)"]), after[-3000:]
    assert seconds < 5, f"the job took {seconds:.1f} s to end after SIGTERM"
    assert not (out / LOCK).exists() and not (out / SUCCESS).exists()
    assert outliving(proc.pid) == [], "Ray processes of the job outlived it"


def _terminate(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """SIGTERM ``proc``: (seconds until the process is gone, what it wrote to stderr after the
    signal). Its stderr is read apart from the wait: a pipe may stay open a little longer than the
    process."""
    assert proc.stderr is not None
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    reader.start()
    proc.wait(timeout=120)
    seconds = time.monotonic() - start
    reader.join(60)
    return seconds, "".join(rest)


@pytest.mark.slow
def test_sigterm_while_training_ends_the_job_within_5_s_lock_released(
    fixtures_root: Path, tmp_path: Path
) -> None:
    """Two Ray Train workers mid-run: Ray Train's workers and the cluster are gone, the checkpoints
    kept."""
    data = write_sick_beir(sick_dir(), tmp_path / "sick")
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "jobs.finetune",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(data),
    ]
    cmd += ["--output", str(out), "--epochs", "5", "--batch-size", "8", "--max-doc-length", "32"]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    before = []
    for line in proc.stderr:  # training: the workers have taken steps
        before.append(line)
        if "step 20/" in line:
            break
    assert proc.poll() is None and (out / LOCK).is_file(), "".join(before)[-3000:]
    seconds, after = _terminate(proc)
    said = [line for line in after.splitlines() if line.strip() and not LOG.match(line)]
    assert (proc.returncode, said) == (143, ["error: terminated (SIGTERM)"]), after[-3000:]
    assert seconds < 5, f"the job took {seconds:.1f} s to end after SIGTERM"
    assert not (out / LOCK).exists() and not (out / SUCCESS).exists()
    assert outliving(proc.pid) == [], "Ray processes of the job outlived it"
