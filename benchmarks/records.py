"""The JSON lines ``python -m jobs.bench_peers`` prints, and what each side's child process hands
back: plain ``TypedDict`` s (no torch), in the key order they are written. ``case`` is the case's
fields (``dataclasses.asdict``)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class StepTimes(TypedDict):
    """A training side: seconds and loss of each step, RSS before the first and at the peak."""

    step_s: list[float]
    losses: list[float]
    rss_before_mb: float
    peak_rss_mb: float


class Timing(TypedDict):
    """An encoding side: seconds of the timed call (after a warm-up call), RSS before it and at the
    peak."""

    seconds: float
    rss_before_mb: float
    peak_rss_mb: float


class RayDataTiming(TypedDict, total=False):
    """The Ray Data side: end-to-end and (when the two runs allow it) steady rate and start-up."""

    texts: int
    end_to_end_texts_per_s: float
    steady_texts_per_s: float | None
    startup_s: float | None
    seconds: list[float]
    """Only when no steady rate could be had: each run's seconds."""


class RayDataLine(RayDataTiming, total=False):
    steady_ratio_to_in_process: float | None
    what: str


class Differences(TypedDict):
    """Max |difference| of the document vectors between precisions and sides."""

    project_bf16_vs_fp32: float
    peer_bf16_vs_fp32: float
    project_fp32_vs_peer_fp32: float


class TrainSide(TypedDict):
    examples_per_s: float
    peak_rss_mb: float


class EncodeSide(TypedDict):
    texts_per_s: float
    peak_rss_mb: float


class TrainLine(TypedDict):
    comparison: str
    """``train_step``"""
    case: dict[str, float]
    project: TrainSide
    peer: TrainSide
    throughput_ratio: float
    peak_memory_ratio: float
    max_loss_gap: float
    losses_project: list[float]
    rounds: int
    runs_examples_per_s: dict[str, list[float]]
    peer_name: str


class EncodeLine(TypedDict):
    comparison: str
    """``encode_documents``"""
    case: dict[str, float | str]
    project: EncodeSide
    peer: EncodeSide
    throughput_ratio: float
    peak_memory_ratio: float
    rounds: int
    runs_texts_per_s: dict[str, list[float]]
    ray_data: RayDataLine
    mean_tokens: float
    project_name: str
    peer_name: str


class PrecisionLine(TypedDict):
    comparison: str
    """``encode_precision``"""
    case: dict[str, float | str]
    texts_per_s: dict[str, float]
    bf16_over_fp32: float
    project_bf16_over_peer_autocast: float
    max_abs_difference: Differences
    native_bf16_cpu: bool
    rounds: int


class InitLine(TypedDict):
    comparison: str
    """``bridge_weights``"""
    project: dict[str, float]
    peer: dict[str, float]
    ratio_to_bare_gemm: float
    speedup_vs_reference: float
    screening_gemm: str
    threads: dict[str, int]
    load_average_1m: float
    runs_ratio_to_bare_gemm: list[float]
    max_abs_err_vs_float64: dict[str, float]
    bridge_strings_per_s: float


class MsPerToken(TypedDict):
    ours: float
    reference_loop: float
    bare_gemm: float


class BridgeWeightsRun(TypedDict):
    """``bench.bridge_weights.run``: one timing of bridge_weights against the bare GEMM and the
    reference loop. It also holds ``rss_growth_mb_<rows>_rows`` (the name carries the row count),
    after ``peak_rss_mb``."""

    alpha: float
    new_tokens: int
    source_tokens: int
    dim: int
    vectors: str
    ms_per_token: MsPerToken
    speedup_vs_reference: float
    ratio_to_bare_gemm: float
    max_abs_err_vs_float64: dict[str, float]
    support: dict[str, float]
    screening_gemm: str
    threads: dict[str, int]
    load_average_1m: float
    runs_ratio_to_bare_gemm: list[float]
    peak_rss_mb: float
    bridge_strings_per_s: NotRequired[float]
    """Added by ``bench.peers.compare_init``: the bundled bridge's rate on vocabulary pieces."""
