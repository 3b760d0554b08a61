"""The evaluate job's settings that its steps read, kept apart from the steps so that a job's
config imports them without torch: the defaults the development scoring shares with the evaluate
job (:mod:`sembridge_ray.retrieval.dev`), and what the encoding step reads
(:mod:`sembridge_ray.retrieval.encode`)."""

from __future__ import annotations

from dataclasses import dataclass

from sembridge_ray.runtime.placement import Precision, ResourceConfig

TOP_K, STAGE_ROWS, ENCODE_BATCH, QUERY_BATCH, RUN_TAG = 100, 5000, 64, 32, "sembridge_ray"
"""The evaluate job's defaults (its config reads them from here): documents per query, texts per
staged chunk, per encoder call and queries per scoring call, the run's tag."""


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """What the step reads of a job's settings (the evaluate job's keys,
    ``EvaluateConfig.encoding()``); what a caller does not set is the evaluate job's default, so
    the export's cache keys are an evaluation's."""

    dataset: str
    cache_dir: str
    resources: ResourceConfig
    precision: Precision
    max_query_length: int
    max_doc_length: int
    query_max_active_dims: int | None = None
    doc_max_active_dims: int | None = None
    stage_rows: int = STAGE_ROWS
    encode_batch_size: int = ENCODE_BATCH
    trust_remote_code: bool = False
