"""Benchmark of ``bridge_weights`` against the released reference loop and the bare GEMM
(``jobs.bench_init``).

The reference (SemBridge's released code): the full cosine matrix, then ``entmax_bisect`` one row at
a time in fp32. The bare GEMM: the chunked fp32 ``new @ source.T`` alone, a floor no exact method
can beat."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import torch
from entmax import entmax_bisect

from benchmarks import child_env
from benchmarks.records import BridgeWeightsRun
from sembridge_ray.embed_init.weighting import _CHUNK_BYTES, bridge_weights, screen_dtype


def synthetic(n: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Clustered vectors (500 centres + noise): similarity structure closer to real bridge spaces
    than iid."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(500, d, generator=g)
    src = centres[torch.randint(0, 500, (m,), generator=g)] + 0.7 * torch.randn(m, d, generator=g)
    new = centres[torch.randint(0, 500, (n,), generator=g)] + 0.7 * torch.randn(n, d, generator=g)
    return new, src


def load_vectors(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``new.npy`` (N, D) and ``source.npy`` (M, D) float32, as written by
    :func:`write_real_vectors`."""
    return torch.from_numpy(np.load(folder / "new.npy")), torch.from_numpy(
        np.load(folder / "source.npy")
    )


def write_real_vectors(
    folder: Path, source_tok: str, target_tok: str, bridge: str = "minilm"
) -> None:
    """Bridge vectors of every source token and of the target's bridged tokens (the job's own
    rules)."""
    from sembridge_ray.embed_init.bridge import encode_strings, load_bridge, vocab_strings
    from sembridge_ray.embed_init.vocab import partition_vocab
    from sembridge_ray.sparse.model import load_tokenizer

    src, tgt = load_tokenizer(source_tok), load_tokenizer(target_tok)
    model = load_bridge(bridge)
    rest = set(partition_vocab(src, tgt).rest)
    strings = vocab_strings(tgt)
    new = [
        t
        for i, t in zip(
            strings.column("id").to_pylist(), strings.column("text").to_pylist(), strict=True
        )
        if i in rest
    ]
    folder.mkdir(parents=True, exist_ok=True)
    np.save(
        folder / "source.npy",
        encode_strings(model, vocab_strings(src).column("text").to_pylist(), 512),
    )
    np.save(folder / "new.npy", encode_strings(model, new, 512))


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=1)


def reference_loop(new: torch.Tensor, src: torch.Tensor, alpha: float) -> torch.Tensor:
    cos = _unit(new) @ _unit(src).T  # the full (N, M) matrix, as released
    return torch.stack([entmax_bisect(row, alpha=alpha, dim=-1) for row in cos])


def bare_gemm(new: torch.Tensor, src: torch.Tensor) -> float:
    """Seconds for the chunked fp32 GEMM alone (same chunking as bridge_weights)."""
    unit_new, unit_src = _unit(new), _unit(src)
    chunk = max(1, _CHUNK_BYTES // (4 * len(src)))
    start = time.perf_counter()
    for i in range(0, len(new), chunk):
        unit_new[i : i + chunk] @ unit_src.T
    return time.perf_counter() - start


def oracle(new: torch.Tensor, src: torch.Tensor, alpha: float) -> torch.Tensor:
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    return entmax_bisect(cos, alpha=alpha, dim=1, n_iter=60)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_growth_mb(fn: Callable[[], object]) -> float:
    """Peak RSS above the current RSS while ``fn()`` runs (Linux: VmHWM reset through
    /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - base) / 1024


def fresh_process_growth_mb(
    rows: int, vectors: str | None, shape: tuple[int, ...], alpha: float
) -> float:
    """:func:`rss_growth_mb` of bridge_weights on ``rows`` new tokens in a fresh process, so that
    memory freed earlier in this one (and kept by the allocator) cannot hide growth."""
    load = (
        f"b.load_vectors(Path({vectors!r}))"
        if vectors
        else f"b.synthetic({rows}, {shape[0]}, {shape[1]})"
    )
    code = (
        f"from pathlib import Path; from benchmarks import bridge_weights as b; new, src = {load}; "
        f"new = new.repeat(({rows} + len(new) - 1) // len(new), 1)[:{rows}].clone(); "
        f"print(b.rss_growth_mb(lambda: b.bridge_weights(new, src, {alpha})))"
    )
    cmd = [sys.executable, "-W", "ignore", "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=child_env())
    return float(out.stdout.strip().splitlines()[-1])


def run(
    new: torch.Tensor,
    src: torch.Tensor,
    alpha: float,
    ref_rows: int,
    vectors: str | None,
    memory_rows: int,
    repeats: int = 3,
) -> BridgeWeightsRun:
    n = len(new)
    ours_runs, gemm_runs = [], []
    for _ in range(repeats):  # alternate, so load elsewhere hits both alike; medians are reported
        start = time.perf_counter()
        w = bridge_weights(new, src, alpha)
        ours_runs.append((time.perf_counter() - start) / n)
        gemm_runs.append(bare_gemm(new, src) / n)
    ours, gemm = statistics.median(ours_runs), statistics.median(gemm_runs)
    sub = new[:ref_rows]
    start = time.perf_counter()
    ref = reference_loop(sub, src, alpha)
    ref_t = (time.perf_counter() - start) / len(sub)
    exact = oracle(sub, src, alpha)
    ours_dense = w.to_dense()[:ref_rows].double()
    support = torch.diff(w.crow_indices()).float()
    return cast(  # a BridgeWeightsRun, with the growth under a name that carries the row count
        BridgeWeightsRun,
        {
            "alpha": alpha,
            "new_tokens": n,
            "source_tokens": len(src),
            "dim": new.shape[1],
            "vectors": vectors or "synthetic",
            "ms_per_token": {
                "ours": round(ours * 1e3, 4),
                "reference_loop": round(ref_t * 1e3, 4),
                "bare_gemm": round(gemm * 1e3, 4),
            },
            "speedup_vs_reference": round(ref_t / ours, 1),
            "ratio_to_bare_gemm": round(ours / gemm, 2),
            "max_abs_err_vs_float64": {
                "ours": float((ours_dense - exact).abs().max()),
                "reference_fp32": float((ref.double() - exact).abs().max()),
            },
            "support": {"mean": round(float(support.mean()), 2), "max": int(support.max())},
            "screening_gemm": str(screen_dtype()).replace("torch.", ""),
            "threads": {"gemm": torch.get_num_threads(), "per_chunk_solve": 1},
            "load_average_1m": os.getloadavg()[0],
            "runs_ratio_to_bare_gemm": [
                round(a / b, 2) for a, b in zip(ours_runs, gemm_runs, strict=True)
            ],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            f"rss_growth_mb_{memory_rows}_rows": round(
                fresh_process_growth_mb(memory_rows, vectors, src.shape, alpha), 1
            ),
        },
    )


def main(args: argparse.Namespace) -> BridgeWeightsRun:
    if args.write_real:
        write_real_vectors(Path(args.vectors), *args.write_real)
    new, src = (
        load_vectors(Path(args.vectors))
        if args.vectors
        else synthetic(args.new, args.source, args.dim)
    )
    new = new[: args.new]
    result = run(new, src, args.alpha, args.ref_rows, args.vectors, args.memory_rows)
    print(json.dumps(result))
    return result
