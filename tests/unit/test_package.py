"""Package-level contracts: importing it never imports Ray, and the tree is lint-clean."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_import_does_not_import_ray() -> None:
    code = (
        "import sys, sembridge_ray, sembridge_ray.testing, sembridge_ray.config, sembridge_ray.cli; "
        "sys.exit(int(any(m == 'ray' or m.startswith('ray.') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(REPO / ".venv" / "bin" / "ruff")
    if not shutil.which(ruff):
        pytest.skip("ruff is not installed")
    result = subprocess.run([ruff, "check", "--quiet", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
