"""The shapes of the MaLSTM's JSON records: ``report.json`` and its parts (the data counts
``prepare`` gathers, each restart's line, the calibration). Plain ``TypedDict`` s, importing
nothing, so that the job's contract can name the report it reads without loading the maths."""

from __future__ import annotations

from typing import NotRequired, Required, TypedDict

Metrics = dict[str, float]
"""``pearson``, ``spearman``, ``mse`` (a ``mean_std`` cell: ``mean``, ``std``, ``n``)."""
SplitMetrics = dict[str, Metrics]
"""``raw`` and, when calibrated, ``calibrated`` -> :data:`Metrics`."""


class ContextStats(TypedDict):
    """What building aggregated contextual vectors took: words asked for, seen in the corpus,
    encoded now."""

    words: int
    seen_in_context: int
    built_now: int


class VectorBuild(TypedDict, total=False):
    """How the embedding matrix was built (``report.json``'s ``vectors``, beside its ``name``)."""

    source: Required[str]
    layer: int
    pooling: str
    contexts: int
    corpus_sentences: int
    corpus_digest: str
    corpus_parts: list[str]
    words: int
    seen_in_context: int
    built_now: int
    retrofit: int
    retrofit_lexicon: str
    seconds: float


class DataCounts(TypedDict, total=False):
    """Split sizes, the STS pool and its leak guard, the thesaurus, the vectors, OOV rates and
    augmentation."""

    sick_train: Required[int]
    sick_validation: Required[int]
    sick_test: Required[int]
    sts_pool: int
    removed_by_leak_guard: int
    pretrain_train: int
    pretrain_validation: int
    thesaurus: str | None
    vectors: VectorBuild
    oov_rate: float
    oov_type_rate: float
    augment_gate: float
    augmented: int


class CalibrationRecord(TypedDict):
    """The calibrator fitted on validation; with calibration off only the first four keys, bandwidth
    None."""

    enabled: bool
    bandwidth: float | None
    loo_mse: float | None
    n: int
    method: NotRequired[str]
    evaluations: NotRequired[int | None]
    seconds: NotRequired[float]


class PretrainRecord(TypedDict):
    best_epoch: int
    epochs_run: int
    best_val_mse: float


class RestartRecord(TypedDict):
    """One restart's line in ``report.json`` (test calibrated with its own validation fit)."""

    seed: int
    val_mse: float
    validation: SplitMetrics
    test: SplitMetrics
    bandwidth: float | None
    best_epoch: int
    epochs_run: int
    seconds: float
    pretrain: PretrainRecord | None


class EnsembleRecord(TypedDict):
    """The mean of every restart's predictions, calibrated like a single model (not the paper's
    method)."""

    restarts: int
    test: SplitMetrics
    validation: SplitMetrics
    calibration: CalibrationRecord


class Report(TypedDict):
    """``report.json``: the best restart's scores, every restart, the data and the paper's
    figures."""

    test: SplitMetrics
    validation: SplitMetrics
    calibration: CalibrationRecord
    data: dict[str, object]
    """:class:`DataCounts`, with ``vectors`` the source's name."""
    vectors: dict[str, object]
    """``name`` (the source), then :class:`VectorBuild`."""
    best_seed: int
    seeds: list[RestartRecord]
    seed_summary: dict[str, Metrics]
    """``test_<kind>_<metric>`` and ``val_mse`` -> mean, std, n over the restarts."""
    ensemble: EnsembleRecord | None
    paper: dict[str, Metrics]
    seconds: dict[str, float]
