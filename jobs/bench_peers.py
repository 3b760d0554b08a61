"""The project against the tools people would otherwise use, side by side; one JSON line per
comparison.

    python -m jobs.bench_peers --train --encode --retrieval --init [--docs 1000000] [--measured PATH]
Smoke (2 CPUs, ~5 min):  python -m jobs.bench_peers --encode --retrieval --docs 20000 --rounds 1
1M documents (2 CPUs, ~20 min):  python -m jobs.bench_peers --retrieval --skip seismic_approx

Each line holds both sides' figures and the ratios (throughput project ÷ peer; peak memory project ÷
peer). The project's throughputs, at the paper's shapes, go to ``--measured``, a figures file the
reproduction plan reads when given it (``sembridge reproduce --dry-run --figures FILE``; see
``benchmarks.measured`` for the CPU → GPU scaling it writes down). Seismic and PISA (pyterrier-pisa)
come with the ``bench`` extra."""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks import peers
from benchmarks.measured import MEASURED_JSON, measured_record, write_measured
from benchmarks.retrieval_peers import SIDES, check_skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag in ("--train", "--encode", "--retrieval", "--init"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternations of project and peer per comparison"
    )
    parser.add_argument(
        "--docs", type=int, default=1_000_000, help="documents per retrieval corpus"
    )
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument(
        "--skip",
        default="",
        help=f"retrieval sides to leave out, comma-separated (of: {', '.join(SIDES[1:])})",
    )
    parser.add_argument(
        "--measured", default=str(MEASURED_JSON), help="write the cost model's figures here"
    )
    args = parser.parse_args(argv)
    skip = frozenset(s for s in args.skip.split(",") if s)
    try:
        check_skip(skip)
    except ValueError as err:
        parser.error(f"--skip: {err}")
    lines = []
    runs = peers.run_all(
        args.train,
        args.encode,
        args.retrieval,
        args.init,
        args.rounds,
        args.docs,
        args.queries,
        skip,
    )
    for line in runs:
        print(json.dumps(line), flush=True)
        lines.append(line)
    rates = peers.paper_rates(lines)
    if rates:
        write_measured(args.measured, measured_record("cpu", "jobs.bench_peers (2 CPUs)", rates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
