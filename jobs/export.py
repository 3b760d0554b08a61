"""Write a fine-tuning checkpoint as a SparseEncoder directory (any step: evaluate it, serve it).

    python -m jobs.export --checkpoint <output>/checkpoints/finetune-<run>/step_00000400 --output /tmp/step400
The contract is ``sembridge_ray.recipes.export.config``; installed, the same command is ``sembridge export``.
"""

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run("export", argv)


if __name__ == "__main__":
    sys.exit(main())
