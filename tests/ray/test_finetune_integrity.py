"""Fine-tuning never finishes a diverged run (a whole job in its own process and cluster, as a user
runs it); the damaged-checkpoint job test is in tests/chaos/test_finetune_integrity.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sembridge_ray.runtime.outputs import is_complete
from sembridge_ray.sparse.checkpoints import REGISTRY, checkpoint_dirs, load_part, restore_point
from sembridge_ray.sparse.finite import nonfinite
from tests.conftest import REPO
from tests.ray.test_finetune_resume import _env

STEPS, EVERY = 12, 2


def _job(
    out: Path, fixtures_root: Path, sick_beir: Path, *extra: str, every: int = EVERY
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobs.finetune",
        "--config",
        "smoke",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(sick_beir),
        "--output",
        str(out),
        "--max-steps",
        str(STEPS),
        "--checkpoint-every",
        str(every),
        "--batch-size",
        "4",
        *extra,
    ]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)


def test_a_diverging_run_ends_with_one_line_exit_2_and_keeps_the_finite_checkpoints(
    fixtures_root: Path, sick_beir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "diverged" / "ft"
    # AdamW's decoupled decay multiplies the weights by 1 - lr · weight_decay = 1 - 1e11 at each
    # step: finite after step 1, overflowing in step 2's forward pass (lr itself is refused above 1)
    cmd = _job(out, fixtures_root, sick_beir, "optim.weight_decay=1e15", every=1)
    proc = _run(cmd)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1, proc.stderr[-3000:]
    diverged = re.fullmatch(r"error: training diverged at step (\d+): .*optim\.lr.*", errors[0])
    assert diverged is not None, errors[0]
    step = int(diverged.group(1))
    # not retried: it would diverge the same way
    assert "training failed (attempt" not in proc.stderr
    assert not is_complete(out) and not (out / "model").exists()
    registries = list(out.parent.glob(f"**/finetune-*/{REGISTRY}"))
    assert len(registries) == 1, proc.stderr[-3000:]  # step 1 was checkpointed
    run_dir = registries[0].parent
    kept = restore_point(run_dir)
    # the newest checkpoint is the last finite step's
    assert kept is not None and kept[0] == step - 1
    assert [s for s, _ in checkpoint_dirs(run_dir) if s >= step] == []
    model_state, _, _ = load_part(kept[1], 0)
    assert nonfinite(model_state["model"]) == []
