"""Ray side of the MaLSTM job: the driver prepares the data once, every restart (seed) trains as its
own Ray task, and the driver reports the best one by validation MSE."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from sembridge_ray import resources
from sembridge_ray.recipes.malstm.config import MalstmConfig, MalstmResult
from sembridge_ray.runtime.config import write_config
from sembridge_ray.runtime.executor import Executor, Tasks
from sembridge_ray.runtime.identity import path_identity
from sembridge_ray.runtime.logs import setup_logging
from sembridge_ray.runtime.outputs import claim_output
from sembridge_ray.runtime.progress import Progress
from sembridge_ray.siamese import augment as aug
from sembridge_ray.siamese.config import MINILM_CONTEXT, PretrainConfig, TrainConfig
from sembridge_ray.siamese.loop import RestartResult, train_restart
from sembridge_ray.siamese.prepare import Prepared, find_wordnet, prepare
from sembridge_ray.siamese.results import write_results
from sembridge_ray.siamese.vectors import parse_source, vectors_identity

log = logging.getLogger(__name__)
REPORT = "report.json"


def _train_task(
    data: Prepared, train: TrainConfig, pretrain: PretrainConfig, seed: int, threads: int
) -> RestartResult:
    """A Ray task: one restart on ``threads`` CPU threads (the LSTM is small; one thread per task is
    fastest)."""
    import torch

    torch.set_num_threads(threads)
    setup_logging("INFO", force=False)
    return train_restart(data, train, pretrain, seed)


def run_restarts(data: Prepared, cfg: MalstmConfig, executor: Executor) -> list[RestartResult]:
    """``cfg.restarts`` restarts as ``executor``'s tasks, at most ``resources.workers`` at once
    (``data`` put in the object store once); a line per finished restart."""
    plan = executor.placement(cfg.resources, reserve=False)
    threads = max(1, int(plan.cpus_per_worker))
    # a failed task is retried as often as Ray retries one by default
    tasks = Tasks(cpus=plan.cpus_per_worker, width=plan.workers, retries=3, shared=(data,))
    calls = [
        (cfg.train, cfg.pretrain, s, threads) for s in range(cfg.seed, cfg.seed + cfg.restarts)
    ]
    progress = Progress(log, "restarts", cfg.restarts, "trained", every_s=0.0)
    done: list[RestartResult] = []
    for result in executor.map_tasks(_train_task, calls, tasks):
        done.append(result)
        log.info("restart seed %d: validation MSE %.4f", result.seed, result.val_mse)
        progress.add()
    progress.finish()
    return sorted(done, key=lambda r: r.seed)


def input_identities(cfg: MalstmConfig) -> dict[str, str]:
    """The data, vectors and thesaurus the run reads, identified by content (checked to exist
    first)."""
    parse_source(cfg.vectors.source)  # a missing vectors file fails before anything slow
    inputs = {"sick": path_identity(sick_dir(cfg))}
    if cfg.pretrain.enabled:
        inputs["sts"] = path_identity(sts_dir(cfg))
    inputs["vectors"] = vectors_identity(cfg.vectors.source)
    # the thesaurus, and the context corpus's glosses, come from WordNet when nltk finds it
    if cfg.augment.enabled or cfg.vectors.retrofit > 0 or cfg.vectors.source == MINILM_CONTEXT:
        wordnet = find_wordnet(cfg.augment)
        inputs["thesaurus"] = (
            "wordnet-3.0" if wordnet is not None else path_identity(aug.bundled_thesaurus())
        )
    return inputs


def sick_dir(cfg: MalstmConfig) -> Path:
    return Path(cfg.sick) if cfg.sick else resources.sick_dir()


def sts_dir(cfg: MalstmConfig) -> Path:
    return Path(cfg.sts) if cfg.sts else resources.sts_dir()


def prepare_data(cfg: MalstmConfig) -> Prepared:
    """What every restart shares, built once from the job's sections and its data settings."""
    return prepare(
        cfg.vectors,
        cfg.augment,
        cfg.pretrain,
        sick_dir=sick_dir(cfg),
        sts_dir=sts_dir(cfg),
        limit_train=cfg.limit_train,
        val_fraction=cfg.val_fraction,
        data_seed=cfg.data_seed,
    )


def run_local(cfg: MalstmConfig, work: Path) -> Path:
    """The MaLSTM job's computation in this process, no Ray, into ``work`` (its report, predictions
    and tables, no claim, identity or ``_SUCCESS``): the same data preparation, restarts (one after
    the other) and results as :func:`run_malstm`. For tests and studies that train many tiny
    variants (``tests/unit/test_dead_settings.py``)."""
    data = prepare_data(cfg)
    results = [
        train_restart(data, cfg.train, cfg.pretrain, seed)
        for seed in range(cfg.seed, cfg.seed + cfg.restarts)
    ]
    work.mkdir(parents=True, exist_ok=True)
    write_results(
        work,
        data,
        results,
        cfg.calibration,
        source=cfg.vectors.source,
        add_ensemble=cfg.ensemble,
        seconds={},
        started=0,
    )
    return work


def run_malstm(cfg: MalstmConfig, *, executor: Executor) -> MalstmResult:
    out = Path(cfg.output)
    identity = cfg.identity("malstm", input_identities(cfg))
    executor.start()
    with claim_output(out, identity, cfg.overwrite) as claim:
        if claim.done:
            return MalstmResult.from_report(
                str(out), json.loads((out / REPORT).read_text(encoding="utf-8")), True
            )
        work = claim.path  # the output, or its staging directory under --overwrite
        start = time.perf_counter()
        data = prepare_data(cfg)
        prepared = time.perf_counter()
        write_config(cfg, work / "config.yaml")
        results = run_restarts(data, cfg, executor)
        trained = time.perf_counter()
        seconds = {"prepare": round(prepared - start, 1), "train": round(trained - prepared, 1)}
        report = write_results(
            work,
            data,
            results,
            cfg.calibration,
            source=cfg.vectors.source,
            add_ensemble=cfg.ensemble,
            seconds=seconds,
            started=start,
        )
        claim.finish(best_seed=report["best_seed"], seconds=report["seconds"])
    return MalstmResult.from_report(str(out), report)
