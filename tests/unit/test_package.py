"""Package-level contracts: importing it never imports Ray, and the tree is lint-clean."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sembridge_ray.recipes import JOBS
from tests.conftest import REPO


def test_import_does_not_import_ray() -> None:
    code = (
        "import sys, sembridge_ray, sembridge_ray.testing, sembridge_ray.runtime.config, sembridge_ray.cli; "
        "sys.exit(int(any(m == 'ray' or m.startswith('ray.') for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_a_jobs_contract_imports_neither_ray_nor_torch() -> None:
    """``sembridge <job> --help`` imports the job's config: it stays light (the steps a config reads
    settings from, such as the encoding's, keep those settings in a module of their own)."""
    configs = ", ".join(f"sembridge_ray.recipes.{job}.config" for job in JOBS)
    heavy = ("ray", "torch", "transformers", "sentence_transformers")
    code = (
        f"import sys, {configs}; "
        f"sys.exit(int(any(m.split('.')[0] in {heavy!r} for m in sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(REPO / ".venv" / "bin" / "ruff")
    if not shutil.which(ruff):
        pytest.skip("ruff is not installed")
    result = subprocess.run(
        [ruff, "check", "--quiet", "."], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-3000:]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_product_code_depends_on_the_test_fixtures() -> None:
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "sembridge_ray").rglob("*.py")
        if p.name != "testing.py" and "sembridge_ray.testing" in _imports(p)
    ]
    assert offenders == []


def test_the_distribution_installs_only_sembridge_ray_and_its_presets() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["sembridge_ray*"]
    assert "presets/*.yaml" in project["tool"]["setuptools"]["package-data"]["sembridge_ray"]
    assert project["project"]["scripts"]["sembridge"] == "sembridge_ray.cli:main"
    assert {
        p.stem.split("_", 1)[0] for p in (REPO / "sembridge_ray" / "presets").glob("*.yaml")
    } <= set(JOBS)
