"""Benchmark exact sparse retrieval: sharded Ray actors vs one process, on a synthetic SPLADE-like
corpus.

    ray job submit --working-dir . -- python -m jobs.bench_retrieval --docs 1000000 --workers 2
Smoke (2 CPUs, ~30 s):  python -m jobs.bench_retrieval --docs 20000 --queries 200

Prints queries/s of both, the speed-up, whether the top-k lists are identical, and each actor's peak
memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.synthetic import BenchConfig
from sembridge_ray.cli import parse_config, run_job
from sembridge_ray.recipes import Flag

FLAGS = [
    Flag(name="--docs", key="docs"),
    Flag(name="--queries", key="queries"),
    Flag(name="--workers", key="workers"),
    Flag(name="--top-k", key="top_k"),
    Flag(name="--output", key="output"),
]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        cfg, _ = parse_config(
            BenchConfig, argv, flags=FLAGS, job="bench_retrieval", description=__doc__ or ""
        )
        from benchmarks.retrieval import run_bench
        from sembridge_ray.runtime.outputs import atomic_write_json

        report = run_bench(cfg)
        print(json.dumps(report, indent=2))
        print(
            f"single process {report['single_process_qps']} q/s | Ray x{cfg.workers} {report['ray_qps']} q/s | "
            f"speed-up {report['speedup']}x (scipy brute force: {report.get('speedup_vs_scipy', '-')}x) | "
            f"identical top-{cfg.top_k}: {report['identical_top_k']}"
        )
        if cfg.output:
            atomic_write_json(Path(cfg.output), report)
        return 0 if report["identical_top_k"] else 1

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
