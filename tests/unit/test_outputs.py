"""The output contract: atomic artefacts, manifests, run identities, reruns, locks and permissions
(no Ray)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sembridge_ray.runtime import outputs
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import FORMAT_VERSION, RunIdentity, file_digest, path_identity
from sembridge_ray.runtime.locks import LOCK, STALE_AFTER_S, OutputLock, OutputLocked, pid_namespace
from sembridge_ray.runtime.outputs import (
    IDENTITY,
    SUCCESS,
    SettingsChanged,
    atomic_path,
    atomic_write_text,
    claim_output,
    is_complete,
    is_done,
    output_fingerprint,
    previous_dir,
    sha256_file,
    staging_dir,
    write_success,
)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes: 'byte-identical' made checkable."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def unlocked(files: dict[str, bytes]) -> dict[str, bytes]:
    """A snapshot without the lock file, which a live run holds."""
    return {k: v for k, v in files.items() if k != LOCK}


def ident(**settings: object) -> RunIdentity:
    return RunIdentity(
        job="test",
        settings={"alpha": 4.0, "method": "sembridge", **settings},
        inputs={"model": "sha256:abc"},
    )


def finished(out: Path, identity: RunIdentity, text: str = "result") -> Path:
    with claim_output(out, identity) as claim:
        assert not claim.done
        atomic_write_text(out / "result.txt", text)
        claim.finish()
    return out


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


def test_a_manifest_that_lists_no_files_vouches_for_nothing(tmp_path: Path) -> None:
    """A ``_SUCCESS`` whose file list is empty (hand-edited, or written by a tool that lost the
    list) is not a finished output: the rerun redoes the work instead of skipping with the artefacts
    gone."""
    out = finished(tmp_path / "out", ident())
    manifest = json.loads((out / SUCCESS).read_text())
    (out / SUCCESS).write_text(json.dumps({**manifest, "files": {}}))
    (out / "result.txt").unlink()
    assert not is_complete(out) and not output_fingerprint(out)
    with claim_output(out, ident()) as claim:
        assert not claim.done and claim.resumed
    with pytest.raises(RuntimeError, match="no artefact"):
        write_success(tmp_path / "empty")


def test_same_identity_skips_and_a_moved_or_copied_output_still_skips(tmp_path: Path) -> None:
    out = finished(tmp_path / "out", ident())
    manifest = json.loads((out / SUCCESS).read_text())
    assert manifest["fingerprint"] == ident().fingerprint and IDENTITY in manifest["files"]
    before = snapshot(out)
    with claim_output(out, ident()) as claim:
        assert claim.done
    assert snapshot(out) == before
    shutil.copytree(out, tmp_path / "copy")
    (out).rename(tmp_path / "moved")
    for place in ("copy", "moved"):
        with claim_output(tmp_path / place, ident()) as claim:
            assert claim.done


def test_other_settings_are_refused_naming_the_keys_and_leaving_the_output_untouched(
    tmp_path: Path,
) -> None:
    out = finished(tmp_path / "out", ident())
    before = snapshot(out)
    new = RunIdentity(
        job="test", settings={"alpha": 2.0, "method": "focus"}, inputs={"model": "sha256:abc"}
    )
    with pytest.raises(SettingsChanged) as err, claim_output(out, new):
        pytest.fail("must not run")
    message = str(err.value)
    assert (
        "alpha: 4.0 → 2.0" in message
        and "method: sembridge → focus" in message
        and "--overwrite" in message
    )
    assert "\n" not in message
    assert snapshot(out) == before and is_complete(out)


@pytest.mark.parametrize("old_version", [None, FORMAT_VERSION - 1, FORMAT_VERSION + 1])
def test_an_identity_of_another_format_version_is_refused_in_one_line_and_overwrite_replaces_it(
    tmp_path: Path, old_version: int | None
) -> None:
    """Identities of two formats are never compared key by key, even where the settings agree."""
    old = RunIdentity(job="test", settings=ident().settings, inputs=ident().inputs)
    out = finished(tmp_path / "out", replace(old, format_version=old_version))
    recorded = json.loads((out / IDENTITY).read_text())
    assert recorded.get("format_version") == old_version
    before = snapshot(out)
    with pytest.raises(SettingsChanged) as err, claim_output(out, ident()):
        pytest.fail("must not run")
    was = "no format version" if old_version is None else f"format version {old_version}"
    assert isinstance(err.value, InputError) and str(err.value) == (
        f"output {out} holds a finished run that this version cannot compare (its identity.json has "
        f"{was}, this version records format version {FORMAT_VERSION}); rerun with --overwrite to "
        "replace it, or choose another output"
    )
    assert snapshot(out) == before and is_complete(out)
    with claim_output(out, ident(), overwrite=True) as claim:
        assert claim.staged and not claim.done
        atomic_write_text(claim.path / "result.txt", "new")
        claim.finish()
    assert json.loads((out / IDENTITY).read_text())["format_version"] == FORMAT_VERSION
    with claim_output(out, ident()) as claim:
        assert claim.done


def test_overwrite_builds_beside_the_old_output_and_swaps_only_once_complete(
    tmp_path: Path,
) -> None:
    out = finished(tmp_path / "out", ident())
    (out / "stale-from-old-run.bin").write_bytes(b"x")
    before = snapshot(out)
    new = ident(alpha=2.0)
    with claim_output(out, new, overwrite=True) as claim:
        assert not claim.done and not claim.resumed and claim.staged
        assert claim.path == staging_dir(out) and claim.output == out
        assert sorted(p.name for p in claim.path.iterdir()) == [LOCK, IDENTITY]
        atomic_write_text(claim.path / "result.txt", "new")
        # the old output stays whole meanwhile
        assert unlocked(snapshot(out)) == before and is_complete(out)
        claim.finish()
    assert (out / "result.txt").read_text() == "new" and is_complete(out)
    assert not (out / "stale-from-old-run.bin").exists() and not (out / LOCK).exists()
    assert json.loads((out / IDENTITY).read_text())["fingerprint"] == new.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or previous copy left


def test_a_crashed_overwrite_keeps_the_old_output_and_the_same_command_resumes_the_staged_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = finished(tmp_path / "out", ident())
    before = snapshot(out)
    new = ident(alpha=2.0)
    with pytest.raises(RuntimeError), claim_output(out, new, overwrite=True) as claim:
        atomic_write_text(claim.path / "checkpoint.txt", "step 4")
        raise RuntimeError("killed")
    assert snapshot(out) == before and is_complete(out)
    # the old command still skips, and says what is staged
    with claim_output(out, ident()) as claim:
        assert claim.done
    assert any(
        str(staging_dir(out)) in r.getMessage() and "--overwrite" in r.getMessage()
        for r in caplog.records
    )
    with pytest.raises(SettingsChanged, match="staged in"), claim_output(out, new):
        pass
    with claim_output(out, new, overwrite=True) as claim:
        assert claim.resumed and (claim.path / "checkpoint.txt").read_text() == "step 4"
        claim.finish()
    assert (out / "checkpoint.txt").read_text() == "step 4" and is_done(out, new)


def test_a_staged_run_of_other_settings_is_cleared_not_accumulated(tmp_path: Path) -> None:
    out = finished(tmp_path / "out", ident())
    with pytest.raises(RuntimeError), claim_output(out, ident(alpha=2.0), overwrite=True) as claim:
        atomic_write_text(claim.path / "partial.txt", "abandoned")
        raise RuntimeError("killed")
    with claim_output(out, ident(alpha=3.0), overwrite=True) as claim:
        assert not claim.resumed and not (claim.path / "partial.txt").exists()
        claim.finish()
    assert is_done(out, ident(alpha=3.0)) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_crash_between_the_two_renames_of_the_swap_is_completed_by_the_next_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = finished(tmp_path / "out", ident())
    new = ident(alpha=2.0)
    renames: list[tuple[Path, Path]] = []

    def rename_once(src: Path, dst: Path) -> None:
        if renames:
            raise KeyboardInterrupt("killed between the renames")
        renames.append((Path(src), Path(dst)))
        os.replace(src, dst)

    monkeypatch.setattr(outputs.os, "rename", rename_once)
    with pytest.raises(KeyboardInterrupt), claim_output(out, new, overwrite=True) as claim:
        atomic_write_text(claim.path / "result.txt", "new")
        claim.finish()
    monkeypatch.undo()
    assert not out.exists() and is_complete(previous_dir(out)) and is_done(staging_dir(out), new)
    assert renames == [(out, previous_dir(out))]
    # the same command: the swap is finished, nothing redone
    with claim_output(out, new, overwrite=True) as claim:
        assert claim.done
    assert (out / "result.txt").read_text() == "new" and sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["out"]


def test_a_crash_after_the_staged_manifest_swaps_without_recomputing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = finished(tmp_path / "out", ident())
    before = snapshot(out)
    new = ident(alpha=2.0)

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("killed just before the swap")

    monkeypatch.setattr(outputs, "swap_into_place", killed)
    with pytest.raises(KeyboardInterrupt), claim_output(out, new, overwrite=True) as claim:
        atomic_write_text(claim.path / "result.txt", "new")
        claim.finish()
    monkeypatch.undo()
    assert snapshot(out) == before and is_done(staging_dir(out), new)
    with claim_output(out, new, overwrite=True) as claim:
        assert claim.done
    assert is_done(out, new) and (out / "result.txt").read_text() == "new"


def test_a_live_overwrite_is_never_seen_unlocked(tmp_path: Path) -> None:
    out = finished(tmp_path / "out", ident())
    with claim_output(out, ident(alpha=2.0), overwrite=True) as claim:
        atomic_write_text(claim.path / "result.txt", "new")
        for other in (ident(), ident(alpha=3.0)):
            with pytest.raises(OutputLocked), claim_output(out, other, overwrite=True):
                pass
        claim.finish()


def test_an_unfinished_run_with_the_same_identity_resumes_and_keeps_its_work(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), claim_output(out, ident()):
        atomic_write_text(out / "checkpoint.txt", "step 4")
        raise RuntimeError("worker died")
    assert (
        not (out / SUCCESS).exists()
        and (out / "checkpoint.txt").is_file()
        and not (out / LOCK).exists()
    )
    with claim_output(out, ident()) as claim:
        assert claim.resumed and not claim.done
        assert (out / "checkpoint.txt").read_text() == "step 4"
    with (
        pytest.raises(SettingsChanged, match="unfinished run with other settings"),
        claim_output(out, ident(alpha=3.0)),
    ):
        pass


def test_a_failure_before_any_artefact_removes_the_directory_it_created(tmp_path: Path) -> None:
    with pytest.raises(ValueError), claim_output(tmp_path / "new", ident()):
        raise ValueError("bad data")
    assert not (tmp_path / "new").exists()


def test_foreign_directories_are_never_written_or_cleared(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with (
            pytest.raises(InputError, match="not written by sembridge_ray"),
            claim_output(tmp_path / "home", ident(), overwrite=overwrite),
        ):
            pass
    assert snapshot(tmp_path / "home") == {"thesis.tex": b"precious"}


def test_output_path_problems_name_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with (
        pytest.raises(InputError, match=r"output .*file exists and is not a directory"),
        claim_output(tmp_path / "file", ident()),
    ):
        pass
    with (
        pytest.raises(InputError, match=r"file is a file, not a directory"),
        claim_output(tmp_path / "file" / "sub", ident()),
    ):
        pass


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with claim_output(out, ident()):
        with pytest.raises(OutputLocked) as err, claim_output(out, ident()):
            pytest.fail("must not run")
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(err.value)
    assert not (out / LOCK).exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_lock(out: Path, pid: int, host: str, age_s: float = 0.0, pid_ns: str = "") -> None:
    """A lock as ``pid`` on ``host`` wrote it, its heartbeat ``age_s`` old; ``pid_ns`` "" as an
    older version's."""
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK
    lock.write_text(
        json.dumps(
            {
                "pid": pid,
                "host": host,
                "started": time.time() - age_s,
                "proc_start": "",
                "command": "python -m jobs.finetune",
                "pid_ns": pid_ns,
            }
        )
    )
    os.utime(lock, (time.time() - age_s, time.time() - age_s))


