"""The restore rule of fine-tuning checkpoints: the newest that verifies, damaged ones set aside
once, Ray Train's registry kept consistent with what is left (hand-built checkpoint directories and
registries, no Ray)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from sembridge_ray.sparse.checkpoints import (
    REGISTRY,
    checkpoint_name,
    checkpoint_problem,
    restore_point,
    set_aside_damaged,
    without_checkpoints,
    write_part,
)


def _checkpoint(run: Path, step: int, world: int = 2) -> Path:
    """A checkpoint as the workers write it: every rank's part, rank 0 with the state and the
    metrics."""
    directory = run / checkpoint_name(step)
    directory.mkdir(parents=True)
    for rank in range(world):
        state = {"step": step, "model": {"w": torch.full((3,), float(step))}} if rank == 0 else None
        metrics = (
            "".join(json.dumps({"step": s}) + "\n" for s in range(1, step + 1))
            if rank == 0
            else None
        )
        write_part(
            directory, rank, world, {"cpu": torch.zeros(4, dtype=torch.uint8)}, state, metrics
        )
    return directory


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _entry(step: int) -> dict:
    return {"version": 0, "checkpoint_dir_name": checkpoint_name(step), "metrics": {"step": step}}


def _registry(run: Path, steps: list[int]) -> dict:
    """A registry in Ray Train 2.60's layout (as a finished run of this project writes it)."""
    snapshot = {
        "ray_version": "2.60.0",
        "checkpoint_results": [_entry(s) for s in steps],
        "checkpoint_report_indices": [i + 1 for i in range(len(steps))],
        "latest_checkpoint_result": _entry(steps[-1]) if steps else None,
        "pending_training_results": [],
        "pending_validation_specs": [],
        "current_report_index": len(steps) + 1,
        "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": [],
    }
    (run / REGISTRY).write_text(json.dumps(snapshot))
    return snapshot


def test_a_checkpoint_verifies_until_a_file_is_truncated_or_a_rank_manifest_is_lost(
    tmp_path: Path,
) -> None:
    directory = _checkpoint(tmp_path, 4)
    assert checkpoint_problem(directory) is None
    _truncate(directory / "state.pt")
    assert checkpoint_problem(directory) == "state.pt does not match its checksum"
    other = _checkpoint(tmp_path, 6)
    (other / "complete-rank1.json").unlink()
    assert checkpoint_problem(other) == "complete-rank1.json is missing"
    assert checkpoint_problem(tmp_path / checkpoint_name(8)) == "the directory is missing"


