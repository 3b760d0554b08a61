"""Resume after a simulated driver death: the whole process group is killed after the first
checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sembridge_ray.runtime.outputs import is_complete, read_identity
from tests.conftest import REPO
from tests.processes import session

STEPS = 8


def _job(out: Path, fixtures_root: Path, sick_beir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobs.finetune",
        "--config",
        "smoke",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(sick_beir),
        "--output",
        str(out),
        "--max-steps",
        str(STEPS),
        "--checkpoint-every",
        "2",
        "--batch-size",
        "4",
    ]


def _env() -> dict[str, str]:
    # Its own in-process cluster, which dies with its process group. Ray Train V2 takes in one
    # report per health check (2 s by default); a shorter interval keeps the
    # checkpoint-every-2-steps runs of this test short.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    }
    env.pop("RAY_ADDRESS", None)
    return env


def _kill_session(sid: int) -> None:
    """SIGKILL the driver's process group (driver, GCS, raylet), then the Ray workers it started:
    they run in process groups of their own within the driver's session."""
    os.killpg(sid, signal.SIGKILL)
    time.sleep(1)
    deadline = time.time() + 20
    while (left := session(sid)) and time.time() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def _latest(out: Path) -> int | None:
    """The step a rerun resumes from: the newest checkpoint that verifies."""
    from sembridge_ray.recipes.finetune.run import run_name
    from sembridge_ray.sparse.checkpoints import restore_point

    identity = read_identity(out)
    if identity is None:
        return None
    point = restore_point((out / "checkpoints" / run_name(identity)).resolve())
    return point[0] if point is not None else None


@pytest.mark.slow  # about 1.5 min (a run killed, then resumed): CI's slow step
def test_a_killed_run_resumes_from_its_checkpoint_and_ends_at_max_steps(
    fixtures_root, sick_beir, tmp_path
) -> None:
    out = tmp_path / "ft"
    cmd = _job(out, fixtures_root, sick_beir)
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            cmd, cwd=REPO, env=_env(), start_new_session=True, stdout=log, stderr=log
        )
        deadline = time.time() + 240
        try:
            while _latest(out) is None and time.time() < deadline and first.poll() is None:
                time.sleep(0.5)
        finally:
            _kill_session(first.pid)
            first.wait()
    killed_at = _latest(out)
    assert killed_at is not None, (tmp_path / "first.log").read_text()[-3000:]
    assert killed_at < STEPS, "the run finished before it could be killed"
    assert not is_complete(out)

    second = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    log_text = second.stdout + second.stderr
    assert second.returncode == 0, log_text[-3000:]
    assert f"resumed from step {killed_at}" in log_text
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["resumed_from"] == killed_at and summary["steps"] == STEPS and is_complete(out)
