"""MaLSTM (Mueller & Thyagarajan, AAAI 2016) on SICK: STS pretraining, optional thesaurus augmentation, restarts as
parallel Ray tasks, statsmodels calibration. ``--preset NAME`` is ``--config NAME``; the default preset is ``paper``.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.malstm --output /abs/out
Smoke (2 CPUs, ~2 min):  python -m jobs.malstm --preset smoke --output /tmp/malstm_smoke
"""

from __future__ import annotations

import json
import sys

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.presets import PRESET_DIR
from sembridge_ray.siamese.config import MalstmConfig

FLAGS = [
    Flag("--output", "output", help="output directory"),
    Flag("--vectors", "vectors.source", help="minilm (offline default) or word2vec:PATH"),
    Flag("--seeds", "seeds", help="restarts, trained as parallel Ray tasks"),
    Flag("--no-augment", "augment.enabled", const="false"),
    Flag("--no-pretrain", "pretrain.enabled", const="false"),
    Flag("--no-calibrate", "calibration.enabled", const="false"),
    Flag("--sick", "sick", help="SICK 2014 directory (default: bundled)"),
    Flag("--sts", "sts", help="STS directory with one folder per year (default: bundled)"),
    Flag("--sts-years", "pretrain.years", help="STS years to pretrain on, e.g. 2012,2013,2014,2015,2016"),
    Flag("--overwrite", "overwrite", const="true", help="replace an output written with other settings"),
]


def preset_alias(argv: list[str]) -> list[str]:
    """The issue spells the preset flag ``--preset``; it is the shared ``--config``."""
    return ["--config" if a == "--preset" else "--config=" + a[9:] if a.startswith("--preset=") else a for a in argv]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = preset_alias(sys.argv[1:] if argv is None else argv)
        cfg = parse_config(MalstmConfig, args, flags=FLAGS, preset_dir=PRESET_DIR, prefix="malstm_",
                           default_preset="paper", description=__doc__)
        from sembridge_ray.distributed.malstm import run_malstm

        report = run_malstm(cfg)
        print(json.dumps({"output": cfg.output, "best_seed": report["best_seed"], "test": report["test"]}))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
