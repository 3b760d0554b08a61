"""``--overwrite`` killed for real (``os._exit``, as SIGKILL: no cleanup runs) at three points of an
init run, injected at the write layer: the old output stays byte-identical and verifying, and the
same command then completes with the model an undisturbed run of the new settings writes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.runtime.outputs import LOCK, is_complete, staging_dir
from tests.conftest import REPO
from tests.unit.test_outputs import snapshot, unlocked

# Runs initialise(cfg) in a child that dies (exit 137, no cleanup) at one point.
CHILD = """
import json, os, sys
from sembridge_ray.runtime import outputs
from sembridge_ray.embed_init import transfer
from sembridge_ray.recipes.init import run as init_job
from sembridge_ray.recipes.init.config import InitConfig

cfg, point = InitConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2]
real_atomic_path = outputs.atomic_path

def die(*args, **kwargs):
    os._exit(137)

class DieAfterModel:
    def __init__(self, path):
        self.inner = real_atomic_path(path)
        self.model = path.name == "model"
    def __enter__(self):
        return self.inner.__enter__()
    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        if self.model:
            die()

if point == "compute":
    transfer.composed_model = die  # the rows are computed, nothing of the model composed or written
elif point == "model_written":
    init_job.atomic_path = DieAfterModel
elif point == "before_swap":
    outputs.swap_into_place = die
init_job.initialise(cfg)
"""


@pytest.fixture(scope="module")
def finished(
    fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[InitConfig, Path, Path]:
    """(the old settings, their finished output, an undisturbed run of the new settings), built
    once."""
    root = tmp_path_factory.mktemp("overwrite")
    old = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-wordpiece"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(root / "old"),
        cache_dir=str(root / "cache"),
        samples=3,
    )
    reference = initialise(old.with_settings(alpha=2.0, output=str(root / "reference")))
    return old, Path(initialise(old).output), Path(reference.output)


def artefacts(out: Path) -> dict[str, bytes]:
    """What a run computed: the model and the provenance (the report also holds timings)."""
    return {
        k: v
        for k, v in snapshot(out).items()
        if k.startswith("model/") or k == "provenance.parquet"
    }


@pytest.mark.parametrize("point", ["compute", "model_written", "before_swap"])
def test_a_killed_overwrite_leaves_the_old_output_whole_and_the_same_command_completes(
    finished: tuple[InitConfig, Path, Path], tmp_path: Path, point: str
) -> None:
    template, old_output, reference = finished
    out = tmp_path / "init"
    # a copied output is the same run (paths are not part of the identity)
    shutil.copytree(old_output, out)
    old = replace(template, output=str(out))
    new = old.with_settings(alpha=2.0, overwrite=True)
    before = snapshot(out)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(new.to_dict()), point],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert child.returncode == 137, child.stderr[-2000:]
    # the dead run's lock is left, breakable
    assert unlocked(snapshot(out)) == before and is_complete(out)
    assert staging_dir(out).is_dir()  # what the killed run had done is kept for the rerun
    # a plain rerun of the old settings still skips on the old output
    assert initialise(old).skipped
    redone = initialise(new)
    # a complete staged run is swapped in, not recomputed
    assert redone.skipped == (point == "before_swap")
    assert is_complete(out) and not staging_dir(out).exists() and not (out / LOCK).exists()
    assert artefacts(out) == artefacts(reference)
    assert json.loads((out / "init_report.json").read_text())["alpha"] == 2.0
