"""`ray job submit` to a loopback head runs an entrypoint from `--working-dir .` that imports the
package."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A `ray start --head --block` on loopback, stopped by signalling that process (not `ray stop`,
    which would kill every Ray process of the user)."""
    if not shutil.which(RAY):
        pytest.skip("ray CLI not found")
    gcs, dash = _free_port(), _free_port()
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            "--num-cpus=1",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + READY_S
    while subprocess.run(
        [RAY, "job", "list", "--address", address], env=env, capture_output=True
    ).returncode:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.terminate()
            pytest.fail("the local Ray head did not come up")
        time.sleep(1)
    yield address, env
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


READY_S = 600
"""How long the head and its job agent get to answer, and a submission to go through: generous,
since the tests wait on readiness (a loaded machine takes minutes), never on a fixed sleep."""
NOT_READY = (
    "No available agent",
    "Connection aborted",
    "RemoteDisconnected",
    "timed out",
    "Timeout",
)
"""What ``ray job submit`` says while the head's job agent cannot take a job yet."""


def _submit(head: tuple[str, dict[str, str]], code: str) -> subprocess.CompletedProcess[str]:
    """Submit, retrying with backoff while the new head's job agent is not up yet or does not answer
    in time (a loaded machine), until :data:`READY_S`."""
    address, env = head
    deadline = time.monotonic() + READY_S
    attempt = 0
    while True:
        try:
            result = _submit_once(address, env, code, max(60.0, deadline - time.monotonic()))
        # the CLI itself hung waiting on the head: not ready either
        except subprocess.TimeoutExpired as err:
            result = subprocess.CompletedProcess(
                err.cmd, 1, "", f"submission timed out after {err.timeout:.0f} s"
            )
        said = result.stdout + result.stderr
        not_ready = any(m in said for m in NOT_READY)
        if (
            result.returncode == 0
            or not not_ready
            or "submitted successfully" in said
            or time.monotonic() > deadline
        ):
            return result
        time.sleep(min(2**attempt, 10))
        attempt += 1


def _submit_once(
    address: str, env: dict[str, str], code: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            RAY,
            "job",
            "submit",
            "--address",
            address,
            "--runtime-env",
            "cluster/runtime_env.yaml",
            "--working-dir",
            ".",
            "--",
            "python",
            "-c",
            code,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_submitted_job_imports_the_package_and_sees_the_cluster(
    head: tuple[str, dict[str, str]],
) -> None:
    code = (
        "import os, ray, sembridge_ray, sembridge_ray.distributed.cluster as c; info = c.connect(); "
        "print('PKG', sembridge_ray.__version__, 'CPUS', info.cpus, 'ADDR', info.address)"
    )
    result = _submit(head, code)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("PKG"))
    assert "CPUS 1.0" in line and "ADDR 127.0.0.1:" in line


def test_failing_entrypoint_fails_the_submit(head: tuple[str, dict[str, str]]) -> None:
    assert _submit(head, "raise SystemExit(3)").returncode != 0


def test_submitted_job_finds_the_bundled_data(head: tuple[str, dict[str, str]]) -> None:
    """The assets (``assets/``, kept out of the package's wheel) reach the job: installed on the
    node, or in the working directory's copy beside the package (cluster/runtime_env.yaml)."""
    from tests.unit.test_assets import ORIGINAL

    name = "data/sick2014/SICK_train.txt"
    code = (
        "import hashlib; from sembridge_ray.resources import asset; "
        f"print('SHA', hashlib.sha256(asset({name!r}).read_bytes()).hexdigest())"
    )
    result = _submit(head, code)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"SHA {ORIGINAL[name]}" in result.stdout
