"""InitConfig: the init job's settings (defaults here only; presets in jobs/configs/init_*.yaml)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sembridge_ray.config import Config, require
from sembridge_ray.embed_init.methods import MethodName, unused_settings
from sembridge_ray.embed_init.vocab import MATCH_RULES
from sembridge_ray.placement import ResourceConfig

GRIDS = ("", "paper")


@dataclass(frozen=True)
class InitConfig(Config):
    """Initialise a target-language sparse encoder from a source one."""

    source_model: str = ""
    """Source SparseEncoder/MLM: hub id or directory (tied embeddings expected; untied output is handled)."""
    target_tokenizer: str = ""
    """Target tokenizer: hub id or directory."""
    bridge_model: str = "BAAI/bge-m3"
    """Bridge sentence-transformers model; ``minilm`` = the bundled all-MiniLM-L6-v2 (offline)."""
    output: str = ""
    """Output directory (one model); with ``grid`` the root holding one directory per cell."""
    method: MethodName = "sembridge"
    alpha: float = 4.0
    """α of α-entmax for sembridge (2 = sparsemax, 1 = softmax over the ``softmax_top_k`` nearest)."""
    temperature: float = 1.0
    """Divides the cosines before α-entmax (1 = none, as in the paper)."""
    softmax_top_k: int = 100
    """α=1 (softmax ablation) keeps this many nearest source tokens; full rows would be dense."""
    wechsel_top_k: int = 10
    wechsel_temperature: float = 0.1
    bias: Literal["remap", "index", "zero"] = "remap"
    """MLM decoder bias: remap (same weights, copies for overlap/specials), index (HF resize), zero."""
    match: tuple[str, ...] = ("exact", "fuzzy", "symbols")
    copy_overlap: bool = True
    """False sends every non-special token through the bridge (the low-overlap, cross-lingual setting)."""
    exclude_special_sources: bool = False
    """Drop special and [unused*] source tokens from the bridge candidates (the reference keeps them)."""
    position_aware: bool = False
    """Match word-initial and continuation pieces within their own class first (docs/position-aware.md), for
    every similarity method. False: the released string rule, byte for byte."""
    position_marker: str = "-"
    """With ``position_aware``: continuation pieces are bridged as this + their text, in both vocabularies
    (``ing`` and ``##ing`` -> "-ing"); "" leaves the strings as they are."""
    position_penalty: float = 0.0
    """With ``position_aware``: subtracted from the cosine of a candidate of the other position class before
    α-entmax/softmax. 0 (no prior) is the kept rule: the marker alone; above 2 + the support radius it is a hard
    mask that falls back to every candidate only when a class has none."""
    seed: int = 0
    samples: int = 50
    """Target tokens shown with their top-3 source tokens (the paper's Table 3)."""
    bridge_batch_size: int = 256
    rows_batch_size: int = 1024
    cache_dir: str = "~/.cache/sembridge_ray/bridge"
    """Bridge vectors cached as Parquet per (bridge model, tokenizer) fingerprint."""
    trust_remote_code: bool = False
    grid: str = ""
    """``paper``: every catalog cell (4 models x 5 languages) under ``output``."""
    dry_run: bool = False
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "source_model", "target_tokenizer", "bridge_model",  # identified by content (inputs)
        "output", "cache_dir", "trust_remote_code", "grid", "dry_run", "overwrite", "resources",
    )

    def check(self) -> None:
        require(math.isfinite(self.alpha) and self.alpha >= 1, "alpha", self.alpha,
                "must be >= 1 (1 = softmax over the softmax_top_k nearest, 2 = sparsemax, 4 = the paper)")
        require(self.temperature > 0, "temperature", self.temperature, "must be > 0")
        require(self.wechsel_temperature > 0, "wechsel_temperature", self.wechsel_temperature, "must be > 0")
        for key in ("softmax_top_k", "wechsel_top_k", "bridge_batch_size", "rows_batch_size"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.samples >= 0, "samples", self.samples, "must be >= 0")
        unknown = [m for m in self.match if m not in MATCH_RULES]
        require(not unknown, "match", ",".join(self.match), f"unknown rule {unknown[0] if unknown else ''!r} "
                f"(known: {', '.join(MATCH_RULES)})")
        require(self.grid in GRIDS, "grid", self.grid, "must be empty or 'paper'")
        require(self.position_penalty >= 0, "position_penalty", self.position_penalty, "must be >= 0")

    def identity_settings(self) -> dict[str, Any]:
        settings = super().identity_settings()
        unused = set(unused_settings(self.method))
        if not self.position_aware:
            unused |= {"position_marker", "position_penalty"}
        return {k: v for k, v in settings.items() if k not in unused}
