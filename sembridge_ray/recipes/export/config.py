"""The ``export`` job's contract: write a model where it is served, and check it there against the
exact answer.

    python -m jobs.export --checkpoint /shared/ft/ar/checkpoints/finetune-<run>/step_00000400 --output /tmp/step400
    sembridge export --checkpoint ... --output ... --select best    # the best evaluated weights it carries
    sembridge export --target qdrant --model DIR --dataset sick --split test --output /tmp/qdrant

``--target sentence-transformers`` (the default): a fine-tuning checkpoint as a SparseEncoder
directory; the checkpoint must verify (every rank's manifest and checksums), and the written model
is the one ``jobs.finetune`` would have published from those weights (same lengths, pooling and
model card).

Any other target (``docs/export.md``) encodes ``--dataset``'s corpus and the judged queries of
``--split`` through the evaluate job's encoding (Ray Data, cached), exports them (an embedded Qdrant
or Milvus Lite, a Seismic or PISA index, OpenSearch/Elasticsearch mapping and bulk files, the model
as ONNX or OpenVINO, or its inference-free ``doc-only`` variant, which is scored beside the model
rather than held to a tolerance), searches the queries through the target and compares its top-10
with the project's exact sparse search: ``export_report.json`` holds the parity and the sizes; a
target below its documented tolerance fails the job (exit 2). ``--model`` is a model directory, or
give ``--checkpoint`` to export its weights first (to ``<output>/model``). A target export follows
the output contract of every job: rerun with the same settings and inputs, a finished export is
skipped and an unfinished one (a crash, or a target outside its tolerance) is done again; other
settings are refused unless ``--overwrite``, which replaces the output only once the new export is
complete. A checkpoint's export (``sentence-transformers``) refuses an existing output."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from sembridge_ray.export.report import ExportReport
from sembridge_ray.recipes import OUTPUT, JobSpec, flags
from sembridge_ray.runtime.config import Config
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.placement import ResourceConfig

TargetName = Literal[
    "sentence-transformers",
    "qdrant",
    "milvus",
    "seismic",
    "pisa",
    "opensearch",
    "opensearch-sparse-vector",
    "elasticsearch",
    "onnx",
    "onnx-optimized",
    "onnx-int8",
    "openvino",
    "doc-only",
]


@dataclass(frozen=True, kw_only=True)
class ExportConfig(Config):
    """Write a model where it is served (a SparseEncoder directory, a search engine, ONNX) and check
    its parity."""

    target: TargetName = "sentence-transformers"
    """Where the model goes: a SparseEncoder directory (from a checkpoint), an engine, bulk files,
    or ONNX/OpenVINO."""
    checkpoint: str = ""
    """A checkpoint directory of a fine-tuning run (``<storage>/<run>/step_<n>``)."""
    model: str = ""
    """The SparseEncoder directory to export (targets other than sentence-transformers; or give
    --checkpoint)."""
    dataset: str = ""
    """The corpus to index and the queries to check parity with (a dataset spec, as for
    evaluate)."""
    split: str = "test"
    """The split whose judged queries check the parity."""
    output: str = ""
    """The directory to write (for sentence-transformers: must not exist)."""
    select: Literal["last", "best"] = "last"
    """``last``: the checkpoint's own weights; ``best``: the best evaluated weights up to its
    step."""
    url: str = ""
    """A running server to push to and search (qdrant, milvus, opensearch*, elasticsearch); "" =
    embedded/files."""
    max_query_length: int = 64
    """Query tokens (the same key as in evaluation)."""
    max_doc_length: int = 256
    """Document tokens (the same key as in evaluation)."""
    cache_dir: str = ""
    """Where encodings are cached (shared with evaluate's); "" = <output>/cache."""
    overwrite: bool = False
    """Replace a target export written with other settings or inputs (otherwise such a rerun is
    refused)."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    # a target export's identity: the target and its settings, and the inputs by content (the
    # paths are not part of it)
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "checkpoint",
        "model",
        "dataset",
        "output",
        "cache_dir",
        "overwrite",
        "resources",
    )

    def unread(self) -> set[str]:
        # --select only for a checkpoint; a checkpoint's export as a SparseEncoder directory (the
        # default target) keeps its run's lengths and checks no parity
        unread = set() if self.checkpoint else {"select"}
        if self.target == "sentence-transformers":
            unread |= {"split", "url", "max_query_length", "max_doc_length"}
        return unread

    def why_unused(self, key: str) -> str:
        if key == "select" and not self.checkpoint:
            return "it picks a checkpoint's weights (--checkpoint); --model is exported as it is"
        if self.target == "sentence-transformers":
            return (
                "--target sentence-transformers writes the checkpoint as its fine-tuning run would "
                "have published it (the run's lengths) and checks no parity"
            )
        return super().why_unused(key)

    def require_inputs(self) -> None:
        if self.target == "sentence-transformers":
            for name in ("checkpoint", "output"):
                if not getattr(self, name):
                    raise InputError(f"--{name} is required")
            if self.url:
                raise InputError(
                    "--url: target 'sentence-transformers' writes a directory, it pushes nowhere"
                )
            if self.overwrite:
                raise InputError(
                    "--overwrite: target 'sentence-transformers' writes a new directory; choose a new --output"
                )
            return
        if not self.model and not self.checkpoint:
            raise InputError(f"--model (or --checkpoint) is required for --target {self.target}")
        if self.model and self.checkpoint:
            raise InputError("give --model or --checkpoint, not both")
        for name in ("dataset", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required for --target {self.target}")


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    output: str
    step: int = 0
    """The step whose weights were written (a checkpoint's export)."""
    checkpoint: str = ""
    target: str = "sentence-transformers"
    report: ExportReport | None = None
    """``export_report.json`` (targets other than sentence-transformers)."""
    skipped: bool = False
    """The output was already complete with the same settings and inputs."""


FLAGS = flags(
    "target checkpoint model dataset split",
    OUTPUT,
    "select url max_query_length max_doc_length overwrite",
    "resources.workers resources.gpus_per_worker",
)


def report(result: ExportResult) -> str:
    if result.target == "sentence-transformers":
        shown = {"output": result.output, "step": result.step, "checkpoint": result.checkpoint}
        return json.dumps(shown, indent=2) + f"\nmodel (step {result.step}): {result.output}"
    keys = (
        "target",
        "documents",
        "postings",
        "bytes",
        "seconds",
        "overlap@10",
        "ndcg@10_exact",
        "ndcg@10_target",
    )
    shown = {k: dict(result.report or {}).get(k) for k in keys}
    done = " (already complete with these settings: skipped)" if result.skipped else ""
    return (
        json.dumps(shown, indent=2)
        + f"\nexport_report.json: {result.output}/export_report.json{done}"
    )


JOB = JobSpec(
    summary="write a model where it is served (SparseEncoder dir, engines, ONNX), checked against the exact search",
    config=ExportConfig,
    flags=FLAGS,
    report=report,
)
