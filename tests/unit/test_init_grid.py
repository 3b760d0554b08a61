"""``init --grid`` is gone (one grid driver: ``jobs.reproduce``); the flag says where the grid went,
in one line. The paper grid's plan is ``reproduce --preset paper --dry-run``
(tests/unit/test_reproduce_plan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs import init_embeddings
from tests.conftest import error_lines


@pytest.mark.parametrize("grid", ["paper", "huge"])
def test_the_grid_flag_points_at_the_reproduction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: str
) -> None:
    assert init_embeddings.main(["--grid", grid, "--output", str(tmp_path)]) == 2
    err = error_lines(capsys)
    assert (
        len(err) == 1
        and "init --grid is gone" in err[0]
        and "sembridge reproduce --preset paper" in err[0]
    )
