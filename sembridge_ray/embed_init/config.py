"""The section of an init config the weighting maths reads: the method, α and its candidates, WECHSEL's softmax and
the position-aware rule. ``InitConfig`` keeps these as flat keys (``--alpha``) and hands the maths this section
(``InitConfig.weighting``); the Ray actors receive it as it is, never a dict to re-parse."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sembridge_ray.config import Config, require
from sembridge_ray.placement import Precision

MethodName = Literal["sembridge", "sembridge_plus", "focus", "wechsel", "omp", "fvt", "mean", "random"]
ENTMAX_BRIDGES: tuple[MethodName, ...] = ("sembridge", "sembridge_plus")
"""The methods whose rows are an α-entmax of the bridge cosines (the ones ``adaptive_support`` applies to)."""
ANCHOR_CODES: tuple[MethodName, ...] = ("omp",)
"""The methods whose rows are least-squares codes over the anchors, not a mix weighted by cosines (no cosine prior:
``position_penalty`` is refused for them)."""


@dataclass(frozen=True, kw_only=True)
class WeightingConfig(Config):
    """How a bridged target token's row is weighted over the source rows (see ``embed_init.methods``)."""

    method: MethodName = "sembridge"
    """How bridged tokens are initialised (sembridge, or the focus/wechsel/omp/mean/random baselines)."""
    alpha: float = 4.0
    """α of α-entmax for sembridge (2 = sparsemax, 1 = softmax over the ``candidates`` nearest)."""
    temperature: float = 1.0
    """Divides the cosines before α-entmax (1 = none, as in the paper)."""
    candidates: int = 100
    """α=1 (softmax ablation) keeps this many nearest source tokens; full rows would be dense."""
    wechsel_candidates: int = 10
    """WECHSEL: nearest source tokens kept for its softmax."""
    wechsel_temperature: float = 0.1
    """WECHSEL: divides the cosines before its softmax."""
    omp_atoms: int = 8
    """OMP: anchors each new token is coded over (the k of orthogonal matching pursuit; the paper's 8)."""
    position_aware: bool = False
    """Match word-initial and continuation pieces within their own class first (``embed_init.position``)."""
    position_marker: str = "-"
    """With ``position_aware``: continuation pieces are bridged as this + their text ("" leaves the strings)."""
    position_penalty: float = 0.0
    """With ``position_aware``: subtracted from the cosine of a candidate of the other position class."""
    fvt_weight: float = 0.0
    """Blends each bridged row with the uniform mix of its source decomposition (FVT), ``(1 - λ) w + λ w_fvt``;
    0 = the bridge alone (``embed_init.plus``)."""
    lsq_ridge: float = 0.0
    """Refits each bridged row's weights over its support by least squares (SALT): the mix of the support's bridge
    vectors nearest the token's own, rows summing to 1, pulled towards the entmax (and FVT) weights by this ridge;
    0 = off (``embed_init.plus``)."""
    adaptive_support: Literal["off", "fvt", "fixed"] = "off"
    """Adaptive sparsity: each bridged row's own temperature makes its α-entmax support this size: the number of
    source forms in its FVT decomposition (``fvt``; ``support_size`` where it has none) or ``support_size``
    (``fixed``); ``off`` = the global ``temperature`` (``embed_init.plus``)."""
    support_size: int = 2
    """With ``adaptive_support``: the support of ``fixed`` rows, and of ``fvt`` rows without a decomposition."""
    precision: Precision = "fp32"
    """The run's resolved precision: ``bf16`` screens the candidates with a bf16 GEMM on a CPU (CUDA keeps fp32,
    see ``weighting.screen_dtype``); anything else screens in fp32. The weights are exact either way."""

    def check(self) -> None:
        require(
            math.isfinite(self.alpha) and self.alpha >= 1,
            "alpha",
            self.alpha,
            "must be >= 1 (1 = softmax over the softmax_top_k nearest, 2 = sparsemax, 4 = the paper)",
        )
        require(self.temperature > 0, "temperature", self.temperature, "must be > 0")
        require(self.wechsel_temperature > 0, "wechsel_temperature", self.wechsel_temperature, "must be > 0")
        for key in ("candidates", "wechsel_candidates", "omp_atoms"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.position_penalty >= 0, "position_penalty", self.position_penalty, "must be >= 0")
        require(
            not (self.method in ANCHOR_CODES and self.position_aware and self.position_penalty > 0),
            "position_penalty",
            self.position_penalty,
            f"method {self.method} weighs no cosines to penalise (its rows are least-squares codes over the anchors);"
            " position_aware applies its marked strings only: leave the penalty at 0",
        )
        require(0 <= self.fvt_weight <= 1, "fvt_weight", self.fvt_weight, "must be in [0, 1]")
        require(
            math.isfinite(self.lsq_ridge) and self.lsq_ridge >= 0,
            "lsq_ridge",
            self.lsq_ridge,
            "must be >= 0 (0 = off)",
        )
        require(self.support_size >= 1, "support_size", self.support_size, "must be >= 1")
        require(
            self.adaptive_support == "off" or (self.method in ENTMAX_BRIDGES and self.alpha > 1),
            "adaptive_support",
            self.adaptive_support,
            f"needs method sembridge or sembridge_plus with alpha > 1 (got {self.method}, alpha {self.alpha})",
        )


@dataclass(frozen=True, kw_only=True)
class EntmaxOptions:
    """The options of :func:`~sembridge_ray.embed_init.weighting.bridge_weights` a method's rule sets."""

    alpha: float
    """α of α-entmax (1 = softmax)."""
    temperature: float = 1.0
    """Divides the cosines first."""
    candidates: int | None = None
    """With α=1: the nearest source tokens kept (None: all, dense rows)."""
