"""What a transfer reads (:class:`TransferSettings`), and the weighting section of an init config
(``InitConfig.weighting``): α and its candidates, WECHSEL's softmax, OMP's atoms, the position-aware
rule and SemBridge+'s options. Each option declares next to itself when a run reads it and whether
the init report shows it (:class:`Read`); the maths (``InitConfig.rule``), the init report and the
``does nothing`` warnings ask the declaration. The run's identity records every option, read or
not. The section's keys are also accepted without their prefix (``alpha=4``, ``--alpha``,
``alpha: 4`` in a preset), as they always were."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sembridge_ray.runtime.config import Config, require
from sembridge_ray.runtime.placement import Precision

MethodName = Literal[
    "sembridge",
    "sembridge_plus",
    "sembridge_x",
    "focus",
    "wechsel",
    "omp",
    "fvt",
    "mean",
    "random",
]
ENTMAX_BRIDGES: tuple[MethodName, ...] = ("sembridge", "sembridge_plus", "sembridge_x")
"""The methods whose rows are an α-entmax of the bridge cosines (the ones ``adaptive_support``
applies to)."""
ANCHOR_CODES: tuple[MethodName, ...] = ("omp",)
"""The methods whose rows are least-squares codes over the anchors, not a mix weighted by cosines
(no cosine prior: ``position_penalty`` is refused for them)."""
BridgeSpace = Literal["raw", "center", "abtt", "whiten", "relative"]
Confidence = Literal["csls", "margin", "cosine"]
AdaptiveSupport = Literal["off", "fvt", "fixed"]


@dataclass(frozen=True, kw_only=True)
class Read:
    """When a run reads a weighting option, and when the init report shows it (the option's field
    metadata)."""

    methods: tuple[MethodName, ...] = ()
    """Only these methods read it (empty: every method)."""
    bridge: bool = False
    """Only a method that embeds strings with the bridge reads it."""
    when: Callable[[WeightingConfig, str], bool] | None = None
    """Read only when this holds of (the section, the method)."""
    why: str = ""
    """Why it does nothing when ``when`` does not hold (the warning for an explicit value)."""
    on: bool = False
    """Reported only when not at its default (an option added after reports were published: they
    keep their bytes)."""
    report: bool = False
    """``init_report.json`` carries it when read (for any method) and, with ``on``, not at its
    default."""


def read(**rule: Any) -> dict[str, Read]:
    """A weighting option's field metadata: its :class:`Read` rule."""
    return {"read": Read(**rule)}


def _entmax(w: WeightingConfig, method: str) -> bool:
    return method in ENTMAX_BRIDGES


ENTMAX = read(methods=ENTMAX_BRIDGES)
WITH_POSITION = read(
    when=lambda w, m: w.position_aware, why="it is read with position_aware only", report=True
)
WHEN_ON = read(bridge=True, on=True, report=True)
"""SemBridge+'s options: read with the bridge, reported only when on."""


