"""ONNX: the SparseEncoder as one ONNX graph, token ids in, SPLADE vector out: the MLM, then the max
pooling (``log1p(relu(logits))`` maxed over the unpadded tokens) inside the graph, so no runtime can
drop it (the trap of elastic/eland#827). The model's ``max_active_dims`` and the query/document
lengths are kept in ``sembridge_export.json`` and applied by :class:`OnnxSparseEncoder`.

Variants: ``onnx`` (``torch.onnx.export``, fp32), ``onnx-optimized`` (the same graph after ONNX
Runtime's extended graph optimisations, saved; the level above fuses for the CPU at hand, which a
saved model must not), ``onnx-int8`` (ONNX Runtime's dynamic int8 quantisation of the weights),
``openvino`` (the fp32 graph converted to OpenVINO's IR, ``openvino_model.xml`` and ``.bin``, run in
f32: OpenVINO's CPU plugin would otherwise pick bf16 on CPUs that have it, so the vectors would
depend on the machine). The directory holds the graph, the tokenizer files and
``sembridge_export.json``; sentence-transformers' ``backend="onnx"`` / ``"openvino"`` need optimum
(and optimum-intel), which this stack cannot install (they pin transformers < 5), so
:class:`OnnxSparseEncoder` (ONNX Runtime or OpenVINO, and the tokenizer) is the reader."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sembridge_ray.export.base import (
    EXACT,
    Exported,
    ExportJob,
    Package,
    Tally,
    Tolerance,
    Vectors,
    untallied,
)
from sembridge_ray.export.parity import exact_topk
from sembridge_ray.runtime.errors import InputError

CONFIG, GRAPH, OPENVINO_GRAPH = "sembridge_export.json", "model.onnx", "openvino_model.xml"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17


def graph_name(variant: str) -> str:
    """The file the variant's runtime reads."""
    return _BY_NAME[variant].graph


