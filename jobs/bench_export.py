"""Benchmark the export targets against the exact search (encoding and search throughput, peak
memory, parity).

    python -m jobs.bench_export --docs 2000 --queries 200
The script is ``benchmarks/export_targets.py``.
"""

from __future__ import annotations

import sys

from benchmarks.export_targets import main

if __name__ == "__main__":
    sys.exit(main())
