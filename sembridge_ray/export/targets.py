"""The registry of export targets: what each writes, the package it needs and its tolerance.

A target's tolerance is what its parity (:mod:`sembridge_ray.export.parity`) must reach on the
evaluation queries, or the export fails (exit 2). Exact targets must equal the exact top-10 up to
ties on every query; a quantised or approximate one may lose at most its measured share of
overlap@10 and of nDCG@10 (``docs/export.md`` gives the measurement behind each number)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Literal

from sembridge_ray.errors import InputError

Kind = Literal["model", "engine", "files", "encoder", "variant"]


@dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    kind: Kind
    """``model``: a SparseEncoder directory; ``engine``: an index searched here; ``files``: mapping,
    bulk NDJSON and query bodies for a server; ``encoder``: the model in another runtime (its
    vectors are what is checked); ``variant``: another model made from it (scored beside it, not
    held to a tolerance)."""
    module: str = ""
    """The adapter in ``sembridge_ray.export`` (``build``, or ``export`` for encoders)."""
    imports: str = ""
    """The Python module the target needs ("" = none beyond the project's)."""
    package: str = ""
    """The pip package that provides it."""
    exact: bool = True
    """Whether the target must equal the exact top-10 up to ties on every query."""
    min_overlap: float = 1.0
    """Quantised or approximate targets: the lowest mean overlap@10 accepted."""
    max_ndcg_loss: float = 0.0
    """Quantised or approximate targets: the largest nDCG@10 drop (exact minus target) accepted."""
    url: bool = False
    """Whether ``--url`` (a server to push to) applies."""
    schemes: tuple[str, ...] = ("http", "https")
    """The URL schemes its client takes for ``--url``."""
    summary: str = ""

    def tolerance(self) -> dict[str, object]:
        if self.kind == "variant":
            return {"rule": "scored beside the full model, not held to a tolerance (another model)"}
        if self.exact:
            return {"rule": "identical up to ties on every query"}
        return {"min_overlap@10": self.min_overlap, "max_ndcg@10_loss": self.max_ndcg_loss}

    def adapter(self) -> object:
        return importlib.import_module(f"sembridge_ray.export.{self.module}")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="sentence-transformers",
            kind="model",
            summary="a SparseEncoder directory (a checkpoint's weights)",
        ),
        Target(
            name="qdrant",
            kind="engine",
            module="qdrant",
            imports="qdrant_client",
            package="qdrant-client",
            url=True,
            summary="Qdrant sparse vectors; embedded local mode, or --url a server",
        ),
        Target(
            name="milvus",
            kind="engine",
            module="milvus",
            imports="milvus_lite",
            package="milvus-lite",
            url=True,
            schemes=("http", "https", "tcp"),
            summary="Milvus SPARSE_FLOAT_VECTOR; embedded Milvus Lite, or --url a server",
        ),
        Target(
            name="seismic",
            kind="engine",
            module="seismic",
            imports="seismic",
            package="pyseismic-lsr",
            exact=False,
            min_overlap=0.95,
            max_ndcg_loss=0.02,
            summary="Seismic's approximate index (pyseismic-lsr)",
        ),
        Target(
            name="pisa",
            kind="engine",
            module="pisa",
            imports="pyterrier_pisa",
            package="pyterrier-pisa",
            exact=False,
            min_overlap=0.95,
            max_ndcg_loss=0.02,
            summary="PISA quantised impacts (pyterrier-pisa), scale recorded",
        ),
        Target(
            name="opensearch",
            kind="files",
            module="lucene",
            exact=False,
            min_overlap=0.97,
            max_ndcg_loss=0.01,
            url=True,
            summary="OpenSearch rank_features: mapping, bulk NDJSON (token strings), neural_sparse query body",
        ),
        Target(
            name="opensearch-sparse-vector",
            kind="files",
            module="lucene",
            exact=False,
            min_overlap=0.9,
            max_ndcg_loss=0.03,
            url=True,
            summary="OpenSearch 3.3+ sparse_vector: ids as strings, weights clipped at the ingest ceiling",
        ),
        Target(
            name="elasticsearch",
            kind="files",
            module="lucene",
            exact=False,
            min_overlap=0.97,
            max_ndcg_loss=0.01,
            url=True,
            summary="Elasticsearch sparse_vector: mapping, bulk NDJSON (token strings, '.' escaped), query body",
        ),
        Target(
            name="onnx",
            kind="encoder",
            module="onnx",
            imports="onnx",
            package="onnx",
            summary="ONNX Runtime encoder with the SPLADE max pooling in the graph (fp32)",
        ),
        Target(
            name="onnx-optimized",
            kind="encoder",
            module="onnx",
            imports="onnx",
            package="onnx",
            summary="the same graph after ONNX Runtime's extended graph optimisations (not machine-specific)",
        ),
        Target(
            name="onnx-int8",
            kind="encoder",
            module="onnx",
            imports="onnx",
            package="onnx",
            exact=False,
            min_overlap=0.8,
            max_ndcg_loss=0.03,
            summary="ONNX Runtime dynamic int8 quantisation of the weights",
        ),
        Target(
            name="openvino",
            kind="encoder",
            module="onnx",
            imports="openvino",
            package="openvino",
            summary="the fp32 graph as OpenVINO IR, run by OpenVINO's CPU plugin in f32",
        ),
        Target(
            name="doc-only",
            kind="variant",
            module="doc_only",
            exact=False,
            summary="an inference-free SparseEncoder: IDF-weighted query tokens (Router + SparseStaticEmbedding)",
        ),
    )
}


def target(name: str) -> Target:
    """The target called ``name``; InputError listing the known ones otherwise."""
    if name not in TARGETS:
        raise InputError(f"--target {name!r}: unknown (known: {', '.join(TARGETS)})")
    return TARGETS[name]
