from __future__ import annotations

import json
from pathlib import Path

import pytest

from sembridge_ray.outputs import (
    SUCCESS,
    atomic_path,
    atomic_write_text,
    is_complete,
    sha256_file,
    start_output,
    write_success,
)


def test_failed_write_leaves_neither_target_nor_temp(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "a.txt") as tmp:
        tmp.write_text("partial")
        raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_directory_is_replaced_atomically(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "old").write_text("x")
    with atomic_path(tmp_path / "model") as tmp:
        tmp.mkdir()
        (tmp / "new").write_text("y")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["new"]


def test_manifest_verifies_and_detects_changes(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a.txt", "hello")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "big").write_text("ignored")
    assert not is_complete(tmp_path)
    manifest = write_success(tmp_path, exclude=("ckpt",))
    assert manifest["files"] == {"a.txt": sha256_file(tmp_path / "a.txt")}
    assert json.loads((tmp_path / SUCCESS).read_text())["files"] == manifest["files"]
    assert is_complete(tmp_path)
    (tmp_path / "a.txt").write_text("tampered")
    assert not is_complete(tmp_path)


def test_start_output_drops_a_stale_success(tmp_path: Path) -> None:
    write_success(tmp_path)
    start_output(tmp_path)
    assert not (tmp_path / SUCCESS).exists()
