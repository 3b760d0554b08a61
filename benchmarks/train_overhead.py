"""Throughput of the Ray Train fine-tuning loop vs the same steps in one plain torch process.

Both run ``sparse.loop.train`` over the same training stream (SICK pairs) with the same model and
thread count; the difference is Ray Train: Ray Data iteration, reporting, checkpointing and the
worker process. The rate is steady-state examples/s: the first logging window (start-up, first
batch) is left out of both."""

from __future__ import annotations

import itertools
import json
import logging
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sembridge_ray.bundled import minilm_dir
from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.data.sick import read_sick_split
from sembridge_ray.data.stream import StreamInfo, materialise_stream
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.finetune.config import FinetuneConfig, OptimConfig
from sembridge_ray.resources import sick_dir
from sembridge_ray.runtime.placement import ResourceConfig
from sembridge_ray.sparse import loop
from sembridge_ray.sparse.model import SpladeEncoder, load_mlm, load_tokenizer, save_sparse_encoder

log = logging.getLogger(__name__)
# The real bert-base-uncased tokenizer beside the checkout (as in tests/conftest.py), else the tiny
# fixture's.
SHARED_DATA = Path(
    os.environ.get(
        "SEMBRIDGE_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"
    )
)
SHARED_TOKENIZER = SHARED_DATA / "tokenizers" / "bert-base-uncased"


def bench_model(out: Path, tokenizer_dir: Path, hidden: int = 256, layers: int = 2) -> Path:
    """A randomly initialised shallow BERT MLM over a real vocabulary, as a SparseEncoder
    directory."""
    from transformers import BertConfig, BertForMaskedLM

    tok = load_tokenizer(str(tokenizer_dir))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        pad_token_id=tok.pad_token_id,
    )
    save_sparse_encoder(BertForMaskedLM(config), tok, out)
    return out


def sick_pairs(out: Path) -> Path:
    pairs = read_sick_split(sick_dir(), "train")
    pq.write_table(pa.table({QUERY: [p.a for p in pairs], POSITIVE: [p.b for p in pairs]}), out)
    return out


def plain_run(cfg: FinetuneConfig, threads: int) -> list[dict[str, float]]:
    """The same steps as the Ray run, in this process: no Ray, no DDP, no checkpoints."""
    torch.set_num_threads(threads)
    stream, info = materialise_stream(
        StreamInfo(
            spec=cfg.train,
            split=cfg.split,
            hard_negatives=cfg.hard_negatives,
            batch_size=cfg.optim.batch_size,
            epochs=cfg.optim.epochs,
            max_steps=cfg.optim.max_steps,
            seed=cfg.seed,
        ),
        Path(cfg.output) / "data",
    )
    mlm, tok = load_mlm(cfg.model)
    model = SpladeEncoder(mlm, chunk=cfg.pool_chunk)
    optimizer, scheduler = loop.build_optimizer(model, cfg.optim, info.total_steps)
    raw = (
        b.to_pydict() for b in pq.ParquetFile(stream).iter_batches(batch_size=cfg.optim.batch_size)
    )
    batches = loop.pair_batches(raw, tok, cfg.max_query_length, cfg.max_doc_length)
    plan = loop.LoopPlan(
        total_steps=info.total_steps,
        global_batch=cfg.optim.batch_size,
        loss=cfg.loss,
        clip_norm=cfg.optim.clip_norm,
        bf16=False,
        log_every=cfg.log_every,
    )
    return [m for _, m in loop.train(model, batches, optimizer, scheduler, plan) if m is not None]


def steady_rate(metrics: list[dict[str, float]], batch: int) -> float:
    """Examples/s over every logging window but the first (which holds start-up and the first
    batch)."""
    examples = seconds = 0.0
    for prev, cur in itertools.pairwise(metrics):
        count = batch * (cur["step"] - prev["step"])
        examples, seconds = examples + count, seconds + count / cur["examples_per_s"]
    return examples / seconds


def compare_overhead(
    steps: int = 40,
    batch: int = 32,
    workers: int = 1,
    cpus_per_worker: float = 2,
    log_every: int = 5,
    workdir: Path | None = None,
) -> dict[str, Any]:
    from sembridge_ray.recipes.finetune.run import run_finetune

    work = Path(workdir or tempfile.mkdtemp(prefix="bench-train-"))
    # bert-base-uncased's vocabulary: beside the checkout, else the bundled MiniLM's (the same
    # 30,522 pieces)
    tokenizer = SHARED_TOKENIZER if SHARED_TOKENIZER.is_dir() else minilm_dir()
    cfg = FinetuneConfig(
        model=str(bench_model(work / "model", tokenizer)),
        train=str(sick_pairs(work / "pairs.parquet")),
        output=str(work / "plain"),
        max_query_length=32,
        max_doc_length=64,
        log_every=log_every,
        checkpoint_every=steps,
        optim=OptimConfig(batch_size=batch, max_steps=steps),
        resources=ResourceConfig(workers=workers, cpus_per_worker=cpus_per_worker),
    )
    plain = steady_rate(plain_run(cfg, threads=max(1, round(cpus_per_worker * workers))), batch)
    ray_cfg = replace(cfg, output=str(work / "ray"))
    run_finetune(ray_cfg, executor=RayExecutor())
    lines = (work / "ray" / "metrics.jsonl").read_text().splitlines()
    ray_rate = steady_rate([json.loads(x) for x in lines], batch)
    return {
        "steps": steps,
        "batch": batch,
        "workers": workers,
        "cpus_per_worker": cpus_per_worker,
        "tokenizer": str(tokenizer),
        "plain_examples_per_s": round(plain, 2),
        "ray_examples_per_s": round(ray_rate, 2),
        "overhead_pct": round(100 * (1 - ray_rate / plain), 2),
    }
