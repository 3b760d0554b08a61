"""Which Ray Train failures the fine-tuning driver restarts (``train_run._raise_unless_retried``):
a crash until the last attempt, an error of the input or the environment never. No cluster."""

from __future__ import annotations

import errno

import pytest
from ray.train import WorkerGroupError

from sembridge_ray.distributed.train_run import _raise_unless_retried
from sembridge_ray.runtime.errors import InputError, user_error


def _failed(worker_error: Exception) -> WorkerGroupError:
    return WorkerGroupError(str(worker_error), {0: worker_error})


def test_a_worker_crash_is_restarted_until_the_last_attempt() -> None:
    crash = _failed(RuntimeError("CUDA error: an illegal memory access"))
    _raise_unless_retried(crash, "/ckpt", last=False)  # returns: the driver restarts
    with pytest.raises(WorkerGroupError) as raised:
        _raise_unless_retried(crash, "/ckpt", last=True)
    assert raised.value is crash


def test_an_input_error_ends_the_run_at_the_first_attempt_with_its_line() -> None:
    failed = _failed(InputError("training diverged at step 3"))
    with pytest.raises(WorkerGroupError) as raised:
        _raise_unless_retried(failed, "/ckpt", last=False)
    assert user_error(raised.value) == "training diverged at step 3"


def test_a_full_disk_without_a_file_name_is_one_line_on_the_storage() -> None:
    failed = _failed(OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError) as raised:
        _raise_unless_retried(failed, "/mnt/small", last=False)
    assert raised.value.errno == errno.ENOSPC
    assert user_error(raised.value) == (
        "/mnt/small: cannot write checkpoints: No space left on device (disk full)"
    )
