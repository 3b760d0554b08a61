"""The evaluation job's typed config (``python -m jobs.evaluate``; presets ``jobs/configs/evaluate_*.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from sembridge_ray.config import Config, require
from sembridge_ray.errors import InputError
from sembridge_ray.placement import ResourceConfig


@dataclass(frozen=True)
class EvaluateConfig(Config):
    """Encode a corpus and its queries with a sparse encoder, retrieve exactly, score with ir-measures."""

    model: str = ""
    """SparseEncoder directory or hub id (``fixture:<name>`` = a tiny fixture of ``sembridge_ray.testing``)."""
    dataset: str = ""
    """``webfaq:<lang>``, ``miracl:<lang>[@DIR]``, a BEIR-layout directory, or ``sick`` (SICK test as BEIR)."""
    split: str = "test"
    """Qrels split (MIRACL has no public test judgements: ``test`` means ``dev`` there)."""
    output: str = ""
    """Output directory: run.trec, metrics.json, config.yaml, _SUCCESS."""
    top_k: int = 100
    """Documents retrieved per query."""
    shard_size: int = 0
    """Documents per index shard, one Ray actor each; 0 = one shard per worker."""
    doc_top_k: int | None = None
    """Keep each document's k largest weights (pruning); None = all."""
    query_top_k: int | None = None
    """Keep each query's k largest weights; None = all."""
    query_max_length: int = 64
    """Query tokens (as in fine-tuning)."""
    doc_max_length: int = 256
    """Document tokens (as in fine-tuning)."""
    encode_batch_size: int = 64
    """Texts per encoder call (per actor)."""
    query_batch_size: int = 32
    """Queries per scoring call; a shard actor holds a (batch, shard_size) float32 score block."""
    cache_dir: str = ""
    """Where encodings are cached by fingerprint (model files, dataset, split, lengths, pruning); "" = <output>/cache."""
    stage_rows: int = 5000
    """Corpus rows per staged Parquet file (the unit of work the encoder pool receives)."""
    run_tag: str = "sembridge_ray"
    """The last column of run.trec."""
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    # The search is exact, so shards and query batches change no result; inputs are identified by content.
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "model", "dataset", "output", "cache_dir", "shard_size", "query_batch_size", "overwrite", "resources",
    )

    def check(self) -> None:
        for key in ("top_k", "query_max_length", "doc_max_length", "encode_batch_size", "query_batch_size",
                    "stage_rows"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.shard_size >= 0, "shard_size", self.shard_size, "must be >= 0 (0 = one shard per worker)")
        for key in ("doc_top_k", "query_top_k"):
            value = getattr(self, key)
            require(value is None or value >= 1, key, value, "must be >= 1 or null (no pruning)")
        require(bool(self.run_tag) and not any(c.isspace() for c in self.run_tag), "run_tag", self.run_tag,
                "must be one word (it is a TREC run column)")

    def require_inputs(self) -> None:
        """Raise :class:`InputError` naming the first required setting that is missing."""
        for name in ("model", "dataset", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required")
