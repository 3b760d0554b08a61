"""The command line every job shares: layering, --help that explains itself, --print-config,
conflicts, errors."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from sembridge_ray import cli
from sembridge_ray.cli import parse_config, run, run_job
from sembridge_ray.recipes import JOBS, Flag, job_spec, presets
from sembridge_ray.runtime.config import ConfigError, attribute_docs
from sembridge_ray.runtime.errors import InputError
from tests.unit.test_config import Job

FLAGS = [
    Flag(name="--steps", key="steps"),
    Flag(name="--lr", key="optim.lr"),
    Flag(name="--enabled", key="enabled"),
]


def test_layers_defaults_preset_overrides_flags(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text("steps: 5\nname: preset\noptim:\n  lr: 1e-3\n")
    cfg, _ = parse_config(
        Job,
        [
            "--preset",
            str(tmp_path / "small.yaml"),
            "name=cli",
            "--lr",
            "3e-5",
            "answer=no",
            "--no-enabled",
        ],
        flags=FLAGS,
    )
    assert (cfg.steps, cfg.name, cfg.optim.lr, cfg.enabled, cfg.answer) == (
        5,
        "cli",
        3e-5,
        False,
        "no",
    )


def test_unknown_preset_is_named() -> None:
    with pytest.raises(
        ConfigError, match=r"preset 'huge' not found for finetune .*known: paper, smoke"
    ):
        parse_config(job_spec("finetune").config, ["--preset", "huge"], job="finetune")


def test_a_flag_and_an_override_that_disagree_are_an_error() -> None:
    with pytest.raises(ConfigError, match=r"optim.lr is set twice: --lr 1e-4 and optim.lr=2e-4"):
        parse_config(Job, ["--lr", "1e-4", "optim.lr=2e-4"], flags=FLAGS)
    # the same value twice is fine
    cfg, _ = parse_config(Job, ["--lr", "1e-4", "optim.lr=1e-4"], flags=FLAGS)
    assert cfg.optim.lr == 1e-4


def test_unknown_keys_suggest_the_closest_one() -> None:
    spec = job_spec("finetune")
    with pytest.raises(ConfigError, match=r"unknown config key lr; did you mean optim\.lr\?"):
        parse_config(spec.config, ["lr=1e-4"], flags=spec.flags, job="finetune")
    with pytest.raises(ConfigError, match="did you mean max_query_length"):
        parse_config(spec.config, ["max_query_len=3"], flags=spec.flags, job="finetune")


def test_renamed_keys_still_work_for_one_release(caplog: pytest.LogCaptureFixture) -> None:
    spec = job_spec("evaluate")
    cfg, _ = parse_config(spec.config, ["query_max_length=32"], flags=spec.flags, job="evaluate")
    assert cfg.max_query_length == 32 and "now max_query_length" in caplog.text  # type: ignore[attr-defined]


@pytest.mark.parametrize("job", JOBS)
def test_help_lists_choices_effective_defaults_and_the_module(
    job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = job_spec(job)
    with pytest.raises(SystemExit) as exit_:
        run(job, ["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: python -m jobs.{spec.entry}")
    hints = typing.get_type_hints(spec.config)
    for f in dataclasses.fields(spec.config):
        if typing.get_origin(hints[f.name]) is typing.Literal:
            assert f"one of: {', '.join(map(str, typing.get_args(hints[f.name])))}" in text, f.name
    # every flag explains itself from the field's docstring, not "sets <key>"
    for flag in spec.flags:
        assert f"sets {flag.key} (key" not in text, flag.name


def test_help_shows_the_default_presets_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run("malstm", ["--help"])
    text = capsys.readouterr().out
    assert (
        "defaults of preset 'paper'" in text
        and "  restarts = 6   [int]" in text
        and "  train.lr = 2.0   [float]" in text
    )
    with pytest.raises(SystemExit):
        run("init", ["--help"])
    assert (
        "--method {sembridge,sembridge_plus,sembridge_x,focus,wechsel,omp,fvt,mean,random}"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize("job", JOBS)
def test_every_config_field_has_a_docstring(job: str) -> None:
    """--help explains every key from its docstring, so every field needs one."""
    missing = []

    def visit(cls: type, prefix: str) -> None:
        docs = attribute_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                visit(hints[f.name], f"{prefix}{f.name}.")
            elif f.name not in docs:
                missing.append(prefix + f.name)

    visit(job_spec(job).config, "")
    assert missing == []


@pytest.mark.parametrize(("job", "preset"), [(j, p) for j in JOBS for p in [None, *presets(j)]])
def test_print_config_round_trips(
    job: str, preset: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = job_spec(job)
    args = (["--preset", preset] if preset else []) + ["output=/tmp/x y", "--print-config"]
    assert run(job, args) == 0
    printed = capsys.readouterr().out
    (tmp_path / "resolved.yaml").write_text(printed)
    again, _ = parse_config(
        spec.config, ["--config", str(tmp_path / "resolved.yaml")], flags=spec.flags, job=job
    )
    first, _ = parse_config(
        spec.config, args[:-1], flags=spec.flags, job=job, default_preset=spec.default_preset
    )
    assert again == first


def test_run_job_turns_input_errors_into_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def body() -> int:
        raise InputError("model 'x/y' not found")

    assert run_job(body) == 2
    assert capsys.readouterr().err.strip() == "error: model 'x/y' not found"


def test_the_sembridge_command_lists_the_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {job}" in out for job in JOBS)
    assert cli.main(["nope"]) == 2 and "unknown job 'nope'" in capsys.readouterr().err
