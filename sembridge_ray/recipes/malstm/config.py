"""The ``malstm`` job's contract: MaLSTM (Mueller & Thyagarajan, AAAI 2016) on SICK: STS
pretraining, optional thesaurus augmentation, restarts as parallel Ray tasks, statsmodels
local-linear calibration.

    sembridge malstm --output /shared/malstm                    # the default preset, ``paper``
    python -m jobs.malstm --preset smoke --output /tmp/malstm-smoke    # every stage on a sliver, 2 CPUs

The dataclass defaults are the paper's recipe as the authors ran it (preset ``faithful`` adds
nothing); ``paper``, the default preset, lists the measured deltas for the offline vectors;
``smoke`` shrinks every stage. Writes ``report.json``, ``report.md`` with its plots,
``predictions.tsv``, ``val_predictions.tsv``, ``config.yaml``, ``identity.json`` and ``_SUCCESS``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from sembridge_ray.recipes import Flag, JobSpec, flags
from sembridge_ray.runtime.config import Config, require
from sembridge_ray.runtime.placement import ResourceConfig
from sembridge_ray.siamese.config import (
    MINILM_CONTEXT,
    AugmentConfig,
    CalibrationConfig,
    PretrainConfig,
    TrainConfig,
    VectorConfig,
)
from sembridge_ray.siamese.records import Report, SplitMetrics


@dataclass(frozen=True, kw_only=True)
class MalstmConfig(Config):
    """MaLSTM on SICK (Mueller & Thyagarajan, AAAI 2016)."""

    output: str = "outputs/malstm"
    """Output directory."""
    sick: str = ""
    """SICK 2014 directory (``SICK_train.txt``, ``SICK_trial.txt``, ``SICK_test_annotated.txt``);
    empty = bundled."""
    sts: str = ""
    """STS directory with one folder per year; empty = bundled."""
    restarts: int = 4
    """Restarts (formerly ``seeds``), run as parallel Ray tasks; the best by validation MSE is
    reported."""
    seed: int = 0
    """First restart's seed (restart k uses seed + k)."""
    data_seed: int = 0
    """Seeds the validation splits, the augmentation draws and the OOV vectors (shared by every
    restart)."""
    val_fraction: float = 0.3
    """Share of SICK train+trial (and of the STS pool) held out for early stopping and
    calibration."""
    limit_train: int = 0
    """Use only the first N SICK train+trial pairs (0 = all 5,000; smoke runs)."""
    ensemble: bool = False
    """Also report the mean of all restarts' predictions (calibrated on validation): not the paper's
    method."""
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    vectors: VectorConfig = field(default_factory=VectorConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    resources: ResourceConfig = field(
        default_factory=lambda: ResourceConfig(workers=2, reserve_cpus=0)
    )
    """``workers``: restarts trained at once, each a one-CPU Ray task."""

    ALIASES: ClassVar[dict[str, str]] = {"seeds": "restarts"}
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "output",
        "sick",
        "sts",
        "vectors.cache_dir",
        "augment.wordnet_dir",
        "augment.thesaurus",  # the thesaurus it resolves to is an input, identified by content
        "overwrite",
        "resources",
    )

    def check(self) -> None:
        require(self.restarts >= 1, "restarts", self.restarts, "must be >= 1")
        require(0 < self.val_fraction < 1, "val_fraction", self.val_fraction, "must be in (0, 1)")
        require(self.limit_train >= 0, "limit_train", self.limit_train, "must be >= 0 (0 = all)")

    CONTEXT_SETTINGS: ClassVar[tuple[str, ...]] = (
        "vectors.layer",
        "vectors.pooling",
        "vectors.contexts",
    )
    """Read by the ``minilm-context`` vectors only."""

    def unread(self) -> set[str]:
        unread = set() if self.vectors.source == MINILM_CONTEXT else set(self.CONTEXT_SETTINGS)
        # MiniLM gives every word a vector: only a word2vec file (word2vec:PATH) leaves words out of
        # vocabulary
        if ":" not in self.vectors.source:
            unread.add("vectors.oov_std")
        return unread

    def why_unused(self, key: str) -> str:
        if key in self.CONTEXT_SETTINGS:
            return f"it is read with vectors.source {MINILM_CONTEXT} only"
        if key == "vectors.oov_std":
            return "only a word2vec file has out-of-vocabulary words"
        return super().why_unused(key)


@dataclass(frozen=True, kw_only=True)
class MalstmResult:
    """The reported restart's scores on SICK test (``report.json`` holds every restart and the
    calibration)."""

    output: str
    best_seed: int
    test: SplitMetrics
    """``raw`` and ``calibrated`` -> pearson, spearman, mse."""
    validation: SplitMetrics
    skipped: bool = False

    @classmethod
    def from_report(cls, output: str, report: Report, skipped: bool = False) -> MalstmResult:
        return cls(
            output=output,
            best_seed=report["best_seed"],
            test=report["test"],
            validation=report["validation"],
            skipped=skipped,
        )


FLAGS = flags(
    "output",
    Flag(name="--vectors", key="vectors.source"),
    "vectors.retrofit",
    Flag(key="restarts", aliases=("--seeds",)),
    "seed",
    Flag(name="--augment", key="augment.enabled"),
    Flag(name="--pretrain", key="pretrain.enabled"),
    Flag(name="--calibrate", key="calibration.enabled"),
    "sick sts",
    Flag(name="--sts-years", key="pretrain.years"),
    "resources.workers overwrite",
)


def report(result: MalstmResult) -> str:
    from pathlib import Path

    scores = json.dumps(
        {"output": result.output, "best_seed": result.best_seed, "test": result.test}
    )
    return f"{scores}\nreport.md: {Path(result.output, 'report.md')}"


JOB = JobSpec(
    summary="MaLSTM on SICK: STS pretraining, restarts as Ray tasks, calibration",
    config=MalstmConfig,
    flags=FLAGS,
    report=report,
    default_preset="paper",
)
