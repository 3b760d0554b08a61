"""The offline miniature of the SemBridge experiment: ``jobs.reproduce --preset demo`` (see its docstring).

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.demo --output "$PWD/outputs/demo"
Or simply:  bash cluster/local.sh demo     (output in $DEMO_OUTPUT, default outputs/demo)
"""

from __future__ import annotations

import sys

from jobs import reproduce


def main(argv: list[str] | None = None) -> int:
    return reproduce.main(["--preset", "demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
