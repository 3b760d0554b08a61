"""Faults on one node: a shard actor killed mid-search, a Ray Train worker killed mid-run, a full
disk under the checkpoints, a job's processes after it exits, and the private head of
cluster/local.sh beside another cluster."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import ray
import torch
from safetensors.torch import load_file

from benchmarks.synthetic import sparse_vectors, zipf_probs
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.finetune.config import FinetuneConfig, OptimConfig
from sembridge_ray.retrieval.index import build_shard, shard_bounds
from sembridge_ray.retrieval.sharded import ShardedIndex
from sembridge_ray.runtime.outputs import is_complete
from tests.conftest import REPO
from tests.processes import outliving


def _env() -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    }
    env.pop("RAY_ADDRESS", None)
    return env


def _processes(pattern: str) -> list[int]:
    """Processes below this test process whose command line matches ``pattern`` (Ray names its
    workers)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if re.search(pattern, " ".join(proc.cmdline())):
                found.append(proc.pid)
    return found


def test_a_killed_shard_actor_is_restarted_and_the_answers_are_identical(ray_cluster) -> None:
    rng = np.random.default_rng(0)
    probs = zipf_probs(3000, 1.1, rng)
    docs, queries = sparse_vectors(3000, 60, probs, rng), sparse_vectors(64, 12, probs, rng)
    ranks = np.arange(3000, dtype=np.int64)
    shards = [
        build_shard(docs.slice(a, b), ranks[a:b], 3000) for a, b in shard_bounds(3000, 1000, 1)
    ]
    index = ShardedIndex.start(RayExecutor(), shards, size=1 << 30, cpus=0.5)  # on actors
    try:
        undisturbed = index.search(queries, 10, batch_size=8)
        for round_ in range(2):  # the second time, the restarted actor dies again
            victim = index.pids()[1]
            os.kill(victim, signal.SIGKILL)
            disturbed = index.search(queries, 10, batch_size=8)
            np.testing.assert_array_equal(disturbed.ranks, undisturbed.ranks)
            np.testing.assert_array_equal(disturbed.scores, undisturbed.scores)
            assert victim not in index.pids(), round_
    finally:
        index.shutdown()


def test_a_job_leaves_no_ray_process_behind(
    ray_cluster, fixtures_root: Path, tmp_path: Path
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "jobs.init_embeddings",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--target-tokenizer",
        str(fixtures_root / "tok-wordpiece"),
        "--bridge-model",
        str(fixtures_root / "bridge"),
        "--output",
        str(tmp_path / "out"),
        f"cache_dir={tmp_path / 'cache'}",
        "--workers",
        "1",
        "samples=2",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-3000:]
    assert outliving(proc.pid) == [], "Ray processes of the job outlived it"
    assert "multiple active Ray instances" not in log  # the test's own cluster runs beside it


@pytest.fixture(scope="module")
def undisturbed(
    ray_cluster, fixtures_root: Path, sick_beir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    from sembridge_ray.recipes.finetune.run import run_finetune

    out = tmp_path_factory.mktemp("ft") / "undisturbed"
    run_finetune(_ft_cfg(fixtures_root, sick_beir, out), executor=RayExecutor())
    return out


def _ft_cfg(fixtures_root: Path, sick_beir: Path, out: Path, **kw: Any) -> FinetuneConfig:
    return FinetuneConfig(
        model=str(fixtures_root / "bert-mlm"),
        train=str(sick_beir),
        output=str(out),
        max_query_length=32,
        max_doc_length=64,
        checkpoint_every=2,
        log_every=1,
        optim=OptimConfig(batch_size=8, max_steps=10, lr=1e-4),
        **kw,
    )


def test_a_killed_train_worker_costs_at_most_checkpoint_every_steps(
    undisturbed: Path,
    fixtures_root: Path,
    sick_beir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sembridge_ray.recipes.finetune.run import run_finetune

    out = tmp_path / "disturbed"
    killed: dict[str, int] = {}

    def kill_after_a_checkpoint() -> None:
        deadline = time.time() + 600
        while time.time() < deadline and "step" not in killed:
            ckpts = sorted((out / "checkpoints").glob("finetune-*/step_0000000[4-9]"))
            workers = _processes(r"RayTrainWorker")
            if ckpts and len(workers) >= 2:
                killed["step"] = int(ckpts[-1].name[-8:])
                os.kill(workers[-1], signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_after_a_checkpoint, daemon=True)
    killer.start()
    with caplog.at_level("WARNING"):
        result = run_finetune(_ft_cfg(fixtures_root, sick_beir, out), executor=RayExecutor())
    killer.join(timeout=5)
    assert "step" in killed, "the run ended before a worker could be killed"
    restart = re.search(
        r"training failed \(attempt 1 of 4\).*restarting from step (\d+)", caplog.text
    )
    # at most checkpoint_every steps lost
    assert restart and int(restart.group(1)) >= killed["step"] - 2
    assert result.steps == 10 and is_complete(out)
    assert [m["step"] for m in _metrics(out)] == list(range(1, 11))
    a, b = (
        load_file(out / "model" / "model.safetensors"),
        load_file(undisturbed / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in _lines(out / "metrics.jsonl")]


def test_a_full_disk_under_the_checkpoints_fails_fast_with_one_line(
    ray_cluster, fixtures_root: Path, sick_beir: Path, tmp_path: Path
) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        cmd = [
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
            str(tmp_path / "ft"),
            f"storage={mount}",
        ]
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600
        )
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(errors) == 1 and "(disk full)" in errors[0] and str(mount) in errors[0], (
            proc.stderr[-3000:]
        )
        # not retried: it would fail the same way
        assert "training failed (attempt" not in proc.stderr
        assert not is_complete(tmp_path / "ft")
        print(f"failed fast in {time.perf_counter() - start:.1f} s")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_local_sh_uses_a_private_head_and_leaves_other_clusters_alone(
    ray_cluster, tmp_path: Path
) -> None:
    if not (REPO / ".venv" / "bin" / "ray").is_file():
        pytest.skip(
            "cluster/local.sh needs the project's .venv (made by `bash cluster/local.sh setup`)"
        )
    ours = ray_cluster.address
    raylets = _processes(r"raylet/raylet")
    code = "import sembridge_ray.distributed.cluster as c; print('JOB_SAW', c.connect().address)"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        ["bash", "cluster/local.sh", "job", "--", "python", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = re.search(r"JOB_SAW (\S+)", proc.stdout).group(1)  # type: ignore[union-attr]
    assert seen != ours and seen.startswith("127.0.0.1:")
    head = int(re.search(r"stopping the private Ray head \(pid (\d+)\)", proc.stdout).group(1))  # type: ignore[union-attr]
    assert outliving(head) == [], "processes of the private head outlived local.sh"
    # the other cluster is untouched
    assert ray.get(ray.remote(lambda: "alive").remote()) == "alive"
    assert set(raylets) <= set(_processes(r"raylet/raylet"))
