"""Fine-tuning benchmarks (print JSON figures; not tests). Run them with nothing else going on the
machine.

    python -m jobs.bench_train --memory      # peak RSS of one step, batch 64 x 256 tokens, V = 30,522:
                                             # chunked vs plain pooling (target <= 50%), gradients compared
    python -m jobs.bench_train --overhead    # examples/s, Ray Train loop vs the same steps in plain torch
                                             # (target: overhead <= 15%)
Through a cluster: ray job submit --working-dir . -- python -m jobs.bench_train --overhead --workers
2"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--overhead", action="store_true")
    parser.add_argument("--chunk", type=int, default=32, help="pooling slice (tokens) for --memory")
    parser.add_argument("--memory-batch", type=int, default=64, help="batch for --memory")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32, help="global batch for --overhead")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cpus-per-worker", type=float, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if not (args.memory or args.overhead):
        parser.error("choose --memory and/or --overhead")
    if args.memory:
        from benchmarks.pooling import MemoryCase, compare_memory

        with tempfile.TemporaryDirectory() as tmp:
            print(
                json.dumps(
                    {
                        "memory": compare_memory(
                            MemoryCase(batch=args.memory_batch), args.chunk, Path(tmp)
                        )
                    },
                    indent=2,
                )
            )
    if args.overhead:
        from benchmarks.train_overhead import compare_overhead

        print(
            json.dumps(
                {
                    "overhead": compare_overhead(
                        args.steps, args.batch, args.workers, args.cpus_per_worker
                    )
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
