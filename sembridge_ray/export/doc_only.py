"""The inference-free (doc-only) variant: documents through the transferred SPLADE model, queries
without a model.

A sentence-transformers ``Router``: the ``query`` route is a ``SparseStaticEmbedding`` over the
model's own (after a transfer: the target) tokenizer, weighting each query token by its IDF in the
corpus (``log(1 + (N - df + 0.5) / (df + 0.5))``, BM25's, positive for every token; special tokens
0), the ``document`` route the model's Transformer and SpladePooling unchanged. A query then costs a
tokenisation, the way OpenSearch's doc-only models are served; the documents' vectors are those of
the full model.

It is another model, so it is scored (its nDCG@10 beside the full model's) rather than held to a
parity tolerance; ``sembridge_export.json`` in the written directory says which model it is."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sembridge_ray.export.base import NOT_HELD, Exported, ExportJob, Package, Tolerance, Vectors
from sembridge_ray.export.parity import exact_topk, width_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CONFIG = "sembridge_export.json"


def idf(
    tokenizer: PreTrainedTokenizerBase, texts: Iterable[str], vocab_size: int, batch: int = 1000
) -> np.ndarray:
    """(vocab_size,) float32 IDF of each token over ``texts`` (document frequency of the token's
    presence)."""
    df = np.zeros(vocab_size, np.int64)
    n, rest = 0, iter(texts)
    while chunk := list(itertools.islice(rest, batch)):
        for ids in tokenizer(chunk, add_special_tokens=False, truncation=False)["input_ids"]:
            df[np.unique(np.asarray(ids, np.int64))] += 1
        n += len(chunk)
    weights = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
    weights[[i for i in tokenizer.all_special_ids if i < vocab_size]] = 0.0
    return weights


def write(model_dir: str, out: Path, weights: np.ndarray, corpus: str, max_doc_length: int) -> Any:
    """Save the doc-only SparseEncoder of ``model_dir`` with query ``weights`` to ``out``; returns
    it, loaded back."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding

    from sembridge_ray.sparse.model import load_sparse_encoder

    full = load_sparse_encoder(model_dir, device="cpu", max_length=max_doc_length)
    static = SparseStaticEmbedding(
        full.tokenizer, weight=torch.from_numpy(weights.copy()), frozen=True
    )
    document: list[Any] = [full[0], full[1]]  # the model's Transformer and SpladePooling
    router = Router.for_query_document(query_modules=[static], document_modules=document)
    SparseEncoder(modules=[router], device="cpu").save(str(out))
    note = {
        "variant": "inference-free (doc-only)",
        "query": "SparseStaticEmbedding: each query token weighted by its IDF in the corpus, no model at query time",
        "document": "the model's MLM and SpladePooling, unchanged",
        "idf_corpus": corpus,
        "idf": "log(1 + (N - df + 0.5) / (df + 0.5)); special tokens 0",
        "source_model": model_dir,
    }
    (out / CONFIG).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
    return SparseEncoder(str(out), device="cpu")


@dataclass(frozen=True, kw_only=True)
class DocOnlyTarget:
    """The variant as an :class:`~sembridge_ray.export.base.ExportTarget`: written to
    ``<output>/model-doc-only`` with the IDF of the exported corpus, its queries encoded by it and
    searched exactly over the documents' vectors as encoded (the document route is the model's
    own)."""

    name: str = "doc-only"
    summary: str = (
        "an inference-free SparseEncoder: IDF-weighted query tokens "
        "(Router + SparseStaticEmbedding)"
    )
    package: Package | None = None
    tolerance: Tolerance = NOT_HELD
    schemes: tuple[str, ...] = ()

    def export(self, job: ExportJob) -> Exported:
        from sembridge_ray.sparse.encode import sparse_rows
        from sembridge_ray.sparse.model import load_tokenizer

        folder = job.out / "model-doc-only"
        docs, queries = job.docs, job.queries
        texts = job.corpus_texts()
        width = max(job.tokenizer_size, width_of(docs))
        weights = idf(load_tokenizer(job.model), (texts[d] for d in docs.ids), width)
        variant = write(job.model, folder, weights, job.dataset, job.max_doc_length)
        asked = variant.encode_query(
            [job.data.queries[q] for q in queries.ids], convert_to_tensor=True
        )
        static = Vectors.from_rows(queries.ids, *sparse_rows(asked))
        details: dict[str, object] = {"model": folder.name, "idf_corpus": job.dataset}
        return Exported(hits=exact_topk(docs, static, job.k), details=details, files=folder)


TARGET = DocOnlyTarget()
