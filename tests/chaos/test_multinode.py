"""Jobs on a simulated multi-node cluster (Ray's own ``ray.cluster_utils.Cluster``: a head and
worker nodes as separate raylets on 127.0.0.1), reached through ``RAY_ADDRESS`` as a user's jobs
are. A worker node is removed in the middle of each stage (and a fresh one added where the stage
needs the capacity back); every job must finish with the same artefacts or metrics as an undisturbed
run.

The head has no CPUs, so all work lands on the worker nodes and losing one always costs running
work."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from sembridge_ray.runtime.outputs import is_complete
from tests.conftest import REPO
from tests.ray.test_reproduce import miracl_mirror

pytestmark = pytest.mark.chaos


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SimCluster:
    """A head (0 CPUs) and ``workers`` one-CPU nodes; jobs run as subprocesses with ``RAY_ADDRESS``
    pointing here."""

    def __init__(self, tmp: Path, workers: int = 2) -> None:
        import ray._private.utils
        from ray.cluster_utils import Cluster

        port = _free_port()
        # Workers of every node see this cluster's address (Ray Train's cleaner must not find
        # another instance), and the user's "current cluster" file in /tmp/ray is left alone.
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        keep = ray._private.utils.write_ray_address
        ray._private.utils.write_ray_address = lambda *a, **k: None
        try:
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 0,
                    "gcs_server_port": port,
                    "dashboard_port": _free_port(),
                    "dashboard_host": "127.0.0.1",
                    "temp_dir": str(tmp / "ray"),
                },
            )
        finally:
            ray._private.utils.write_ray_address = keep
        self.nodes = [self.add() for _ in range(workers)]

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self) -> Any:
        node = self.cluster.add_node(num_cpus=1, object_store_memory=200 * 1024 * 1024)
        self.cluster.wait_for_nodes()
        return node

    def remove_one(self) -> None:
        self.cluster.remove_node(self.nodes.pop(0), allow_graceful=False)

    def shutdown(self) -> None:
        self.cluster.shutdown()
        os.environ.pop("RAY_ADDRESS", None)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    cluster = SimCluster(tmp_path_factory.mktemp("sim"))
    yield cluster
    cluster.shutdown()


def _start(args: list[str], address: str | None, log: Path) -> subprocess.Popen:
    # small inputs on actors too (cluster.in_driver), so that the faults below hit the actors' work
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "SEMBRIDGE_IN_DRIVER_ROWS": "0",
    }
    env.pop("RAY_ADDRESS", None)
    if address:
        env["RAY_ADDRESS"] = address
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )


def _job(args: list[str], address: str | None, log: Path, timeout: float = 1200) -> None:
    proc = _start(args, address, log)
    assert proc.wait(timeout=timeout) == 0, log.read_text()[-4000:]


def _disturbed(
    sim: SimCluster, args: list[str], log: Path, ready: Callable[[], bool], timeout: float = 1200
) -> None:
    """Run a job on ``sim``; when ``ready()`` says the stage is under way, remove a worker node and
    add a fresh one (Ray's node API wants the main thread, so the job is polled here). The fault
    must come before the job ends."""
    proc = _start(args, sim.address, log)
    deadline = time.time() + timeout
    while proc.poll() is None and not ready() and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, (
        "the job finished before the fault could be injected: " + log.read_text()[-2000:]
    )
    sim.remove_one()
    sim.nodes.append(sim.add())
    assert proc.wait(timeout=max(1.0, deadline - time.time())) == 0, log.read_text()[-4000:]


def _exists(pattern: str, root: Path) -> Callable[[], bool]:
    return lambda: any(root.glob(pattern))


def test_smoke_evaluation_on_three_nodes_equals_in_process_and_survives_a_lost_node(
    sim: SimCluster, tmp_path: Path
) -> None:
    base = ["jobs.evaluate", "--config", "smoke"]
    _job([*base, "--output", str(tmp_path / "local")], None, tmp_path / "local.log")
    _job([*base, "--output", str(tmp_path / "nodes")], sim.address, tmp_path / "nodes.log")
    expected = (tmp_path / "local" / "run.trec").read_bytes()
    assert (tmp_path / "nodes" / "run.trec").read_bytes() == expected
    # the corpus is being encoded (its staging directory exists) when a node goes
    _disturbed(
        sim,
        [*base, "--output", str(tmp_path / "lost")],
        tmp_path / "lost.log",
        _exists("cache/.tmp-docs-*/staged/*.parquet", tmp_path / "lost"),
    )
    assert (tmp_path / "lost" / "run.trec").read_bytes() == expected
    assert (
        json.loads((tmp_path / "lost" / "metrics.json").read_text())["nDCG@10"]
        == json.loads((tmp_path / "local" / "metrics.json").read_text())["nDCG@10"]
    )


def _init_args(fixtures_root: Path, out: Path, cache: Path) -> list[str]:
    return [
        "jobs.init_embeddings",
        "--model",
        str(fixtures_root / "roberta-mlm"),
        "--target-tokenizer",
        str(fixtures_root / "tok-unigram"),
        "--bridge-model",
        str(fixtures_root / "bridge"),
        "--output",
        str(out),
        f"cache_dir={cache}",
        "bridge_batch_size=64",
        "rows_batch_size=200",
        "--workers",
        "2",
    ]


def test_init_survives_a_lost_node_with_identical_artefacts(
    sim: SimCluster, fixtures_root: Path, tmp_path: Path
) -> None:
    _job(
        _init_args(fixtures_root, tmp_path / "local", tmp_path / "c1"), None, tmp_path / "local.log"
    )
    # the source side's bridge vectors are cached: the target side and the weights stage are running
    _disturbed(
        sim,
        _init_args(fixtures_root, tmp_path / "lost", tmp_path / "c2"),
        tmp_path / "lost.log",
        _exists("[!.]*/vectors.parquet", tmp_path / "c2"),  # a published entry, not a temporary
    )
    for name in ("model/model.safetensors", "provenance.parquet"):
        assert (tmp_path / "lost" / name).read_bytes() == (
            tmp_path / "local" / name
        ).read_bytes(), name
    assert is_complete(tmp_path / "lost")


def _ft_args(fixtures_root: Path, sick_beir: Path, out: Path) -> list[str]:
    return [
        "jobs.finetune",
        "--config",
        "smoke",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(sick_beir),
        "--output",
        str(out),
        "--workers",
        "2",
        "--max-steps",
        "8",
        "--checkpoint-every",
        "2",
    ]


def test_finetune_on_two_nodes_survives_a_lost_node_with_identical_weights(
    sim: SimCluster, fixtures_root: Path, sick_beir: Path, tmp_path: Path
) -> None:
    _job(_ft_args(fixtures_root, sick_beir, tmp_path / "local"), None, tmp_path / "local.log")
    _disturbed(
        sim,
        _ft_args(fixtures_root, sick_beir, tmp_path / "lost"),
        tmp_path / "lost.log",
        _exists("checkpoints/finetune-*/step_00000004/complete-rank*.json", tmp_path / "lost"),
    )
    log = (tmp_path / "lost.log").read_text()
    assert "training failed (attempt 1 of 4)" in log and "restarting from step" in log
    a, b = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("lost", "local"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [
        json.loads(x)["step"]
        for x in (tmp_path / "lost" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, 9))


def test_two_cell_reproduction_survives_a_lost_node_with_the_same_results(
    sim: SimCluster, fixtures_root: Path, sick_beir: Path, tmp_path: Path
) -> None:
    mirror = miracl_mirror(sick_beir, tmp_path / "mirror")

    def args(out: Path) -> list[str]:
        return [
            "jobs.reproduce",
            "--preset",
            "paper",
            "--output",
            str(out),
            "--model",
            str(fixtures_root / "bert-mlm"),
            "--languages",
            "ko",
            "--datasets",
            "miracl",
            "--methods",
            "sembridge,mean",
            "--alphas",
            "4",
            "--max-concurrent",
            "1",
            f"miracl_mirror={mirror}",
            f"target_tokenizers=ko={fixtures_root / 'tok-wordpiece'}",
            f"init.bridge_model={fixtures_root / 'bridge'}",
            "init.resources.workers=1",
            "evaluate.resources.workers=1",
            "evaluate.doc_max_active_dims=64",
            "finetune.resources.workers=1",
            "finetune.optim.batch_size=8",
            "finetune.optim.max_steps=4",
            "finetune.checkpoint_every=2",
            "finetune.max_query_length=32",
            "finetune.max_doc_length=64",
            "finetune.log_every=1",
        ]

    _job(args(tmp_path / "local"), None, tmp_path / "local.log")
    _disturbed(
        sim,
        args(tmp_path / "lost"),
        tmp_path / "lost.log",
        _exists("cells/*/miracl/zero_shot/_SUCCESS", tmp_path / "lost"),
    )

    def rows(out: Path) -> list[dict[str, str]]:
        keep = (
            "model",
            "language",
            "dataset",
            "method",
            "alpha",
            "stage",
            "ndcg@10",
            "r@100",
            "rr@10",
            "train_steps",
        )
        return [
            {k: r[k] for k in keep}
            for r in csv.DictReader((out / "results.csv").open(encoding="utf-8"))
        ]

    # two cells × two stages, each with its fusion with BM25, and BM25 beside each stage
    assert (
        rows(tmp_path / "lost") == rows(tmp_path / "local") and len(rows(tmp_path / "local")) == 10
    )
    shutil.rmtree(tmp_path / "mirror")