def test_a_stale_lock_is_broken_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    # this namespace: its pid is checked
    _write_lock(out, _dead_pid(), socket.gethostname(), pid_ns=pid_namespace())
    (out / IDENTITY).write_text(json.dumps(ident().to_dict()))
    with claim_output(out, ident()) as claim:
        assert claim.resumed
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    assert "breaking the stale lock" in caplog.text


def test_a_lock_from_another_host_counts_until_its_heartbeat_is_old(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write_lock(out, 12345, "another-host", age_s=60)
    with pytest.raises(OutputLocked, match="pid 12345 on host another-host"):
        OutputLock(out).acquire()
    _write_lock(out, 12345, "another-host", age_s=STALE_AFTER_S + 60)
    with OutputLock(out):
        assert json.loads((out / LOCK).read_text())["host"] == socket.gethostname()


def test_finished_artefacts_are_readable_by_others(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out = tmp_path / "out"
        with claim_output(out, ident()) as claim:
            (out / "model").mkdir(mode=0o700)
            weights = out / "model" / "model.safetensors"
            weights.write_bytes(b"weights")
            weights.chmod(0o600)  # what safetensors and tempfile leave behind
            claim.finish()
    finally:
        os.umask(old)
    assert weights.stat().st_mode & 0o777 == 0o644
    assert (out / "model").stat().st_mode & 0o777 == 0o755
    assert all(
        p.stat().st_mode & 0o044 == 0o044 for p in out.rglob("*") if p.is_file() and p.name != LOCK
    )


def test_input_identity_follows_content_and_runs_not_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("alpha")
    first = path_identity(data)
    shutil.copytree(data, tmp_path / "copy")
    assert path_identity(tmp_path / "copy") == first
    (data / "a.txt").write_text("alphb")
    assert path_identity(data) != first
    out = finished(tmp_path / "run", ident())
    assert path_identity(out) == output_fingerprint(out) == f"run:test:{ident().fingerprint}"
    with claim_output(tmp_path / "run3", ident(alpha=3.0)) as claim:
        (tmp_path / "run3" / "model").mkdir()
        (tmp_path / "run3" / "model" / "w.bin").write_bytes(b"w")
        claim.finish()
    assert (
        path_identity(tmp_path / "run3" / "model")
        == f"run:test:{ident(alpha=3.0).fingerprint}/model"
    )
    out2 = finished(tmp_path / "run2", ident(alpha=1.0))
    (out2 / "model").mkdir()
    # after the manifest: model/ is not part of the run
    (out2 / "model" / "w.bin").write_bytes(b"w")
    assert path_identity(out2 / "model").startswith("sha256:")
    # the run's artefacts changed: identified by content now
    (out / "result.txt").write_text("edited by hand")
    assert path_identity(out).startswith("sha256:")


def test_large_files_are_digested_by_size_and_their_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sembridge_ray.runtime.identity as identity

    monkeypatch.setattr(identity, "WHOLE_FILE_LIMIT", 100)
    monkeypatch.setattr(identity, "SAMPLE", 10)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(200)))
    digest = file_digest(big)
    assert digest.startswith("200:")
    big.write_bytes(bytes(range(100)) + bytes(100 - 1) + b"\x01")  # same size, new last bytes
    assert file_digest(big) != digest
    assert file_digest(big, full=True) == sha256_file(big)


def test_overwrite_through_a_symbolic_link_replaces_the_run_at_its_target(tmp_path: Path) -> None:
    """An output given as a link to a directory (``outputs/run -> /nfs/run``): ``--overwrite`` swaps
    the new run in at the target and the link keeps pointing there (it was once replaced by a local
    directory, the old run left complete at the target and logged as removed)."""
    target, link = tmp_path / "nfs" / "run", tmp_path / "run"
    target.parent.mkdir()
    finished(target, ident())
    link.symlink_to(target)
    with claim_output(link, ident(alpha=2.0), overwrite=True) as claim:
        assert claim.staged and claim.path.parent == target.parent
        atomic_write_text(claim.path / "result.txt", "new")
        claim.finish()
    assert link.is_symlink() and link.resolve() == target
    assert is_done(target, ident(alpha=2.0)) and (target / "result.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nfs", "run"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["run"]
    with claim_output(link, ident(alpha=2.0)) as claim:  # and a plain rerun through the link skips
        assert claim.done
