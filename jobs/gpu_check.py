"""The prepared GPU check: init, zero-shot evaluation, fine-tuning (fp32 and bf16, 1 then 2 workers)
and evaluation on the bundled MiniLM SPLADE and SICK, each printed as one JSON line with its
comparison against the CPU; the measured throughputs go to a figures file (``--figures``, default
``OUTPUT/figures.json``) that the reproduction plan's estimate reads when given it: ``sembridge
reproduce --dry-run --figures FILE``.

    bash cluster/local.sh gpu-check [--skip-install]            # exits 0 with one line where there is no GPU
    python -m jobs.gpu_check --device cpu --pairs 300 --steps 4 --batch-size 8    # the stages on the CPU (slow)
    python -m sembridge_ray.testing --out /tmp/fx && python -m jobs.gpu_check --device cpu --pairs 300 \
        --steps 4 --batch-size 8 --model /tmp/fx/bert-mlm --target-tokenizer /tmp/fx/tok-bytebpe \
        --bridge-model /tmp/fx/bridge                                      # the same on tiny test fixtures
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    # the CPU reference's child process
    parser.add_argument("--reference-for", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--output", type=Path, default=Path("outputs/gpu_check"), help="root of the stage outputs"
    )
    parser.add_argument("--pairs", type=int, default=0, help="SICK pairs per split (0: all)")
    parser.add_argument("--steps", type=int, default=20, help="fine-tuning steps per run")
    parser.add_argument("--batch-size", type=int, default=32, help="global fine-tuning batch")
    parser.add_argument(
        "--figures", type=Path, help="where to write the measured figures (OUTPUT/figures.json)"
    )
    for flag, dest in (
        ("--model", "source_model"),
        ("--target-tokenizer", None),
        ("--bridge-model", None),
    ):
        # dry runs: e.g. tiny test fixtures
        parser.add_argument(flag, dest=dest, default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # before torch or Ray look: the whole process, and its Ray cluster, see no GPU
    if args.device == "cpu":
        os.environ.update(CUDA_VISIBLE_DEVICES="", TORCH_DEVICE="cpu")
    from benchmarks.distributed_gpu_check import CheckConfig, report_gpu_check
    from sembridge_ray.cli import run_job

    keys = (
        "device",
        "steps",
        "batch_size",
        "reference_for",
        "source_model",
        "target_tokenizer",
        "bridge_model",
    )
    cfg = CheckConfig(
        output=args.output.resolve(),
        pairs=args.pairs or None,
        **{k: getattr(args, k) for k in keys},
    )
    return run_job(lambda: report_gpu_check(cfg, args.figures))


if __name__ == "__main__":
    sys.exit(main())