def test_the_restore_point_is_the_newest_checkpoint_that_verifies(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    (tmp_path / checkpoint_name(8)).mkdir()  # a write the failure interrupted: no manifest yet
    assert restore_point(tmp_path) == (6, tmp_path / checkpoint_name(6))
    _truncate(tmp_path / checkpoint_name(6) / "state.pt")
    assert restore_point(tmp_path) == (4, tmp_path / checkpoint_name(4))
    assert restore_point(tmp_path / "absent") is None
    # object storage is not verified: Ray's registry decides
    assert restore_point("s3://bucket/run") is None


def test_a_damaged_registered_checkpoint_is_set_aside_once_and_dropped_from_the_registry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (4, 6):
        _checkpoint(tmp_path, step)
    # unregistered and unfinished: Ray writes over it at step 8
    (tmp_path / checkpoint_name(8)).mkdir()
    before = _registry(tmp_path, [4, 6])
    _truncate(tmp_path / checkpoint_name(6) / "state.pt")
    damaged_bytes = (tmp_path / checkpoint_name(6) / "state.pt").read_bytes()

    with caplog.at_level(logging.WARNING, logger="sembridge_ray.sparse.checkpoints"):
        moved = set_aside_damaged(str(tmp_path))
    assert len(moved) == 1 and moved[0].name.startswith("step_00000006.damaged-")
    # kept for a person to look at, not deleted
    assert (moved[0] / "state.pt").read_bytes() == damaged_bytes
    assert not (tmp_path / checkpoint_name(6)).exists() and (tmp_path / checkpoint_name(8)).is_dir()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step_00000006" in warnings[0]
    assert "state.pt does not match its checksum" in warnings[0]

    after = json.loads((tmp_path / REGISTRY).read_text())
    assert after["checkpoint_results"] == before["checkpoint_results"][:1]
    assert after["checkpoint_report_indices"] == [1]
    assert after["latest_checkpoint_result"] == before["checkpoint_results"][0]
    assert {k: v for k, v in after.items() if "checkpoint" not in k} == {
        k: v for k, v in before.items() if "checkpoint" not in k
    }  # Ray's version, report index and validation state untouched
    assert restore_point(tmp_path) == (4, tmp_path / checkpoint_name(4))

    # nothing left to set aside: a second pass changes nothing
    assert set_aside_damaged(str(tmp_path)) == []
    assert json.loads((tmp_path / REGISTRY).read_text()) == after


def test_a_registered_checkpoint_that_is_gone_is_dropped_from_the_registry(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 4)
    _registry(tmp_path, [4, 6])  # step 6 registered, its directory deleted by hand
    assert set_aside_damaged(tmp_path) == []
    after = json.loads((tmp_path / REGISTRY).read_text())
    assert [e["checkpoint_dir_name"] for e in after["checkpoint_results"]] == ["step_00000004"]
    assert after["latest_checkpoint_result"]["checkpoint_dir_name"] == "step_00000004"


def test_when_every_registered_checkpoint_is_damaged_the_registry_is_empty(tmp_path: Path) -> None:
    _truncate(_checkpoint(tmp_path, 2) / "metrics.jsonl")
    _registry(tmp_path, [2])
    assert [p.name[:13] for p in set_aside_damaged(tmp_path)] == ["step_00000002"]
    after = json.loads((tmp_path / REGISTRY).read_text())
    assert after["checkpoint_results"] == [] and after["latest_checkpoint_result"] is None
    assert restore_point(tmp_path) is None  # the run starts from step 0


def test_an_unreadable_registry_is_set_aside_and_checkpoints_are_kept(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 4)
    # cut short mid-write
    (tmp_path / REGISTRY).write_text('{"ray_version": "2.60.0", "checkpoint_res')
    moved = set_aside_damaged(tmp_path)
    assert [p.name.split(".damaged-")[0] for p in moved] == [REGISTRY]
    assert not (tmp_path / REGISTRY).exists() and restore_point(tmp_path) == (
        4,
        tmp_path / checkpoint_name(4),
    )


def test_object_storage_and_runs_without_a_registry_are_left_alone(tmp_path: Path) -> None:
    _truncate(_checkpoint(tmp_path, 2) / "state.pt")
    assert set_aside_damaged(tmp_path) == []  # not registered: an interrupted write, never restored
    assert (tmp_path / checkpoint_name(2)).is_dir()
    assert set_aside_damaged("s3://bucket/run") == []


def test_the_registry_loses_pending_and_validated_entries_of_dropped_checkpoints() -> None:
    snapshot = {
        "checkpoint_results": [_entry(2), _entry(4), _entry(6)],
        "checkpoint_report_indices": [1, 3, 5],
        "latest_checkpoint_result": _entry(6),
        "pending_training_results": [_entry(4), _entry(6)],
        "pending_validation_specs": [True, False],
        "validated_checkpoint_dir_names": ["step_00000002", "step_00000006"],
        "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": ["step_00000006"],
        "current_report_index": 6,
    }
    out = without_checkpoints(snapshot, {"step_00000006"})
    assert out["checkpoint_results"] == [_entry(2), _entry(4)] and out[
        "checkpoint_report_indices"
    ] == [1, 3]
    assert out["latest_checkpoint_result"] == _entry(4)  # the most recently reported of those left
    assert out["pending_training_results"] == [_entry(4)] and out["pending_validation_specs"] == [
        True
    ]
    assert out["validated_checkpoint_dir_names"] == ["step_00000002"]
    assert out["failed_validation_checkpoint_dir_names"] == [] and out["current_report_index"] == 6
    # the input is not modified
    assert snapshot["checkpoint_results"] == [_entry(2), _entry(4), _entry(6)]


def test_a_registry_of_another_layout_is_set_aside_not_half_edited(tmp_path: Path) -> None:
    _truncate(_checkpoint(tmp_path, 4) / "state.pt")
    snapshot = _registry(tmp_path, [4])
    del snapshot["checkpoint_report_indices"]  # not the layout of Ray 2.60
    (tmp_path / REGISTRY).write_text(json.dumps(snapshot))
    moved = set_aside_damaged(tmp_path)
    assert [p.name.split(".damaged-")[0] for p in moved] == [REGISTRY]
    assert json.loads(moved[0].read_text()) == snapshot and (tmp_path / checkpoint_name(4)).is_dir()
