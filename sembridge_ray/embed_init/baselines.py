"""The new-token rule of each method. All methods share the specials, the overlap and the bias policy, so
comparisons isolate this rule.

| method      | rule for a bridged target token                                                            |
|-------------|---------------------------------------------------------------------------------------------|
| sembridge   | α-entmax over the cosines to every source token, in the bridge space (α=4)                  |
| focus       | sparsemax over the overlapping tokens only, in the bridge space (FOCUS uses fastText there) |
| wechsel     | softmax(cos / 0.1) over the 10 nearest source tokens                                        |
| mean        | the mean source row                                                                         |
| random      | N(mean, std) per dimension of the source rows, seeded                                       |
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sembridge_ray.embed_init.position import class_weights
from sembridge_ray.embed_init.weighting import bridge_weights
from sembridge_ray.jobs.init import InitConfig


def remap_columns(weights: torch.Tensor, columns: torch.Tensor, m: int) -> torch.Tensor:
    """CSR over a candidate subset -> CSR over all ``m`` source ids (``columns`` ascending keeps rows sorted)."""
    cols = columns[weights.col_indices()]
    return torch.sparse_csr_tensor(
        weights.crow_indices(), cols, weights.values(), size=(weights.shape[0], m), check_invariants=False
    )


def method_weights(
    cfg: InitConfig,
    new_vecs: torch.Tensor,
    source_vecs: torch.Tensor,
    candidates: torch.Tensor,
    overlap_sources: torch.Tensor,
    device: str | None = None,
    classes: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """CSR (n, |Vs|) weights of the similarity-based methods. ``candidates``: source ids allowed in the bridge
    (ascending); ``overlap_sources``: source ids some target token matches, copied or not (FOCUS's anchors; all
    candidates if none). With ``copy_overlap=false`` the anchors still restrict FOCUS, which would otherwise equal α=2.
    ``classes``: position classes of the new rows (n,) and of every source id (|Vs|,); with ``position_aware``
    each class's rows get their own prior (``embed_init.position``)."""
    m = len(source_vecs)
    if cfg.method == "focus":
        pool = overlap_sources if len(overlap_sources) else candidates
        kwargs: dict[str, Any] = {"alpha": 2.0}
    elif cfg.method == "wechsel":
        pool = candidates
        kwargs = {"alpha": 1.0, "temperature": cfg.wechsel_temperature, "top_k": cfg.wechsel_top_k}
    elif cfg.method == "sembridge":
        pool = candidates
        kwargs = {
            "alpha": cfg.alpha,
            "temperature": cfg.temperature,
            "top_k": cfg.softmax_top_k if cfg.alpha == 1 else None,
        }
    else:
        raise ValueError(f"method {cfg.method!r} has no similarity weights")
    pool_vecs = source_vecs[pool]
    # the screening GEMM only picks candidates (certified exact either way); bf16 only when the run asked for it
    on_cpu = torch.device(device or new_vecs.device).type == "cpu"
    kwargs["screen"] = torch.bfloat16 if cfg.precision == "bf16" and on_cpu else torch.float32
    if not (cfg.position_aware and classes is not None):
        return remap_columns(bridge_weights(new_vecs, pool_vecs, device=device, **kwargs), pool, m)
    new_classes, source_classes = classes

    def rows(ids: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
        return bridge_weights(new_vecs[ids], pool_vecs, device=device, offsets=offsets, **kwargs)

    w = class_weights(rows, new_classes, source_classes[pool], cfg.position_penalty)
    return remap_columns(w, pool, m)


def explicit_rows(method: str, n: int, source: torch.Tensor, seed: int) -> torch.Tensor:
    """Rows for ``mean`` (the mean source row) and ``random`` (N(mean, std) per dimension, seeded)."""
    mean = source.double().mean(0)
    if method == "mean":
        return mean.to(source.dtype).expand(n, -1).clone()
    if method == "random":
        std = source.double().std(0)
        noise = np.random.default_rng(seed).standard_normal((n, source.shape[1]))
        return (mean + torch.from_numpy(noise) * std).to(source.dtype)
    raise ValueError(f"method {method!r} has no explicit rows")
