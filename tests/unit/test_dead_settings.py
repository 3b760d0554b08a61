"""Every setting does what it says (issue 33): on tiny fixtures, perturbing a key a run's identity
records changes the job's output, and perturbing a key it leaves out does not
(``tests/dead_settings.py`` says how). Here the jobs that run in one process without Ray: init (the
job itself), fine-tuning (the job itself, on the in-process executor) and MaLSTM (``run_local``: its
preparation, restarts and results).
``tests/ray/test_dead_settings.py`` checks evaluate, and fine-tuning's worker count, on Ray."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sembridge_ray.recipes.finetune import run as finetune_driver
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.init import run as init_job
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.recipes.malstm import run as malstm_driver
from sembridge_ray.recipes.malstm.config import MalstmConfig
from sembridge_ray.resources import sick_dir, sts_dir
from sembridge_ray.runtime.config import Config
from sembridge_ray.runtime.executor import LocalExecutor
from tests.dead_settings import Harness, check, copy_input, every_key_is_covered, files_of

RAY_AND_RERUNS = {
    "overwrite": "how a rerun treats an existing output (tests/unit/test_outputs.py)",
    "push_to_hub": "publishes after the run, needs the network (tests/unit/test_publish.py)",
    "scores": "what the card pushed with push_to_hub shows (tests/unit/test_model_card.py)",
    "resources": "where the work runs, in Ray; one process here (tests/ray/test_init_pipeline.py shows 1 and 2 "
    "actors agree; fine-tuning's workers: tests/ray/test_dead_settings.py)",
}


def tiny_beir(root: Path, n: int = 12) -> Path:
    """A BEIR directory of ``n`` queries, each with one relevant and one judged non-relevant
    document, every text distinct; train, dev and test judgements over thirds of the queries."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    words = [
        "red",
        "green",
        "blue",
        "old",
        "new",
        "small",
        "big",
        "fast",
        "slow",
        "warm",
        "cold",
        "dark",
    ]
    things = [
        "dog",
        "cat",
        "car",
        "house",
        "tree",
        "river",
        "bird",
        "ship",
        "road",
        "lamp",
        "chair",
        "book",
    ]
    corpus = [{"_id": f"p{i}", "text": f"a {words[i]} {things[i]} is here"} for i in range(n)]
    corpus += [{"_id": f"n{i}", "text": f"no {things[(i + 5) % n]} at all {i}"} for i in range(n)]
    queries = [{"_id": f"q{i}", "text": f"where is the {words[i]} {things[i]}"} for i in range(n)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, part in (("train", range(n)), ("dev", range(0, n, 2)), ("test", range(1, n, 2))):
        lines = [f"q{i}\tp{i}\t1\nq{i}\tn{i}\t0\n" for i in part]
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(lines)
        )
    return root


# ---- init
# -----------------------------------------------------------------------------------------------------


def run_init(cfg: Config, out: Path) -> dict[str, Any]:
    assert isinstance(cfg, InitConfig)
    initialise(replace(cfg, output=str(out)))
    found = files_of(out, skip=("identity.json", "config.yaml", "_SUCCESS"))
    # the inputs' paths (the inputs are compared by content)
    found["init_report.json"].pop("models")
    return found


