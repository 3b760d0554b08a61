"""The exit codes every job shares (sembridge_ray/cli.py's docstring, docs/operations.md "Exit
codes"): 0 done, 1 a bug, 2 bad input or environment, 3 a grid with failed cells (listed), 130
interrupted, 143 terminated."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sembridge_ray import cli
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.reproduce import config as reproduce
from sembridge_ray.recipes.reproduce.config import ReproduceConfig, ReproduceResult
from sembridge_ray.runtime.errors import terminating
from sembridge_ray.runtime.executor import Executor
from sembridge_ray.runtime.locks import LOCK, OutputLock
from tests.conftest import error_lines


@pytest.fixture
def sigterm_handler() -> Iterator[None]:
    """The test process's SIGTERM handler, put back after a test that was sent SIGTERM, and the
    process no longer marked as terminating (which would end pytest at exit with 143, as it ends a
    terminated job)."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)
    terminating.clear()


FAILURES: dict[str, str] = {}


def fake_grid(cfg: ReproduceConfig, *, executor: Executor) -> ReproduceResult:
    """A grid driver whose cells end with :data:`FAILURES` (the CLI's mapping is under test); the
    command line hands it the Ray executor, as every driver."""
    assert isinstance(executor, RayExecutor)
    Path(cfg.output, "results.md").write_text("# Results (nDCG@10)\n", encoding="utf-8")
    return ReproduceResult(output=cfg.output, cells=3, ran=3, failures=dict(FAILURES))


def _fake_reproduce(monkeypatch: pytest.MonkeyPatch, failures: dict[str, str]) -> None:
    """``reproduce`` with its driver replaced by :func:`fake_grid` ending with these failures."""
    monkeypatch.setattr(f"{__name__}.FAILURES", failures)
    monkeypatch.setattr(
        reproduce, "JOB", dataclasses.replace(reproduce.JOB, driver=f"{__name__}:fake_grid")
    )


def test_a_grid_with_failed_cells_exits_3_listing_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failures = {
        "bert-ko-sembridge-a4": "InputError: model 'no-such-model' not found\n(more detail)",
        "bert-ar-fvt": "RuntimeError: CUDA out of memory",
    }
    _fake_reproduce(monkeypatch, failures)
    assert cli.run("reproduce", ["--output", str(tmp_path)]) == cli.EXIT_FAILED_CELLS == 3
    captured = capsys.readouterr()
    assert "# Results (nDCG@10)" in captured.out  # the report is still printed
    assert captured.err.strip().splitlines() == [
        "error: cell bert-ar-fvt failed: RuntimeError: CUDA out of memory",
        "error: cell bert-ko-sembridge-a4 failed: InputError: model 'no-such-model' not found",
    ]


def test_a_grid_without_failures_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_reproduce(monkeypatch, {})
    assert cli.run("reproduce", ["--output", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


def test_the_codes_are_the_documented_ones() -> None:
    assert (cli.EXIT_DONE, cli.EXIT_BUG, cli.EXIT_INPUT, cli.EXIT_FAILED_CELLS) == (0, 1, 2, 3)
    # 128 + the signal, as shells report them
    assert (cli.EXIT_INTERRUPTED, cli.EXIT_TERMINATED) == (130, 143)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(
        encoding="utf-8"
    )
    section = docs.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in ("0", "1", "2", "3", "130", "143"):
        assert f"| {code} |" in section, code
        assert f"- {code}: " in cli.__doc__, code  # type: ignore[operator]


def test_sigterm_unwinds_the_job_releases_its_lock_and_exits_143(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sigterm_handler: None
) -> None:
    unwound = []

    def body() -> int:
        with OutputLock(tmp_path):
            assert (tmp_path / LOCK).exists()
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # handled before os.kill returns to Python
                pytest.fail("SIGTERM did not stop the job")
            finally:
                unwound.append("finally")
        return 0

    assert cli.run_job(body) == 143
    assert unwound == ["finally"] and not (tmp_path / LOCK).exists()
    assert error_lines(capsys) == ["error: terminated (SIGTERM)"]


def test_a_second_sigterm_does_not_interrupt_the_unwinding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sigterm_handler: None
) -> None:
    cleaned = []

    def body() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # e.g. a supervisor that repeats itself
            cleaned.append("after the second SIGTERM")
        return 0

    assert cli.run_job(body) == 143
    assert cleaned == ["after the second SIGTERM"]
    assert error_lines(capsys) == ["error: terminated (SIGTERM)"]


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemError])
def test_sigterm_is_told_apart_from_what_a_library_turned_it_into(
    capsys: pytest.CaptureFixture[str], sigterm_handler: None, raised: type[BaseException]
) -> None:
    """Inside ray.get, Ray catches the handler's exception: a KeyboardInterrupt becomes a fresh
    KeyboardInterrupt, anything else a SystemError. Either way the job was terminated, not
    interrupted and not a bug."""

    def body() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt as err:
            raise raised("what the library raises instead") from err
        return 0

    assert cli.run_job(body) == 143
    assert error_lines(capsys) == ["error: terminated (SIGTERM)"]


def test_the_previous_handler_is_back_after_a_job_that_was_not_terminated(
    sigterm_handler: None,
) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, mine)
    seen = []

    def job() -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    assert cli.run_job(job) == 0
    assert seen[0] is not mine and signal.getsignal(signal.SIGTERM) is mine


def test_rays_sigterm_exit_is_reported_as_terminated(capsys: pytest.CaptureFixture[str]) -> None:
    """While ray.init runs, its own handler turns SIGTERM into sys.exit(15)."""

    def body() -> int:
        raise SystemExit(signal.SIGTERM)

    assert cli.run_job(body) == 143
    assert error_lines(capsys) == ["error: terminated (SIGTERM)"]
    with pytest.raises(SystemExit) as other:  # any other exit code is the body's own
        cli.run_job(lambda: (_ for _ in ()).throw(SystemExit(4)))
    assert other.value.code == 4


def test_ctrl_c_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    def body() -> int:
        raise KeyboardInterrupt

    assert cli.run_job(body) == 130
    assert error_lines(capsys) == ["interrupted"]


def test_a_local_ray_cluster_that_cannot_start_is_one_line(
    fixtures_root: Path,
    sick_beir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Under heavy load Ray's local start timed out: a 45-line traceback, exit 1 (issue 42, point
    5). Ray's own exception (a bare ``Exception``) is raised where ``ray.init`` raised it."""
    from jobs import evaluate
    from sembridge_ray.distributed import cluster
    from sembridge_ray.runtime.manifest import SUCCESS

    said = (
        "The current node timed out during startup. This could happen because some of the raylet "
        "failed to startup or the GCS has become overloaded."
    )

    def timed_out(*args: object, **kwargs: object) -> None:
        raise Exception(said)

    if cluster.ray.is_initialized():
        pytest.skip("a Ray cluster is already up in this process: nothing would start")
    monkeypatch.setattr(cluster.ray, "init", timed_out)
    out = tmp_path / "eval"
    argv = ["--model", str(fixtures_root / "bert-mlm"), "--dataset", str(sick_beir)]
    assert evaluate.main([*argv, "--output", str(out)]) == 2
    (line,) = error_lines(capsys)
    assert line.startswith(f"error: the local Ray cluster did not start (Exception: {said})"), line
    assert not (out / SUCCESS).exists() and not cluster.ray.is_initialized()
