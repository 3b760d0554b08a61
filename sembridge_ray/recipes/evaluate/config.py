"""The ``evaluate`` job's contract: encode a corpus and its queries with a sparse encoder (Ray Data
actor pool, cached), retrieve exactly (sharded top-k on Ray actors) and score with ir-measures.

    sembridge evaluate --model /shared/ft/ar/model --dataset miracl:ar --split test --output /shared/eval/ar \\
        --workers 4
    python -m jobs.evaluate --preset smoke --output /tmp/eval-smoke     # the bundled MiniLM SPLADE on SICK, 2 CPUs

Writes ``run.trec``, ``metrics.json`` (nDCG@10, R@100, RR@10 over every qrels query, sparsity
statistics), ``per_query.tsv``, ``config.yaml``, ``identity.json`` and ``_SUCCESS``; encodings are
cached (``cache_dir``). """

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from sembridge_ray.recipes import OUTPUT, Flag, JobSpec, flags
from sembridge_ray.retrieval import settings
from sembridge_ray.retrieval.settings import Encoding
from sembridge_ray.runtime.config import Config, require, require_at_least
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.placement import Precision, ResourceConfig


@dataclass(frozen=True, kw_only=True)
class EvaluateConfig(Config):
    """Encode a corpus and its queries with a sparse encoder, retrieve exactly, score with
    ir-measures."""

    model: str = ""
    """SparseEncoder directory, hub id, or a bundled name (``minilm-splade``)."""
    dataset: str = ""
    """``webfaq:<lang>``, ``miracl:<lang>[@DIR]``, a BEIR-layout directory, or ``sick`` (SICK test
    as BEIR)."""
    split: str = "test"
    """Qrels split (MIRACL has no public test judgements: ``test`` means ``dev`` there)."""
    trust_remote_code: bool = False
    """Let transformers run code shipped with a hub model (off unless you trust its repository)."""
    output: str = ""
    """Output directory: run.trec, metrics.json, config.yaml, _SUCCESS."""
    top_k: int = settings.TOP_K
    """Documents retrieved per query."""
    shard_size: int = 0
    """Documents per index shard, one Ray actor each; 0 = one shard per worker."""
    doc_max_active_dims: int | None = None
    """Keep each document's k largest weights (pruning, sentence-transformers' ``max_active_dims``);
    None = all."""
    query_max_active_dims: int | None = None
    """Keep each query's k largest weights; None = all."""
    max_query_length: int = 64
    """Query tokens (the same key as in fine-tuning)."""
    max_doc_length: int = 256
    """Document tokens (the same key as in fine-tuning)."""
    encode_batch_size: int = settings.ENCODE_BATCH
    """Texts per encoder call (per actor)."""
    query_batch_size: int = settings.QUERY_BATCH
    """Queries per scoring call; a shard actor holds a (batch, shard_size) float32 score block."""
    cache_dir: str = ""
    """Where encodings are cached by fingerprint (model, dataset, split, lengths, pruning); "" =
    <output>/cache."""
    stage_rows: int = settings.STAGE_ROWS
    """Corpus rows per staged Parquet file (the unit of work the encoder pool receives)."""
    run_tag: str = settings.RUN_TAG
    """The last column of run.trec."""
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    precision: Precision = "auto"
    """The encoders' matmuls: fp32, bf16 autocast, or auto = bf16 where the actors run on CUDA GPUs
    that support it, fp32 everywhere else (on a CPU the vectors equal
    SparseEncoder.encode_query/encode_document in fp32). Resolved once in the driver and recorded
    so."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    # The search is exact, so shards and query batches change no result; the encoder's batches
    # change the vectors only by float rounding (padding); inputs are identified by content.
    ALIASES: ClassVar[dict[str, str]] = {
        "query_max_length": "max_query_length",
        "doc_max_length": "max_doc_length",
        "doc_top_k": "doc_max_active_dims",  # top_k is results per query only
        "query_top_k": "query_max_active_dims",
    }
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "model",
        "dataset",
        "output",
        "cache_dir",
        "shard_size",
        "query_batch_size",
        # how the encoding is cut (float rounding aside; its cache entry keeps it, exactly)
        "encode_batch_size",
        "stage_rows",
        "trust_remote_code",  # may load a model, changes nothing it computes
        "overwrite",
        "resources",
    )

    def check(self) -> None:
        require_at_least(self, 1, "top_k max_query_length max_doc_length encode_batch_size")
        require_at_least(self, 1, "query_batch_size stage_rows")
        require(
            self.shard_size >= 0,
            "shard_size",
            self.shard_size,
            "must be >= 0 (0 = one shard per worker)",
        )
        for key in ("doc_max_active_dims", "query_max_active_dims"):
            value = getattr(self, key)
            require(value is None or value >= 1, key, value, "must be >= 1 or null (no pruning)")
        require(
            bool(self.run_tag) and not any(c.isspace() for c in self.run_tag),
            "run_tag",
            self.run_tag,
            "must be one word (it is a TREC run column)",
        )

    def encoding(self) -> Encoding:
        """What the encoding step reads of this config (its keys of the same names)."""
        return Encoding(**{f.name: getattr(self, f.name) for f in fields(Encoding)})

    def require_inputs(self) -> None:
        """Raise :class:`InputError` naming the first required setting that is missing."""
        for name in ("model", "dataset", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required")


@dataclass(frozen=True, kw_only=True)
class EvaluateResult:
    """The scores of one evaluation (``metrics.json`` holds them all, with sparsity and timing
    figures)."""

    output: str
    ndcg_at_10: float
    recall_at_100: float
    rr_at_10: float
    num_queries: int
    num_docs: int
    metrics: dict[str, Any]
    """Everything ``metrics.json`` holds, in ir-measures notation (``nDCG@10``, …)."""
    skipped: bool = False

    @classmethod
    def from_metrics(
        cls, output: str, metrics: dict[str, Any], skipped: bool = False
    ) -> EvaluateResult:
        scores = {field: metrics[key] for field, key in _SCORES.items()}
        return cls(output=output, metrics=metrics, skipped=skipped, **scores)


_SCORES = {
    "ndcg_at_10": "nDCG@10",
    "recall_at_100": "R@100",
    "rr_at_10": "RR@10",
    "num_queries": "num_queries",
    "num_docs": "num_docs",
}
""":class:`EvaluateResult`'s score fields and the ``metrics.json`` keys they hold (the report's)."""


FLAGS = flags(
    Flag(key="model", required=True),
    Flag(key="dataset", required=True),
    "split",
    OUTPUT,
    "top_k max_query_length max_doc_length resources.workers resources.gpus_per_worker",
    "shard_size",
    Flag(key="doc_max_active_dims", aliases=("--doc-top-k",)),
    "precision trust_remote_code overwrite",
)


def report(result: EvaluateResult) -> str:
    from pathlib import Path

    scores = json.dumps({k: result.metrics[k] for k in _SCORES.values()}, indent=2)
    return f"{scores}\nmetrics.json: {Path(result.output, 'metrics.json')}\nrun.trec: {Path(result.output, 'run.trec')}"


JOB = JobSpec(
    summary="encode, retrieve exactly and score nDCG@10; Ray Data + actors",
    config=EvaluateConfig,
    flags=FLAGS,
    report=report,
)
