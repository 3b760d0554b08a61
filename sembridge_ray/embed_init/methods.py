"""The one registry of initialisation methods: each entry carries its own rule, so adding a method
is one entry here and the rest of the code asks instead of listing.

| method      | bridge | α   | rule for a bridged target token                                                    |
|-------------|--------|-----|------------------------------------------------------------------------------------|
| sembridge   | yes    | yes | α-entmax over the cosines to every source token (α=4; 1 = softmax over the nearest) |
| sembridge_plus | yes | yes | sembridge with the project's frozen recipe (``SEMBRIDGE_PLUS``; docs/sembridge-plus.md) |
| sembridge_x | yes    | yes | sembridge with the cross-lingual recipe (``SEMBRIDGE_X``; docs/xling.md)            |
| focus       | yes    | no  | sparsemax over the overlapping tokens only                                         |
| wechsel     | yes    | no  | softmax(cos / 0.1) over the 10 nearest source tokens                              |
| omp         | yes    | no  | least squares over 8 anchors chosen by OMP (``embed_init.omp``); signed weights    |
| fvt         | no     | no  | the uniform mix of the piece's decomposition into source forms (``embed_init.plus``) |
| mean        | no     | no  | the mean source row                                                                |
| random      | no     | no  | N(mean, std) per dimension of the source rows, seeded                              |

A bridge method's rule maps the :class:`~sembridge_ray.embed_init.config.WeightingConfig` to the
options of ``bridge_weights`` (``embed_init.baselines.method_weights`` applies it), or codes each
token's bridge vector over the anchors' (``omp``: its weights are least-squares coefficients, which
may be negative and need not sum to 1, unlike every other method's convex mix); a method without the
bridge gives its rows directly; ``fvt`` decomposes the piece's string instead. A method with a
``recipe`` fixes weighting options (the config applies them and refuses a conflicting value). The
module imports no torch (the contracts and the command line read the registry); the row rules use
only the tensors' own methods, and ``omp`` imports its solver when it runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sembridge_ray.embed_init.config import ANCHOR_CODES, EntmaxOptions, MethodName, WeightingConfig

if TYPE_CHECKING:
    import torch

__all__ = ["METHODS", "METHOD_NAMES", "InitMethod", "MethodName", "method"]

SimilarityRule = Callable[[WeightingConfig], EntmaxOptions]
"""The weighting section -> the options of ``bridge_weights`` for a bridge method."""
ExplicitRows = Callable[[int, "torch.Tensor", int], "torch.Tensor"]
"""(rows n, source matrix (|Vs|, d), seed) -> (n, d) rows of a method without the bridge."""
AnchorCode = Callable[[WeightingConfig, "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""(weighting section, new bridge vectors (n, D), the anchors' bridge vectors (K, D)) -> CSR (n, K)
coefficients."""


def sembridge_rule(w: WeightingConfig) -> EntmaxOptions:
    """α-entmax of cos / temperature; α=1 is a softmax over the ``candidates`` nearest (full rows
    would be dense)."""
    return EntmaxOptions(
        alpha=w.alpha, temperature=w.temperature, candidates=w.candidates if w.alpha == 1 else None
    )


def focus_rule(w: WeightingConfig) -> EntmaxOptions:
    """Sparsemax (α=2) of the plain cosines, over FOCUS's anchors."""
    return EntmaxOptions(alpha=2.0)


def wechsel_rule(w: WeightingConfig) -> EntmaxOptions:
    """Softmax of cos / ``wechsel_temperature`` over the ``wechsel_candidates`` nearest."""
    return EntmaxOptions(
        alpha=1.0, temperature=w.wechsel_temperature, candidates=w.wechsel_candidates
    )


