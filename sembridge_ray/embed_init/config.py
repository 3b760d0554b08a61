"""InitConfig: the init job's settings (defaults here only; presets in jobs/configs/init_*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sembridge_ray.config import Config
from sembridge_ray.placement import ResourceConfig

Method = Literal["sembridge", "focus", "wechsel", "mean", "random"]


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
    method: Method = "sembridge"
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
    resources: ResourceConfig = field(default_factory=ResourceConfig)
