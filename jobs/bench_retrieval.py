"""Benchmark exact sparse retrieval: sharded Ray actors vs one process, on a synthetic SPLADE-like corpus.

    ray job submit --working-dir . -- python -m jobs.bench_retrieval --docs 1000000 --workers 2
Smoke (2 CPUs, ~30 s):  python -m jobs.bench_retrieval --docs 20000 --queries 200

Prints queries/s of both, the speed-up, whether the top-k lists are identical, and each actor's peak memory.
"""

from __future__ import annotations

import json
import sys

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.presets import PRESET_DIR
from sembridge_ray.retrieval.synthetic import BenchConfig

FLAGS = [Flag("--docs", "docs"), Flag("--queries", "queries"), Flag("--workers", "workers"),
         Flag("--top-k", "top_k"), Flag("--output", "output")]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        cfg = parse_config(BenchConfig, argv, flags=FLAGS, preset_dir=PRESET_DIR, prefix="bench_retrieval_",
                           description=__doc__)
        from sembridge_ray.distributed.bench_retrieval import run_bench
        from sembridge_ray.outputs import atomic_write_json

        report = run_bench(cfg)
        print(json.dumps(report, indent=2))
        print(f"single process {report['single_process_qps']} q/s | Ray x{cfg.workers} {report['ray_qps']} q/s | "
              f"speed-up {report['speedup']}x (scipy brute force: {report.get('speedup_vs_scipy', '-')}x) | "
              f"identical top-{cfg.top_k}: {report['identical_top_k']}")
        if cfg.output:
            atomic_write_json(cfg.output, report)
        return 0 if report["identical_top_k"] else 1

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