def omp_code(w: WeightingConfig, new: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Orthogonal matching pursuit with ``omp_atoms`` atoms over the anchors: least-squares
    coefficients."""
    # here, not above: the registry module imports no torch
    from sembridge_ray.embed_init.omp import omp_weights

    return omp_weights(new, anchors, w.omp_atoms)


def mean_rows(n: int, source: torch.Tensor, seed: int) -> torch.Tensor:
    """The mean source row (averaged in float64), ``n`` times."""
    return source.double().mean(0).to(source.dtype).expand(n, -1).clone()


def random_rows(n: int, source: torch.Tensor, seed: int) -> torch.Tensor:
    """N(mean, std) per dimension of the source rows (float64 statistics), seeded by ``seed``."""
    mean, std = source.double().mean(0), source.double().std(0)
    noise = np.random.default_rng(seed).standard_normal((n, source.shape[1]))
    return (mean + mean.new_tensor(noise) * std).to(source.dtype)  # new_tensor: float64, as mean


@dataclass(frozen=True, kw_only=True)
class InitMethod:
    """One initialisation method: its name, what it reads, and its rule (a similarity rule or
    explicit rows)."""

    name: MethodName
    has_alpha: bool
    """Takes the entmax α (the grid's ``--alphas`` axis); the weighting options only some methods
    read say which (``embed_init.config.Read``)."""
    similarity: SimilarityRule | None = None
    """A bridge method's rule: the bridge_weights options from the weighting section."""
    anchors_only: bool = False
    """The bridge candidates are the overlap's sources only (FOCUS's anchors; every candidate if
    there are none, but an ``anchor_code`` method is refused without them)."""
    anchor_code: AnchorCode | None = None
    """A bridge method that codes each token's bridge vector over the anchors' (``anchors_only``):
    its weights are the code's coefficients, signed and not summing to 1 (``omp``)."""
    rows: ExplicitRows | None = None
    """A method without the bridge: its rows for the tokens left to initialise."""
    decomposes: bool = False
    """The rows are the uniform mix of each piece's decomposition into source forms (FVT), no
    bridge."""
    recipe: Mapping[str, object] = field(default_factory=dict)
    """Weighting options this method fixes (``sembridge_plus``): applied when left at their
    defaults, a conflicting value refused."""

    def __post_init__(self) -> None:
        rules = (self.similarity, self.anchor_code, self.rows)
        if sum(rule is not None for rule in rules) + self.decomposes != 1:
            raise ValueError(
                f"init method {self.name!r} needs exactly one of a similarity rule, an anchor code, explicit rows or "
                "decomposition"
            )
        codes = self.anchor_code is not None
        if codes != (self.name in ANCHOR_CODES) or (codes and not self.anchors_only):
            raise ValueError(
                f"init method {self.name!r}: an anchor code goes with anchors_only and ANCHOR_CODES"
            )

    @property
    def uses_bridge(self) -> bool:
        """Embeds token strings with the bridge model and weights source rows by similarity or codes
        over anchors."""
        return self.similarity is not None or self.anchor_code is not None


SEMBRIDGE_PLUS: Mapping[str, object] = {
    "position_aware": True,
    "bridge_space": "relative",
    "fvt_weight": 0.5,
    "random_blend": 0.5,
}
"""The frozen SemBridge+ recipe on top of the released rule, chosen on development data only (SICK
trial, the three public settings; docs/sembridge-plus.md has the ablation and the evidence for each
key)."""

SEMBRIDGE_X: Mapping[str, object] = {
    "norm_scale": 2.0,
    "confidence_gate": 0.25,
    "confidence": "cosine",
}
"""The cross-lingual recipe on top of the released rule, chosen zero-shot on the development
articles of ar, zh, hi, ko and ru from SPLADE-tiny, seeds averaged (docs/xling.md has the
diagnosis, the choice and the ablation): bridged rows at twice the weighted mean norm of the source
rows they mix; the quarter of the bridged tokens whose best bridge cosine is lowest keep random
rows. The only candidate of the search that was ahead of random init in all five languages."""
METHODS: dict[str, InitMethod] = {
    m.name: m
    for m in (
        InitMethod(name="sembridge", has_alpha=True, similarity=sembridge_rule),
        InitMethod(name="focus", has_alpha=False, similarity=focus_rule, anchors_only=True),
        InitMethod(name="wechsel", has_alpha=False, similarity=wechsel_rule),
        InitMethod(name="omp", has_alpha=False, anchor_code=omp_code, anchors_only=True),
        InitMethod(
            name="sembridge_plus", has_alpha=True, similarity=sembridge_rule, recipe=SEMBRIDGE_PLUS
        ),
        InitMethod(
            name="sembridge_x", has_alpha=True, similarity=sembridge_rule, recipe=SEMBRIDGE_X
        ),
        InitMethod(name="fvt", has_alpha=False, decomposes=True),
        InitMethod(name="mean", has_alpha=False, rows=mean_rows),
        InitMethod(name="random", has_alpha=False, rows=random_rows),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
BRIDGE_SETTINGS = ("exclude_special_sources", "bridge_batch_size", "rows_batch_size")
"""InitConfig keys outside the weighting section that matter only when a method embeds strings with
the bridge (the section's options say so themselves: ``embed_init.config.Read``)."""


def method(name: str) -> InitMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown init method {name!r} (known: {', '.join(METHODS)})") from None


POSITION_AWARE = "+pa"
"""Suffix of a bridge method in ``methods`` that runs it with ``position_aware=true`` (e.g.
``sembridge+pa``)."""


def split_variant(name: str) -> tuple[str, bool]:
    """``sembridge+pa`` -> (``sembridge``, True); ``focus`` -> (``focus``, False)."""
    base = name.removesuffix(POSITION_AWARE)
    return base, base != name


def parse_alpha(text: str) -> float:
    """``4`` -> 4.0; ``softmax`` -> 1.0 (softmax over the nearest source tokens)."""
    return 1.0 if str(text).strip().lower() == "softmax" else float(text)
