"""Benchmark of the export targets (issue 36), not a test: encoding and search throughput of each
target against the project's exact search on one corpus (the demo's: SICK test sentences, the
bundled MiniLM SPLADE), with ratios and peak memory, and ONNX Runtime's encoding rate against
PyTorch fp32.

    python -m jobs.bench_export --docs 2000 --queries 200          # about 3 minutes on 2 CPUs
    python benchmarks/export_targets.py --model DIR --dataset SPEC --split test

Each side runs in its own child process (spawned), so its peak resident memory (``ru_maxrss``) is
its own: the same documents and queries are handed to each; the exact search's child is the baseline
of the ratios. One JSON line per side, then a table. One thread for every side (``torch`` and ONNX
Runtime intra-op, Seismic, PISA)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Any

ENGINES = (
    "qdrant",
    "milvus",
    "seismic",
    "pisa",
    "opensearch",
    "opensearch-sparse-vector",
    "elasticsearch",
)
ENCODERS = ("onnx", "onnx-optimized", "onnx-int8", "openvino")


def load(
    model: str, dataset: str, split: str, docs: int, queries: int
) -> tuple[list[str], list[str], list[str], list[str], Any]:
    from sembridge_ray.bundled import resolve
    from sembridge_ray.data.registry import load_retrieval
    from sembridge_ray.data.schema import ID, TEXT

    data = load_retrieval(resolve(dataset), split)
    doc_ids, texts = [], []
    for batch in data.corpus.batches(10_000):
        doc_ids += batch.column(ID).to_pylist()
        texts += batch.column(TEXT).to_pylist()
    qids = sorted(q for q in data.qrels if data.queries.get(q, "").strip())[:queries]
    return doc_ids[:docs], texts[:docs], qids, [data.queries[q] for q in qids], data.qrels


def torch_encode(model: str, texts: list[str], role: str, length: int) -> tuple[Any, float]:
    import torch

    from sembridge_ray.bundled import resolve
    from sembridge_ray.sparse.encode import encode_texts
    from sembridge_ray.sparse.model import load_sparse_encoder

    torch.set_num_threads(1)
    encoder = load_sparse_encoder(resolve(model), device="cpu", max_length=length)
    start = time.perf_counter()
    rows = encode_texts(encoder, texts, 32, role)
    return rows, time.perf_counter() - start


def side(name: str, args: dict[str, Any], queue: Any) -> None:
    """One side in this (child) process: what it measured, and its peak memory."""
    import pickle

    from sembridge_ray.export.base import Vectors
    from sembridge_ray.export.parity import exact_topk, parity

    with open(args["vectors"], "rb") as fh:
        docs, queries, qrels = pickle.load(fh)
    out: dict[str, Any] = {"side": name}
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        folder = Path(tmp)
        if name == "exact":  # the project's index built (timed apart), then searched
            import pyarrow as pa

            from sembridge_ray.export.parity import width_of
            from sembridge_ray.retrieval.index import PAD, build_shard, rank_ids, shard_topk

            start = time.perf_counter()
            ranks, sorted_ids = rank_ids(pa.array(docs.ids, pa.string()))
            shard = build_shard(docs.rows, ranks, width_of(docs, queries))
            out["build_s"] = time.perf_counter() - start
            start = time.perf_counter()
            top = shard_topk(shard, queries.rows, 10)
            out["search_s"] = time.perf_counter() - start
            names = sorted_ids.to_pylist()
            hits = [[names[r] for r in row if r != PAD] for row in top.ranks]
        elif name == "torch-fp32":
            _, out["encode_s"] = torch_encode(
                args["model"], args["texts"], "document", args["max_doc_length"]
            )
            hits = exact_topk(docs, queries)
        elif name in ENCODERS:
            from sembridge_ray.bundled import resolve
            from sembridge_ray.export import onnx

            onnx.export(
                resolve(args["model"]),
                folder,
                name,
                args["max_query_length"],
                args["max_doc_length"],
            )
            encoder = onnx.OnnxSparseEncoder(folder, threads=1)
            start = time.perf_counter()
            rows = encoder.encode(args["texts"], "document")
            out["encode_s"] = time.perf_counter() - start
            asked = Vectors.from_rows(queries.ids, *encoder.encode(args["query_texts"], "query"))
            hits = exact_topk(Vectors.from_rows(docs.ids, *rows), asked)
        else:
            from sembridge_ray.export import lucene
            from sembridge_ray.export.engine import EngineTarget
            from sembridge_ray.export.targets import TARGETS

            found = TARGETS[name]
            start = time.perf_counter()
            engine: Any
            if isinstance(found, EngineTarget):
                engine, _ = found.build(folder, docs)
            else:  # the server targets' files, searched as the engine stores them
                engine, _ = lucene.build(folder, name, docs, queries, args["vocab"], 10)
            out["build_s"] = time.perf_counter() - start
            start = time.perf_counter()
            hits = engine.search(queries, 10)
            out["search_s"] = time.perf_counter() - start
            engine.close()
    out |= parity(docs, queries, hits, qrels).report()
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    queue.put(out)


def run_side(name: str, args: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=side, args=(name, args, queue))
    child.start()
    while True:  # read before joining: a child blocks on exit until what it queued is read
        try:
            result: dict[str, Any] = queue.get(timeout=5)
            break
        except Empty:
            if not child.is_alive():
                return {"side": name, "error": f"exit {child.exitcode}"}
    child.join()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", default="minilm-splade", help="SparseEncoder directory or bundled name"
    )
    parser.add_argument(
        "--dataset", default="sick", help="dataset spec (default: the demo's, SICK test)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--docs", type=int, default=2000, help="documents (the corpus's first N)")
    parser.add_argument("--queries", type=int, default=200, help="judged queries")
    sides = ("exact", "torch-fp32", *ENGINES, *ENCODERS)
    parser.add_argument("--sides", default=",".join(sides))
    args = parser.parse_args(argv)
    unknown = [x for x in args.sides.split(",") if x not in sides]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)} (choose from {', '.join(sides)})")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import pickle

    from sembridge_ray.bundled import resolve
    from sembridge_ray.export.base import Vectors
    from sembridge_ray.sparse.model import load_tokenizer

    doc_ids, texts, qids, query_texts, qrels = load(
        args.model, args.dataset, args.split, args.docs, args.queries
    )
    doc_rows, _ = torch_encode(args.model, texts, "document", 256)
    query_rows, _ = torch_encode(args.model, query_texts, "query", 64)
    docs, queries = Vectors.from_rows(doc_ids, *doc_rows), Vectors.from_rows(qids, *query_rows)
    tokenizer = load_tokenizer(resolve(args.model))
    vocab = [str(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        vectors = Path(tmp) / "vectors.pkl"
        with open(vectors, "wb") as fh:
            pickle.dump((docs, queries, {q: qrels[q] for q in qids}), fh)
        shared = {
            "vectors": str(vectors),
            "model": args.model,
            "texts": texts,
            "query_texts": query_texts,
            "vocab": vocab,
            "max_query_length": 64,
            "max_doc_length": 256,
        }
        lines: list[dict[str, Any]] = []
        # each line as its side ends (exact and torch-fp32 first: the bases)
        for name in args.sides.split(","):
            line = run_side(name, shared)
            lines.append(annotate(line, lines, len(docs), len(queries)))
            print(json.dumps(line), flush=True)
    print(table(lines))
    return 0


def annotate(
    line: dict[str, Any], done: list[dict[str, Any]], docs: int, queries: int
) -> dict[str, Any]:
    """Add the ratios to the exact search (search time, peak memory) and to PyTorch fp32 (encoding
    time)."""
    base = next((x for x in [*done, line] if x["side"] == "exact"), {})
    fp32 = next((x for x in [*done, line] if x["side"] == "torch-fp32"), {})
    line |= {"docs": docs, "queries": queries}
    if "search_s" in line and base.get("search_s"):
        line["search_qps"] = round(queries / line["search_s"], 1)
        line["search_ratio_vs_exact"] = round(base["search_s"] / line["search_s"], 3)
    if "encode_s" in line and fp32.get("encode_s"):
        line["encode_docs_per_s"] = round(docs / line["encode_s"], 1)
        line["encode_ratio_vs_torch_fp32"] = round(fp32["encode_s"] / line["encode_s"], 3)
    if base.get("peak_rss_mb") and "peak_rss_mb" in line:
        line["peak_rss_ratio_vs_exact"] = round(line["peak_rss_mb"] / base["peak_rss_mb"], 2)
    return line


def table(lines: list[dict[str, Any]]) -> str:
    cols = (
        "side",
        "overlap@10",
        "identical_up_to_ties",
        "ndcg@10_exact",
        "ndcg@10_target",
        "build_s",
        "search_qps",
        "search_ratio_vs_exact",
        "encode_docs_per_s",
        "encode_ratio_vs_torch_fp32",
        "peak_rss_mb",
        "peak_rss_ratio_vs_exact",
    )
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for line in lines:
        cells = [line.get(c, "") for c in cols]
        rows.append(
            "| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in cells) + " |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
