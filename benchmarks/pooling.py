"""Peak memory of one SPLADE training step, plain vs chunked pooling (each variant in its own
process).

    python -m benchmarks.pooling --chunk 32 --grads /tmp/g.pt    # one variant; prints JSON
``jobs.bench_train --memory`` runs both variants and compares their peaks and gradients.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypedDict, cast

import torch

from benchmarks import child_env
from benchmarks.peers import peak_rss_mb, rss_mb
from sembridge_ray.sparse.losses import LossWeights, splade_objective
from sembridge_ray.sparse.model import SpladeEncoder


class StepMemory(TypedDict):
    """One variant's step, as its process prints it."""

    chunk: int
    peak_rss_mb: float
    step_rss_increase_mb: float
    rss_before_step_mb: float
    seconds: float
    loss: float


GradDiffs = TypedDict(  # a key that is no identifier
    "GradDiffs",
    {
        "max_abs_diff": float,
        "tensor": str,
        "tensor_max_abs": float,
        "max_abs_diff_over_largest_grad": float,
        "tensors_within_1e-5": int,
        "tensors": int,
    },
)
"""The largest difference between two variants' gradients, and which tensor it is in."""


class MemoryComparison(TypedDict):
    """``jobs.bench_train --memory``: both variants, their ratios and their gradients'
    differences."""

    case: dict[str, int | str]
    naive: StepMemory
    chunked: StepMemory
    peak_ratio: float
    step_increase_ratio: float
    grads_fp32: GradDiffs
    grads_float64_batch8: GradDiffs
    fp32_error_vs_float64: dict[str, GradDiffs]


@dataclass(frozen=True, kw_only=True)
class MemoryCase:
    """One training step of a shallow BERT MLM: the vocabulary projection dominates memory, as in
    BERT-base."""

    batch: int = 64
    doc_length: int = 256
    query_length: int = 64
    vocab: int = 30_522
    hidden: int = 128
    layers: int = 1
    seed: int = 0
    dtype: str = "float32"


def _tokens(case: MemoryCase, length: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, case.vocab, (case.batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def measure_step(case: MemoryCase, chunk: int, grads_path: Path | None = None) -> StepMemory:
    """Run one forward + backward + AdamW step; peak RSS of this process, and its rise over the
    pre-step RSS."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(case.seed)
    config = BertConfig(
        vocab_size=case.vocab,
        hidden_size=case.hidden,
        num_hidden_layers=case.layers,
        num_attention_heads=2,
        intermediate_size=4 * case.hidden,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = (
        SpladeEncoder(BertForMaskedLM(config), chunk=chunk).to(getattr(torch, case.dtype)).train()
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    g = torch.Generator().manual_seed(case.seed + 1)
    queries, docs = _tokens(case, case.query_length, g), _tokens(case, case.doc_length, g)
    gc.collect()
    before, start = rss_mb(), time.perf_counter()
    reps = model(queries, docs)
    parts = splade_objective(reps[0], reps[1:], LossWeights(lambda_q=5e-5, lambda_d=3e-5))
    parts["loss"].backward()
    if grads_path is not None:
        torch.save(
            {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, grads_path
        )
    optimizer.step()
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    return {
        "chunk": chunk,
        "peak_rss_mb": round(peak, 1),
        "step_rss_increase_mb": round(peak - before, 1),
        "rss_before_step_mb": round(before, 1),
        "seconds": round(seconds, 2),
        "loss": float(parts["loss"]),
    }


def _run_variant(case: MemoryCase, chunk: int, grads: Path) -> StepMemory:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.pooling",
        "--chunk",
        str(chunk),
        "--grads",
        str(grads),
        "--case",
        json.dumps(asdict(case)),
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=child_env())
    # what measure_step printed
    return cast(StepMemory, json.loads(done.stdout.strip().splitlines()[-1]))


def _grad_diffs(a: Path, b: Path) -> GradDiffs:
    naive, chunked = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    diffs = {k: float((naive[k].double() - chunked[k].double()).abs().max()) for k in naive}
    worst = max(diffs, key=lambda k: diffs[k])
    return {
        "max_abs_diff": diffs[worst],
        "tensor": worst,
        "tensor_max_abs": float(naive[worst].abs().max()),
        "max_abs_diff_over_largest_grad": diffs[worst]
        / max(float(v.abs().max()) for v in naive.values()),
        "tensors_within_1e-5": sum(d <= 1e-5 for d in diffs.values()),
        "tensors": len(diffs),
    }


def compare_memory(case: MemoryCase, chunk: int, workdir: Path) -> MemoryComparison:
    """Both variants in fresh processes (peak RSS is per process) and their gradients' largest
    difference.

    In fp32 the two paths sum a gradient over B·T tokens in different orders (whole vs per slice),
    which moves sums over 20k tokens, such as a LayerNorm weight's, by ~1e-5 relative. A float64 run
    of the same step on a smaller batch shows the paths agree up to rounding, and a float64 run of
    the full step (chunked; it equals the plain path there) measures how far each fp32 path is from
    the exact gradients."""
    runs = {
        name: _run_variant(case, size, workdir / f"grads-{name}.pt")
        for name, size in (("naive", 0), ("chunked", chunk))
    }
    small = replace(case, batch=8, dtype="float64")
    for name, size in (("naive64", 0), ("chunked64", chunk)):
        _run_variant(small, size, workdir / f"grads-{name}.pt")
    # the exact gradients
    _run_variant(replace(case, dtype="float64"), chunk, workdir / "grads-reference.pt")
    return {
        "case": asdict(case),
        "naive": runs["naive"],
        "chunked": runs["chunked"],
        "peak_ratio": round(runs["chunked"]["peak_rss_mb"] / runs["naive"]["peak_rss_mb"], 3),
        "step_increase_ratio": round(
            runs["chunked"]["step_rss_increase_mb"] / runs["naive"]["step_rss_increase_mb"], 3
        ),
        "grads_fp32": _grad_diffs(workdir / "grads-naive.pt", workdir / "grads-chunked.pt"),
        "grads_float64_batch8": _grad_diffs(
            workdir / "grads-naive64.pt", workdir / "grads-chunked64.pt"
        ),
        "fp32_error_vs_float64": {
            name: _grad_diffs(workdir / "grads-reference.pt", workdir / f"grads-{name}.pt")
            for name in ("naive", "chunked")
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--chunk", type=int, required=True, help="0 = plain pooling over the full logits"
    )
    parser.add_argument("--grads", type=Path, default=None, help="save the gradients here")
    parser.add_argument("--case", default="{}", help="MemoryCase fields as JSON")
    args = parser.parse_args(argv)
    print(json.dumps(measure_step(MemoryCase(**json.loads(args.case)), args.chunk, args.grads)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