def export(
    model_dir: str, out: Path, variant: str, max_query_length: int, max_doc_length: int
) -> dict[str, object]:
    """Write the ONNX encoder of ``model_dir`` to ``out``; returns what the report says about it."""
    import torch

    from sembridge_ray.sparse.model import load_sparse_encoder

    model = load_sparse_encoder(model_dir, device="cpu", max_length=max_doc_length)
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    # a plain SPLADE encoder only: Transformer + SpladePooling, no Router, no prompts
    if len(model) != 2 or not isinstance(model[1], SpladePooling) or any(model.prompts.values()):
        raise InputError(
            "the ONNX targets export a plain SPLADE encoder (an MLM + SpladePooling, no router/prompts)"
        )
    example = model.preprocess(["an example", "another, longer example text"])
    names = [n for n in INPUTS if n in example]
    found = _BY_NAME[variant]
    out.mkdir(parents=True, exist_ok=True)
    plain = out / (GRAPH if found.finish is None else "model.fp32.onnx")

    # traced on `example`: token ids of `names` in, the SPLADE vector out
    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(dict(zip(names, inputs, strict=True)))["sentence_embedding"]

    axes = {n: {0: "batch", 1: "tokens"} for n in names} | {"vector": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(
            Graph().eval(),
            tuple(example[n] for n in names),
            str(plain),
            input_names=names,
            output_names=["vector"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    if found.finish is not None:  # the plain fp32 graph made the variant, then removed
        found.finish(plain, out / found.graph)
        plain.unlink()
    model.tokenizer.save_pretrained(str(out))
    config = {
        "variant": variant,
        "inputs": names,
        "max_query_length": max_query_length,
        "max_doc_length": max_doc_length,
        "max_active_dims": getattr(model, "max_active_dims", None),
        "vocab_size": len(model.tokenizer),
        "pooling": "max over tokens of log1p(relu(MLM logits)), in the graph",
        "opset": OPSET,
        "graph": found.graph,
    }
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return config


def optimised(plain: Path, graph: Path) -> None:
    """ONNX Runtime's extended level of graph optimisations (the highest bakes in this machine's
    CPU)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(graph)
    ort.InferenceSession(str(plain), options, providers=["CPUExecutionProvider"])


def quantised_int8(plain: Path, graph: Path) -> None:
    """ONNX Runtime's dynamic int8 quantisation of the weights."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(plain), str(graph), weight_type=QuantType.QInt8)


def openvino_ir(plain: Path, graph: Path) -> None:
    """OpenVINO's IR, weights kept in f32."""
    import openvino as ov

    ov.save_model(ov.convert_model(str(plain)), str(graph), compress_to_fp16=False)


class OnnxSparseEncoder:
    """An exported directory, run with ONNX Runtime on the CPU: texts -> sparse rows (term ids
    ascending, weights > 0), as :func:`sembridge_ray.sparse.encode.encode_texts` returns them."""

    def __init__(self, path: str | Path, threads: int = 0) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.config = json.loads((self.path / CONFIG).read_text(encoding="utf-8"))
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        graph = self.path / graph_name(self.config["variant"])
        self.run = _openvino(graph, threads) if graph.suffix == ".xml" else _ort(graph, threads)

    def encode(
        self,
        texts: Sequence[str],
        role: str = "document",
        batch_size: int = 32,
        tally: Tally = untallied,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        length = self.config["max_query_length" if role == "query" else "max_doc_length"]
        limit = self.config.get("max_active_dims")
        order = np.argsort([-len(t) for t in texts], kind="stable")
        indices: list[np.ndarray] = [np.zeros(0, np.int32)] * len(texts)
        values: list[np.ndarray] = [np.zeros(0, np.float32)] * len(texts)
        for start in range(0, len(texts), batch_size):
            chosen = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in chosen],
                padding=True,
                truncation=True,
                max_length=length,
                return_tensors="np",
            )
            feeds = {n: batch[n].astype(np.int64) for n in self.config["inputs"]}
            dense = self.run(feeds)
            for i, row in zip(chosen, dense, strict=True):
                nz = np.flatnonzero(row > 0)
                if limit and len(nz) > limit:
                    nz = np.sort(nz[np.argsort(-row[nz], kind="stable")[:limit]])
                indices[i], values[i] = nz.astype(np.int32), row[nz].astype(np.float32)
            tally(len(chosen))
        return indices, values


Runner = Callable[[dict[str, np.ndarray]], np.ndarray]


def _ort(graph: Path, threads: int) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    return lambda feeds: np.asarray(session.run(None, feeds)[0])


def _openvino(graph: Path, threads: int) -> Runner:
    import openvino as ov

    settings: dict[str, object] = {"INFERENCE_PRECISION_HINT": "f32"}  # never bf16 by CPU
    if threads > 0:
        settings["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(str(graph), "CPU", settings)
    return lambda feeds: np.asarray(compiled(feeds)[0])


@dataclass(frozen=True, kw_only=True)
class OnnxTarget:
    """One variant as an :class:`~sembridge_ray.export.base.ExportTarget`: the model exported to
    ``<output>/onnx``, the corpus and the queries encoded again through it and searched exactly (its
    vectors are what the parity checks)."""

    name: str
    summary: str
    package: Package | None
    tolerance: Tolerance = EXACT
    graph: str = GRAPH
    """The file its runtime reads."""
    finish: Callable[[Path, Path], None] | None = None
    """(plain fp32 graph, ``graph``): writes the variant from the plain export (None: the plain
    export is the variant)."""
    schemes: tuple[str, ...] = ()

    def export(self, job: ExportJob) -> Exported:
        folder = job.out / "onnx"
        details = export(job.model, folder, self.name, job.max_query_length, job.max_doc_length)
        encoder = OnnxSparseEncoder(folder, threads=job.threads)
        texts = job.corpus_texts()
        encoded = []
        for role, vectors, text in (
            ("document", job.docs, texts),
            ("query", job.queries, job.data.queries),
        ):
            with job.counted(f"{self.name}: encoding {role}s", len(vectors), "texts") as tally:
                rows = encoder.encode([text[i] for i in vectors.ids], role, tally=tally)
            encoded.append(Vectors.from_rows(vectors.ids, *rows))
        hits = exact_topk(encoded[0], encoded[1], job.k)
        return Exported(hits=hits, details=details, files=folder)


ONNX = Package("onnx", "onnx")
TARGETS = (
    OnnxTarget(
        name="onnx",
        summary="ONNX Runtime encoder with the SPLADE max pooling in the graph (fp32)",
        package=ONNX,
    ),
    OnnxTarget(
        name="onnx-optimized",
        summary="the same graph after ONNX Runtime's extended graph optimisations "
        "(not machine-specific)",
        package=ONNX,
        finish=optimised,
    ),
    OnnxTarget(
        name="onnx-int8",
        summary="ONNX Runtime dynamic int8 quantisation of the weights",
        package=ONNX,
        tolerance=Tolerance.within(min_overlap=0.8, max_ndcg_loss=0.03),
        finish=quantised_int8,
    ),
    OnnxTarget(
        name="openvino",
        summary="the fp32 graph as OpenVINO IR, run by OpenVINO's CPU plugin in f32",
        package=Package("openvino", "openvino"),
        graph=OPENVINO_GRAPH,
        finish=openvino_ir,
    ),
)
_BY_NAME = {found.name: found for found in TARGETS}
