"""Fine-tuning never resumes from a damaged checkpoint: a whole job SIGKILLed, its newest
checkpoints truncated, rerun (each job in its own process and cluster, as a user runs them). Fault
injection: marker ``chaos``."""

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
import torch
from safetensors.torch import load_file

from sembridge_ray.runtime.outputs import is_complete
from sembridge_ray.sparse.checkpoints import REGISTRY, STATE, checkpoint_dirs, step_of
from tests.conftest import REPO
from tests.ray.test_finetune_resume import _env

pytestmark = pytest.mark.chaos
STEPS, EVERY = 12, 2


def _job(
    out: Path, fixtures_root: Path, sick_beir: Path, *extra: str, every: int = EVERY
) -> list[str]:
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
        str(every),
        "--batch-size",
        "4",
        *extra,
    ]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)


def _registered(root: Path) -> tuple[Path, int] | None:
    """(run directory, newest step Ray Train registered) of the run under ``root``, once it
    registered one."""
    for registry in root.glob(f"**/finetune-*/{REGISTRY}"):
        try:
            latest = json.loads(registry.read_text())["latest_checkpoint_result"]
        except (OSError, ValueError):  # being written
            continue
        step = step_of(latest["checkpoint_dir_name"]) if latest else None
        if step is not None:
            return registry.parent, step
    return None


def _alive(sid: int) -> list[int]:
    """The processes of session ``sid`` that have not exited (zombies left out)."""
    ps = subprocess.run(
        ["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True
    ).stdout.split("\n")
    rows = [line.split() for line in ps if line.strip()]
    return [int(pid) for pid, s, stat, *_ in rows if int(s) == sid and not stat.startswith("Z")]


def _kill_now(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the job's session at once (driver, GCS, raylet, Train controller and
    workers), so that training stops about where it was seen, and wait until none is left."""
    deadline = time.time() + 30
    while (left := _alive(job.pid)) and time.time() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    job.wait()


def test_a_truncated_newest_checkpoint_is_set_aside_and_the_run_resumes_to_the_undisturbed_model(
    fixtures_root: Path, sick_beir: Path, tmp_path: Path
) -> None:
    undisturbed = tmp_path / "undisturbed" / "ft"
    straight = _run(_job(undisturbed, fixtures_root, sick_beir))
    assert straight.returncode == 0, straight.stderr[-3000:]

    out = tmp_path / "damaged" / "ft"
    cmd = _job(out, fixtures_root, sick_beir)
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            cmd, cwd=REPO, env=_env(), start_new_session=True, stdout=log, stderr=log
        )
        deadline = time.time() + 300
        # interrupted once a second checkpoint is registered, so that an earlier complete one exists
        try:
            while (
                (seen := _registered(out.parent)) is None or seen[1] < 2 * EVERY
            ) and first.poll() is None:
                assert time.time() < deadline, (tmp_path / "first.log").read_text()[-3000:]
                time.sleep(0.1)
        finally:
            _kill_now(first)
    found = _registered(out.parent)
    assert found is not None, (tmp_path / "first.log").read_text()[-3000:]
    run_dir, registered = found
    assert registered < STEPS and not is_complete(out), (
        "the run finished before it could be interrupted"
    )
    # The registered checkpoint, and any the workers wrote after it before they died, lose half
    # their state.pt: the newest checkpoint that verifies is then the one before the registered one.
    for step, directory in checkpoint_dirs(run_dir):
        if step >= registered and (directory / STATE).is_file():
            state = directory / STATE
            state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])

    second = _run(cmd)
    log_text = second.stdout + second.stderr
    assert second.returncode == 0, log_text[-3000:]
    previous = registered - EVERY
    assert (
        f"resumed from step {previous} " in log_text and "training failed (attempt" not in log_text
    )
    warnings = [line for line in log_text.splitlines() if "does not verify" in line]
    assert (
        len(warnings) == 1
        and f"step_{registered:08d}" in warnings[0]
        and "set aside as" in warnings[0]
    )
    # beside the run, not deleted
    assert len(list(run_dir.glob(f"step_{registered:08d}.damaged-*"))) == 1
    assert json.loads((out / "finetune.json").read_text())[
        "resumed_from"
    ] == previous and is_complete(out)
    assert [
        json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ] == list(range(1, STEPS + 1))
    a, b = (
        load_file(out / "model" / "model.safetensors"),
        load_file(undisturbed / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
