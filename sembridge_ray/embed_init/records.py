"""The shapes of ``init_report.json`` and its parts, as typed dicts: what the job writes and its
contract reads, with no import beyond ``typing`` (the contract stays light)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class SourceWeight(TypedDict):
    source_id: int
    token: str
    weight: float


class Sample(TypedDict):
    """A bridged target token and its top-3 source tokens (the paper's Table 3)."""

    target_id: int
    token: str
    top: list[SourceWeight]


class Counts(TypedDict):
    target_size: int
    kinds: dict[str, int]
    match_rules: dict[str, int]
    special_roles: dict[str, int]
    unused_ids: int
    overlap_empty: bool


class CounterpartStats(TypedDict):
    with_counterpart: int
    zero_weight: int
    zero_weight_share: NotRequired[float | None]


class PositionStats(TypedDict):
    exact_counterpart: dict[str, CounterpartStats]
    support_histogram: dict[str, dict[str, int]]


class Fingerprints(TypedDict):
    source_model: str
    bridge_model: str
    source_tokenizer: str
    target_tokenizer: str


class Models(TypedDict):
    source_model: str
    target_tokenizer: str
    bridge_model: str


class InitReport(Counts):
    """``init_report.json``, key for key in the order written."""

    method: str
    alpha: float
    bias: str
    match: list[str]
    copy_overlap: bool
    exclude_special_sources: bool
    position_aware: bool
    position_marker: NotRequired[str]
    position_penalty: NotRequired[float]
    bridge_space: NotRequired[str]
    bridge_components: NotRequired[int]
    fvt_weight: NotRequired[float]
    lsq_ridge: NotRequired[float]
    adaptive_support: NotRequired[str]
    support_size: NotRequired[int]
    random_blend: NotRequired[float]
    support_histogram: dict[str, int]
    position: PositionStats
    timings: dict[str, float]
    fingerprints: Fingerprints
    models: Models
    samples: list[Sample]