@pytest.fixture(scope="module")
def init_harness(fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Harness:
    root = tmp_path_factory.mktemp("init-settings")
    text = root / "text.txt"
    text.write_text(
        "a man is playing a guitar\nthe woman is slicing an onion\ntwo dogs run\n", encoding="utf-8"
    )
    return Harness(
        job="init",
        cls=InitConfig,
        base={
            "source_model": str(fixtures_root / "bert-mlm"),
            "target_tokenizer": str(fixtures_root / "tok-bytebpe"),
            "bridge_model": str(fixtures_root / "bridge"),
            "cache_dir": str(root / "cache"),
            # required by the job; each run here writes into a directory of its own
            "output": str(root / "out"),
            "samples": 3,
            "copy_overlap": False,
            "precision": "fp32",
        },
        run=run_init,
        variants=[
            {"alpha": 1.0},
            {"method": "wechsel"},
            {"method": "omp"},
            {"method": "random"},
            {"position_aware": True, "position_penalty": 0.5},
            {"bridge_space": "abtt"},
            {"adaptive_support": "fixed"},
            {"bias": "frequency", "bias_text": str(text)},
            {"norm_scale": 1.5},
            {"confidence_gate": 0.5},
        ],
        exempt={
            **RAY_AND_RERUNS,
            "dry_run": "runs nothing, prints the plan (tests/unit/test_reproduce_plan.py)",
            "json": "the dry run's format",
            "figures": "the dry run's estimate (tests/unit/test_reproduce_plan.py)",
            "grid": "gone: refused with a pointer (tests/unit/test_init_grid.py)",
            "bias_text": "read only with bias=frequency: its content is an input (tests/unit/test_plus.py)",
            "output": "where the run writes: each run here writes into a fresh directory",
        },
        rounding=("bridge_batch_size", "rows_batch_size"),
        values={
            # "auto" is fp32 on a CPU: the identity records the resolved precision
            "precision": "bf16",
            "weighting.position_marker": "~",
            "language": "de",
            "bias": "index",
            "weighting.temperature": 0.5,
            "weighting.wechsel_temperature": 0.5,
            "seed": 3,
            "weighting.bridge_components": 2,
            "weighting.support_size": 3,
            "document_length": 100,
            "query_length": 30,
        },
        copies={k: copy_input for k in ("source_model", "target_tokenizer", "bridge_model")},
        inputs=lambda cfg: init_job.input_identities(cfg),  # type: ignore[arg-type]
    )


def test_every_init_setting_does_what_its_identity_says(
    init_harness: Harness, tmp_path: Path
) -> None:
    assert every_key_is_covered(init_harness) == []
    assert check(init_harness, tmp_path) == []


# ---- fine-tuning
# --------------------------------------------------------------------------------------------------


def run_finetune(cfg: Config, out: Path) -> dict[str, Any]:
    assert isinstance(cfg, FinetuneConfig)
    model = finetune_driver.run_finetune(replace(cfg, output=str(out)), executor=LocalExecutor())
    found = files_of(Path(model.model))
    found["metrics.jsonl"] = files_of(out, skip=())["metrics.jsonl"]
    return found


@pytest.fixture(scope="module")
def finetune_harness(fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Harness:
    root = tmp_path_factory.mktemp("finetune-settings")
    beir = tiny_beir(root / "beir")
    return Harness(
        job="finetune",
        cls=FinetuneConfig,
        base={
            "model": str(fixtures_root / "bert-splade"),
            "train": str(beir),
            "max_query_length": 12,
            "max_doc_length": 16,
            "log_every": 1,
            "output": "out",  # each run writes into a fresh directory of its own
            "precision": "fp32",
            "resources": {"workers": 1},
            "optim": {"batch_size": 4, "lr": 1e-3},
        },
        run=run_finetune,
        variants=[
            {"eval": str(beir), "eval_split": "dev", "eval_every": 1, "eval_max_queries": 4},
            {"optim": {"embedding_warmup_steps": 1}},
            {"loss": {"ranking": "infonce_symmetric"}},
        ],
        exempt={
            **RAY_AND_RERUNS,
            "storage": "where checkpoints go (a path or s3://): tests/ray/test_finetune_resume.py",
            "tensorboard": "writes event files beside the output (tests/ray/test_finetune_eval.py)",
            "output": "where the run writes: each run writes into a fresh directory",
        },
        values={
            "eval": str(beir),
            "precision": "bf16",
            "split": "dev",
            "select": "best",
            "eval_split": "train",
            "optim.max_steps": 2,
            "optim.warmup_ratio": 0.5,
            "loss.lambda_q": 0.5,
            "loss.lambda_d": 0.5,
            "loss.anti_collapse": 0.5,
            "pool_chunk": 1,
            # shorter than the tiny texts: a length that truncates nothing changes nothing
            "max_query_length": 4,
            "max_doc_length": 4,
        },
        copies={k: copy_input for k in ("model", "train")},
        inputs=lambda cfg: finetune_driver.input_identities(cfg),  # type: ignore[arg-type]
    )


def test_every_finetune_setting_does_what_its_identity_says(
    finetune_harness: Harness, tmp_path: Path
) -> None:
    assert every_key_is_covered(finetune_harness) == []
    assert check(finetune_harness, tmp_path) == []


# ---- MaLSTM
# ------------------------------------------------------------------------------------------------------


def run_malstm(cfg: Config, out: Path) -> dict[str, Any]:
    assert isinstance(cfg, MalstmConfig)
    return files_of(malstm_driver.run_local(cfg, out))


@pytest.fixture(scope="module")
def malstm_harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    root = tmp_path_factory.mktemp("malstm-settings")
    # a tiny word2vec text file: most SICK words are out of its vocabulary
    w2v = root / "vectors.txt"
    words = ["a", "man", "woman", "is", "the", "dog", "playing", "and"]
    rows = [
        f"{w} " + " ".join(f"{((i * 7 + j * 3) % 11 - 5) / 10:.1f}" for j in range(8))
        for i, w in enumerate(words)
    ]
    w2v.write_text(f"{len(words)} 8\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return Harness(
        job="malstm",
        cls=MalstmConfig,
        base={
            "sick": str(sick_dir()),
            "sts": str(sts_dir()),
            "restarts": 1,
            "limit_train": 120,
            "augment": {"passes": 1},
            "pretrain": {"limit": 60, "max_epochs": 1, "patience": 1},
            "train": {"max_epochs": 2, "patience": 2, "hidden": 8},
            "vectors": {"cache_dir": str(root / "vectors")},
        },
        run=run_malstm,
        variants=[{"vectors": {"source": f"word2vec:{w2v}"}}],
        exempt={
            **RAY_AND_RERUNS,
            "output": "where the run writes: run_local writes into a fresh directory each time",
            "vectors.layer": "read with minilm-context only, whose first run encodes a context corpus for minutes: "
            "tests/unit/test_malstm_word_vectors.py shows the vectors differ by layer, pooling and contexts",
            "vectors.pooling": "as vectors.layer",
            "vectors.contexts": "as vectors.layer",
        },
        values={
            "vectors.source": "minilm-input",
            "augment.thesaurus": "bundled",
            "pretrain.years": [2014],
            "train.clip_norm": 0.01,
            "train.patience": 2,
            "pretrain.patience": 2,
            "train.smoothing": 0.5,
            "train.min_delta": 0.1,
        },
        # stopping rules show only in runs that stop early: a high learning rate makes the curve
        # jump
        where={
            "train.patience": {"train": {"max_epochs": 6, "patience": 1, "lr": 30.0}},
            "train.smoothing": {"train": {"max_epochs": 6, "patience": 1, "lr": 30.0}},
            "train.min_delta": {"train": {"max_epochs": 6, "patience": 1, "lr": 5.0}},
            "pretrain.patience": {
                "pretrain": {"max_epochs": 6, "patience": 1},
                "train": {"lr": 30.0},
            },
        },
        copies={k: copy_input for k in ("sick", "sts")},
        inputs=lambda cfg: malstm_driver.input_identities(cfg),  # type: ignore[arg-type]
    )


@pytest.mark.slow  # about 2 min (a MaLSTM run per setting): CI's slow step
def test_every_malstm_setting_does_what_its_identity_says(
    malstm_harness: Harness, tmp_path: Path
) -> None:
    assert every_key_is_covered(malstm_harness) == []
    assert check(malstm_harness, tmp_path) == []


# ---- the check itself
# -------------------------------------------------------------------------------------------


def test_the_check_finds_a_dead_setting_and_one_the_identity_misses(tmp_path: Path) -> None:
    """A toy job whose ``lr`` is recorded but read by nothing, and whose ``scale`` is read but not
    recorded: the check names both, and nothing else."""

    @dataclass(frozen=True, kw_only=True)
    class Toy(Config):
        lr: float = 1.0
        scale: float = 1.0
        steps: int = 3
        out: str = ""
        NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("scale", "out")

    def run(cfg: Config, out: Path) -> dict[str, Any]:
        assert isinstance(cfg, Toy)
        return {"result": cfg.steps * cfg.scale}

    harness = Harness(job="toy", cls=Toy, base={}, run=run, exempt={"out": "where it writes"})
    assert check(harness, tmp_path) == [
        "toy: lr changes the run's identity but not its output",
        "toy: scale changes the output but not the run's identity",
    ]