@dataclass(frozen=True, kw_only=True)
class WeightingConfig(Config):
    """How a bridged target token's row is weighted over the source rows (see
    ``embed_init.methods``)."""

    ALIASES: ClassVar[dict[str, str]] = {
        "softmax_top_k": "candidates",
        "wechsel_top_k": "wechsel_candidates",
    }

    alpha: float = field(default=4.0, metadata=ENTMAX)
    """α of α-entmax for sembridge (2 = sparsemax, 1 = softmax over the ``candidates`` nearest)."""
    temperature: float = field(default=1.0, metadata=ENTMAX)
    """Divides the cosines before α-entmax (1 = none, as in the paper)."""
    candidates: int = field(
        default=100,
        metadata=read(
            methods=ENTMAX_BRIDGES,
            when=lambda w, m: w.alpha == 1,
            why="it is read with alpha 1 (softmax) only",
        ),
    )
    """α=1 (softmax ablation) keeps this many nearest source tokens; full rows would be dense
    (formerly ``softmax_top_k``)."""
    wechsel_candidates: int = field(default=10, metadata=read(methods=("wechsel",)))
    """WECHSEL: nearest source tokens kept for its softmax (formerly ``wechsel_top_k``)."""
    wechsel_temperature: float = field(default=0.1, metadata=read(methods=("wechsel",)))
    """WECHSEL: divides the cosines before its softmax."""
    omp_atoms: int = field(default=8, metadata=read(methods=("omp",)))
    """OMP (Goddard & Fernandes Neto, 2025): anchors each new token's bridge vector is coded over by
    orthogonal matching pursuit (its k; the anchors are the source tokens some target token matches,
    as FOCUS's)."""
    position_aware: bool = field(default=False, metadata=read(report=True))
    """Match word-initial and continuation pieces within their own class first
    (docs/position-aware.md), for every similarity method. False: the released string rule, byte for
    byte."""
    position_marker: str = field(default="-", metadata=WITH_POSITION)
    """With ``position_aware``: continuation pieces are bridged as this + their text, in both
    vocabularies (``ing`` and ``##ing`` -> "-ing"); "" leaves the strings as they are."""
    position_penalty: float = field(default=0.0, metadata=WITH_POSITION)
    """With ``position_aware``: subtracted from the cosine of a candidate of the other position
    class before α-entmax/softmax. 0 (no prior) is the kept rule: the marker alone; above 2 + the
    support radius it is a hard mask that falls back to every candidate only when a class has
    none."""
    bridge_space: BridgeSpace = field(default="raw", metadata=WHEN_ON)
    """Post-processing of the bridge vectors before the cosines, fit on the candidates and the
    tokens to initialise: raw (the paper), center, abtt (centre, then remove the top
    ``bridge_components`` principal directions), whiten, or relative (cosines to the exact-overlap
    anchors, TokAlign; ``embed_init.plus``)."""
    bridge_components: int = field(
        default=3,
        metadata=read(
            bridge=True,
            when=lambda w, m: w.bridge_space == "abtt",
            why="it is read with bridge_space abtt only",
            report=True,
        ),
    )
    """With ``bridge_space: abtt``: principal directions removed."""
    fvt_weight: float = field(default=0.0, metadata=WHEN_ON)
    """Blends every bridged row with the uniform mix of its decomposition into source forms (FVT):
    ``(1 - fvt_weight) w_bridge + fvt_weight w_fvt``; 0 = the bridge alone (``embed_init.plus``)."""
    lsq_ridge: float = field(default=0.0, metadata=WHEN_ON)
    """Refit each bridged row's weights over its support by least squares in bridge space (SALT):
    the mix of the support's bridge vectors nearest the token's own, rows summing to 1, with this
    ridge towards the entmax/FVT weights; 0 = off (``embed_init.plus``)."""
    adaptive_support: AdaptiveSupport = field(
        default="off",
        metadata=read(
            bridge=True,
            when=_entmax,
            why="only an α-entmax method (sembridge, sembridge_plus) has a support to adapt",
            on=True,
            report=True,
        ),
    )
    """Adaptive sparsity for sembridge(_plus): each bridged row gets its own temperature so that its
    α-entmax support has a target size: its FVT decomposition's number of source forms (``fvt``;
    ``support_size`` where it has none) or ``support_size`` (``fixed``); off = the global
    temperature (``embed_init.plus``)."""
    support_size: int = field(
        default=2,
        metadata=read(
            bridge=True,
            when=lambda w, m: _entmax(w, m) and w.adaptive_support != "off",
            why="it is read with adaptive_support only",
            report=True,
        ),
    )
    """With ``adaptive_support``: the support of ``fixed`` rows, and of ``fvt`` rows with no
    decomposition."""
    random_blend: float = field(default=0.0, metadata=WHEN_ON)
    """Blends every bridged row with the random baseline's row for that token, ``(1 - random_blend)
    E_bridge + random_blend E_random`` (input and untied output rows; the bias stays the bridge's);
    0 = off."""

    norm_scale: float = field(default=0.0, metadata=WHEN_ON)
    """Gives each bridged row this many times the weighted mean L2 norm of the source rows it mixes
    (its direction kept): a convex mix is shorter than its parts, and a short row is a term that
    rarely fires; 0 = off, the mix as it comes (``embed_init.crosslingual``)."""
    confidence_gate: float = field(default=0.0, metadata=WHEN_ON)
    """The share of the bridged tokens the bridge is least sure of (``confidence``) that take the
    random method's row (seeded by ``seed``) and the source's mean bias instead of a mix: a token
    the bridge cannot place stays a distinct term; 0 = off (``embed_init.crosslingual``)."""
    confidence: Confidence = field(
        default="csls",
        metadata=read(
            bridge=True,
            when=lambda w, m: w.confidence_gate > 0,
            why="it is read with confidence_gate only",
            report=True,
        ),
    )
    """With ``confidence_gate``: how sure the bridge is of a token: ``csls`` (the best cosine
    corrected for hubs, Conneau et al. 2018), ``margin`` (the best cosine over the mean of the 10
    best) or ``cosine`` (the best)."""

    def check(self) -> None:
        require(
            math.isfinite(self.alpha) and self.alpha >= 1,
            "alpha",
            self.alpha,
            "must be >= 1 (1 = softmax over the softmax_top_k nearest, 2 = sparsemax, 4 = the paper)",
        )
        for key in ("temperature", "wechsel_temperature"):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        for key in (
            "candidates",
            "wechsel_candidates",
            "omp_atoms",
            "bridge_components",
            "support_size",
        ):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(
            self.position_penalty >= 0, "position_penalty", self.position_penalty, "must be >= 0"
        )
        for key in ("fvt_weight", "random_blend", "confidence_gate"):
            require(0 <= getattr(self, key) <= 1, key, getattr(self, key), "must be in [0, 1]")
        for key in ("norm_scale", "lsq_ridge"):
            require(getattr(self, key) >= 0, key, getattr(self, key), "must be >= 0 (0 = off)")

    def check_method(self, method: MethodName) -> None:
        """The checks that need the method (it is the init config's, not this section's)."""
        require(
            not (method in ANCHOR_CODES and self.position_aware and self.position_penalty > 0),
            "position_penalty",
            self.position_penalty,
            f"method {method} weighs no cosines to penalise (its rows are least-squares codes over the anchors);"
            " position_aware applies its marked strings only: leave the penalty at 0",
        )
        require(
            self.adaptive_support == "off" or method not in ENTMAX_BRIDGES or self.alpha > 1,
            "adaptive_support",
            self.adaptive_support,
            f"needs method sembridge or sembridge_plus with alpha > 1 (got {method}, alpha {self.alpha})",
        )

    @staticmethod
    def rule(key: str) -> Read:
        """``key``'s declared :class:`Read` rule."""
        rule: Read = WeightingConfig.__dataclass_fields__[key].metadata["read"]
        return rule

    def reads(self, key: str, method: str, bridge: bool) -> bool:
        """Whether a run of ``method`` (``bridge``: it uses the bridge) reads option ``key`` with
        these settings."""
        rule = self.rule(key)
        return (
            (not rule.methods or method in rule.methods)
            and (bridge or not rule.bridge)
            and (rule.when is None or rule.when(self, method))
        )

    def reported(self, method: str) -> dict[str, object]:
        """What ``init_report.json`` says of the section: the ``report`` options read (as by a
        bridge method), an ``on`` option only when not at its default; in the order of the
        fields."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if self.rule(f.name).report
            and self.reads(f.name, method, True)
            and not (self.rule(f.name).on and getattr(self, f.name) == f.default)
        }

    def for_method(self, method: str, bridge: bool) -> WeightingConfig:
        """The section as a run of ``method`` reads it: every option it does not read at its
        default."""
        unread: dict[str, Any] = {
            f.name: f.default
            for f in dataclasses.fields(self)
            if not self.reads(f.name, method, bridge)
        }
        return dataclasses.replace(self, **unread)

    def why_unused(self, key: str) -> str:
        return self.rule(key).why or super().why_unused(key)


@dataclass(frozen=True, kw_only=True)
class EntmaxOptions:
    """The options of :func:`~sembridge_ray.embed_init.weighting.bridge_weights` a method's rule
    sets."""

    alpha: float
    """α of α-entmax (1 = softmax)."""
    temperature: float = 1.0
    """Divides the cosines first."""
    candidates: int | None = None
    """With α=1: the nearest source tokens kept (None: all, dense rows)."""


@dataclass(frozen=True, kw_only=True)
class TransferSettings:
    """What one transfer reads (``embed_init.transfer``): its inputs and the maths' settings, as an
    init run resolved them (``InitConfig.transfer``: bundled names materialised, precision
    resolved); none of the run's output, claims or publishing."""

    source_model: str
    target_tokenizer: str
    bridge_model: str
    bias_text: str
    """The text whose token counts set the new tokens' decoder bias (``bias: frequency`` only)."""
    trust_remote_code: bool
    method: MethodName
    weighting: WeightingConfig
    """The section as ``method`` reads it (``InitConfig.rule``): no option it does not read."""
    match: tuple[str, ...]
    copy_overlap: bool
    exclude_special_sources: bool
    bias: str
    seed: int
    precision: Precision
    cache_dir: str
    """Where the bridge's vectors are cached."""
    neutral_symbols: bool = True
    """The position classes' rule (``position.position_class``): False only in an ablation."""
