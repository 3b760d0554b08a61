from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from sembridge_ray.runtime.config import (
    Config,
    ConfigError,
    coerce,
    load_preset,
    merge,
    read_config,
    write_config,
)


@dataclass(frozen=True)
class Optim(Config):
    lr: float = 2e-5
    betas: tuple[float, ...] = (0.9, 0.999)


@dataclass(frozen=True)
class Job(Config):
    name: str = "run"
    steps: int = 10
    bf16: Literal["auto", "on", "off"] = "auto"
    answer: str = "yes"
    enabled: bool = True
    limit: int | None = None
    optim: Optim = field(default_factory=Optim)


def test_no_stays_a_string_and_scientific_becomes_float() -> None:
    cfg = Job().with_overrides(["answer=no", "optim.lr=3e-5"])
    assert cfg.answer == "no"
    assert cfg.optim.lr == pytest.approx(3e-5) and isinstance(cfg.optim.lr, float)


@pytest.mark.parametrize(
    ("text", "tp", "expected"),
    [
        ("no", bool, False),
        ("on", bool, True),
        ("7", int, 7),
        ("null", int | None, None),
        ("3", int | None, 3),
        ("1,2,3", tuple[int, ...], (1, 2, 3)),
        ("off", Literal["auto", "on", "off"], "off"),
        ("1e3", float, 1000.0),
    ],
)
def test_coerce_through_annotations(text: str, tp: object, expected: object) -> None:
    assert coerce(text, tp, "k") == expected


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.momentum=1", "optim.momentum"),
        ("nope=1", "nope"),
        ("steps=ten", "steps"),
        ("bf16=maybe", "bf16"),
        ("missing-equals", "key.sub=value"),
    ],
)
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Job().with_overrides([override])


def test_round_trip_through_dict_and_yaml(tmp_path: Path) -> None:
    cfg = Job(name="no", steps=3, limit=None, optim=Optim(lr=3e-5, betas=(0.8, 0.9)), answer="off")
    assert Job.from_dict(cfg.to_dict()) == cfg
    write_config(cfg, tmp_path / "config.yaml")
    assert read_config(Job, tmp_path / "config.yaml") == cfg


def test_yaml_preset_values_are_coerced_not_yaml_typed(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("answer: no\noptim:\n  lr: 3e-5\nenabled: no\n")
    cfg = Job.from_dict(merge(Job().to_dict(), load_preset(preset)))
    assert (cfg.answer, cfg.enabled, cfg.optim.lr, cfg.optim.betas) == (
        "no",
        False,
        3e-5,
        (0.9, 0.999),
    )


def test_configs_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Job().steps = 3  # type: ignore[misc]


def test_a_key_read_only_with_another_is_refused_alone_on_every_job() -> None:
    """``scores`` (init, finetune) needs ``push_to_hub``; ``figures`` (init, reproduce) needs
    ``dry_run``: one rule on the field, the same line from each job, and accepted with its key."""
    from sembridge_ray.recipes.finetune.config import FinetuneConfig
    from sembridge_ray.recipes.init.config import InitConfig
    from sembridge_ray.recipes.reproduce.config import ReproduceConfig

    cases = [
        (InitConfig, "scores", ("a", "b"), "push_to_hub", "org/m", "read only with push_to_hub"),
        (FinetuneConfig, "scores", ("a",), "push_to_hub", "org/m", "read only with push_to_hub"),
        (InitConfig, "figures", "f.json", "dry_run", True, "--dry-run's estimate only"),
        (ReproduceConfig, "figures", "f.json", "dry_run", True, "--dry-run's estimate only"),
    ]
    for cls, key, value, needed, given, rule in cases:
        with pytest.raises(ConfigError) as err:
            cls(**{key: value})  # type: ignore[arg-type]
        shown = ",".join(value) if isinstance(value, tuple) else value
        # the line each job wrote by hand before the rule moved onto the field
        assert str(err.value).startswith(f"{key}={shown!r}: ") and rule in str(err.value)
        assert getattr(cls(**{key: value, needed: given}), key) == value  # type: ignore[arg-type]
