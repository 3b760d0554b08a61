from __future__ import annotations

from pathlib import Path

import pytest

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.config import ConfigError
from sembridge_ray.errors import InputError
from tests.unit.test_config import Job

FLAGS = [Flag("--steps", "steps"), Flag("--lr", "optim.lr"), Flag("--off", "enabled", const="false")]


def test_layers_defaults_preset_overrides_flags(tmp_path: Path) -> None:
    (tmp_path / "job_small.yaml").write_text("steps: 5\nname: preset\noptim:\n  lr: 1e-3\n")
    cfg = parse_config(
        Job,
        ["--config", "small", "name=cli", "--lr", "3e-5", "answer=no", "--off"],
        flags=FLAGS,
        preset_dir=tmp_path,
        prefix="job_",
    )
    assert (cfg.steps, cfg.name, cfg.optim.lr, cfg.enabled, cfg.answer) == (5, "cli", 3e-5, False, "no")


def test_unknown_preset_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'huge'"):
        parse_config(Job, ["--config", "huge"], preset_dir=tmp_path)


def test_run_job_turns_input_errors_into_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def body() -> int:
        raise InputError("model 'x/y' not found")

    assert run_job(body) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: model 'x/y' not found"
