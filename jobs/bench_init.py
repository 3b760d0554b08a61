"""Benchmark bridge_weights against the released reference loop and the bare fp32 GEMM; prints one
JSON line.

    python -m jobs.bench_init                                  # synthetic clustered vectors, 30,522 x 384
    python -m jobs.bench_init --vectors /tmp/minilm-vecs \
        --write-real DIR/bert-base-uncased DIR/kobigbird-bert-base   # two tokenizer folders (or hub ids)
    python -m jobs.bench_init --vectors /tmp/minilm-vecs       # reuse the real MiniLM vectors written above
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import bridge_weights as bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--vectors", help="folder with new.npy and source.npy (real bridge vectors)"
    )
    parser.add_argument(
        "--write-real",
        nargs=2,
        metavar=("SOURCE_TOK", "TARGET_TOK"),
        help="first write --vectors from these tokenizers with the bundled MiniLM bridge",
    )
    parser.add_argument("--alpha", type=float, default=4.0)
    parser.add_argument(
        "--new", type=int, default=4000, help="new tokens timed for our path and the GEMM"
    )
    parser.add_argument("--source", type=int, default=30522, help="synthetic source tokens")
    parser.add_argument("--dim", type=int, default=384, help="synthetic dimension")
    parser.add_argument(
        "--ref-rows", type=int, default=300, help="rows timed for the (slow) reference loop"
    )
    parser.add_argument(
        "--memory-rows", type=int, default=20000, help="rows for the RSS-growth measurement"
    )
    bench.main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
