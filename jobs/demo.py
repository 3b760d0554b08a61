"""The offline miniature of the SemBridge experiment: ``jobs.reproduce --preset demo`` (see its
help).

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . \
        -- python -m jobs.demo --output "$PWD/outputs/demo"
Or simply:  bash cluster/local.sh demo     (output in $DEMO_OUTPUT, default outputs/demo)
"""

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run(
        "reproduce",
        ["--preset", "demo", *(sys.argv[1:] if argv is None else argv)],
        prog="python -m jobs.demo",
    )


if __name__ == "__main__":
    sys.exit(main())
