"""The new-token rule of each method, applied: every method shares the specials, the overlap and the
bias policy, so comparisons isolate this rule. The rules themselves are the registry's
(``embed_init.methods``): a bridge method's maps the weighting section to ``bridge_weights`` options
and says which candidates it weighs, or codes each token over the anchors (``omp``); the others give
rows."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sembridge_ray.embed_init.config import EntmaxOptions, WeightingConfig
from sembridge_ray.embed_init.methods import method
from sembridge_ray.embed_init.position import class_weights
from sembridge_ray.embed_init.weighting import PreparedRows, bridge_weights
from sembridge_ray.runtime.config import require
from sembridge_ray.runtime.errors import InputError


def remap_columns(weights: torch.Tensor, columns: torch.Tensor, m: int) -> torch.Tensor:
    """CSR over a candidate subset -> CSR over all ``m`` source ids (``columns`` ascending keeps
    rows sorted)."""
    return torch.sparse_csr_tensor(
        weights.crow_indices(),
        columns[weights.col_indices()],
        weights.values(),
        size=(weights.shape[0], m),
        check_invariants=False,
    )


def screen_dtype_for(precision: str, device: torch.device) -> torch.dtype:
    """The screening GEMM only picks candidates (certified exact either way): bf16 only when the run
    asked for it (its resolved ``precision``), and only on a CPU (cuBLAS may reduce bf16 products in
    reduced precision, which would void the bound)."""
    return torch.bfloat16 if precision == "bf16" and device.type == "cpu" else torch.float32


def require_codable(name: str, weighting: WeightingConfig, anchors: int) -> None:
    """Refuse what a method coding over the anchors (``omp``) cannot run with: no anchors to code
    over, or an option that assumes convex weights (blending them with FVT's mix, refitting them to
    sum to 1). Others: nothing to do."""
    if method(name).anchor_code is None:
        return
    if not anchors:
        raise InputError(
            f"method {name}: no source token matches a target token, so there are no anchors to code the new tokens "
            "over; use match rules that find an overlap, or another method"
        )
    for key in ("fvt_weight", "lsq_ridge"):
        require(
            not getattr(weighting, key),
            key,
            getattr(weighting, key),
            f"method {name}'s weights are least-squares coefficients (signed, not summing to 1), not a convex mix to "
            "blend with FVT's or refit to sum to 1: leave it at 0",
        )


def method_weights(
    name: str,
    weighting: WeightingConfig,
    new_vecs: torch.Tensor,
    source_vecs: torch.Tensor,
    candidates: torch.Tensor,
    overlap_sources: torch.Tensor,
    device: str | None = None,
    classes: tuple[torch.Tensor, torch.Tensor] | None = None,
    support: torch.Tensor | None = None,
    precision: str = "fp32",
) -> torch.Tensor:
    """CSR (n, |Vs|) weights of bridge method ``name``. ``candidates``: source ids allowed in the
    bridge (ascending); ``overlap_sources``: source ids some target token matches, copied or not
    (FOCUS's anchors; all candidates if none). With ``copy_overlap=false`` the anchors still
    restrict FOCUS, which would otherwise equal α=2. ``classes``: position classes of the new rows
    (n,) and of every source id (|Vs|,); with ``position_aware`` each class's rows get their own
    prior (``embed_init.position``). ``support`` (n,): each row's support size (adaptive sparsity,
    ``bridge_weights``); ``precision``: the run's resolved one (:func:`screen_dtype_for`). A method
    coding over the anchors (``omp``) reads neither: its CSR holds float64 coefficients over the
    anchors, signed and not summing to 1 (:func:`require_codable` says when it runs)."""
    entry = method(name)
    m = len(source_vecs)
    dev = torch.device(device or new_vecs.device)
    if entry.anchor_code is not None:
        require_codable(name, weighting, len(overlap_sources))
        codes = entry.anchor_code(weighting, new_vecs.to(dev), source_vecs[overlap_sources].to(dev))
        return remap_columns(codes.cpu(), overlap_sources, m)
    if entry.similarity is None:
        raise ValueError(f"method {name!r} has no similarity weights")
    rule = entry.similarity(weighting)
    pool = overlap_sources if entry.anchors_only and len(overlap_sources) else candidates
    pool_vecs = PreparedRows.of(
        source_vecs[pool], "source_vecs", dev, screen_dtype_for(precision, dev)
    )
    rows = _pool_weights(new_vecs, pool_vecs, rule, dev, support)
    if weighting.position_aware and classes is not None:
        weights = class_weights(rows, classes[0], classes[1][pool], weighting.position_penalty)
    else:
        weights = rows(None, None)
    return remap_columns(weights, pool, m)


def _pool_weights(
    new_vecs: torch.Tensor,
    pool: PreparedRows,
    rule: EntmaxOptions,
    dev: torch.device,
    support: torch.Tensor | None,
) -> Callable[[torch.Tensor | None, torch.Tensor | None], torch.Tensor]:
    """(new row ids or None for all, offsets or None) -> the ``bridge_weights`` of those rows over
    ``pool``."""

    def rows(ids: torch.Tensor | None, offsets: torch.Tensor | None) -> torch.Tensor:
        new = new_vecs if ids is None else new_vecs[ids]
        sizes = support if support is None or ids is None else support[ids]
        return bridge_weights(
            new,
            pool,
            rule.alpha,
            temperature=rule.temperature,
            top_k=rule.candidates,
            device=dev,
            offsets=offsets,
            support=sizes,
        )

    return rows


def explicit_rows(name: str, n: int, source: torch.Tensor, seed: int) -> torch.Tensor:
    """Rows of a method without the bridge (``mean``: the mean source row; ``random``: N(mean, std),
    seeded)."""
    rule = method(name).rows
    if rule is None:
        raise ValueError(f"method {name!r} has no explicit rows")
    return rule(n, source, seed)
