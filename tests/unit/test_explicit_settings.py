"""A value given explicitly is never silently replaced, and a setting a run does not read neither
refuses its reruns nor passes without a word (issue 33, points 5 and 13). No Ray, no model: configs
and the command line only."""

from __future__ import annotations

import logging
import typing
from dataclasses import fields, replace
from pathlib import Path

import pytest

from sembridge_ray.cli import parse_config
from sembridge_ray.embed_init.config import WeightingConfig
from sembridge_ray.embed_init.methods import METHOD_NAMES, SEMBRIDGE_PLUS
from sembridge_ray.recipes import job_spec
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce.config import ReproduceConfig
from sembridge_ray.runtime.config import ConfigError
from tests.unit.test_identity_coverage import perturbations

REQUIRED = ["--model", "m", "--target-tokenizer", "t", "--output", "o"]


def _init(*argv: str) -> InitConfig:
    spec = job_spec("init")
    cfg, _ = parse_config(InitConfig, [*REQUIRED, *argv], flags=spec.flags, job="init")
    return cfg


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        # the dataclass default, given explicitly
        (["--bridge-space", "raw"], "bridge_space='raw'"),
        (["--fvt-weight", "0"], "fvt_weight=0.0"),
        (["--random-blend", "0"], "random_blend=0.0"),
        (["--no-position-aware"], "position_aware=False"),
        (["bridge_space=whiten"], "bridge_space='whiten'"),
    ],
)
def test_a_recipe_refuses_an_explicit_value_that_conflicts_even_a_default(
    flags: list[str], key: str
) -> None:
    with pytest.raises(ConfigError, match=f"{key}: method sembridge_plus fixes it to"):
        _init("--method", "sembridge_plus", *flags)


def test_a_recipe_fills_what_nobody_set_and_takes_explicit_agreement() -> None:
    cfg = _init("--method", "sembridge_plus")
    assert {k: getattr(cfg.weighting, k) for k in SEMBRIDGE_PLUS} == dict(SEMBRIDGE_PLUS)
    assert (
        _init("--method", "sembridge_plus", "--bridge-space", "relative", "--position-aware") == cfg
    )
    assert InitConfig.from_dict(cfg.to_dict()) == cfg  # what workers and --print-config round-trip
    # without a recipe, raw is just raw
    assert _init("--bridge-space", "raw").weighting.bridge_space == "raw"


def test_a_grid_refuses_an_init_setting_that_a_listed_methods_recipe_fixes_otherwise() -> None:
    """Refused when the grid is read, not as a failed cell later. At its default an ``init`` key
    sets the other methods' cells (a grid's config round-trips through ``to_dict``, which writes
    every key)."""
    with pytest.raises(
        ConfigError, match=r"init\.bridge_space='whiten': method sembridge_plus fixes it to"
    ):
        ReproduceConfig.from_dict({"init": {"bridge_space": "whiten"}})
    grid = ReproduceConfig.from_dict(
        {"init": {"bridge_space": "whiten"}, "methods": "sembridge,focus"}
    )
    assert grid.init.weighting.bridge_space == "whiten"
    full = ReproduceConfig()
    assert "sembridge_plus" in full.methods and ReproduceConfig.from_dict(full.to_dict()) == full


def test_a_setting_the_run_does_not_read_is_recorded_all_the_same() -> None:
    """The identity is the resolved config: runs that differ only in a key their method leaves
    unused are two runs (the warning still says the key does nothing); only the operational keys
    (``NOT_IDENTITY``: how the work is cut) leave the fingerprint alone."""
    base = InitConfig()
    unused = [
        # α=4: the rows' support is entmax's, no candidate cut
        InitConfig().with_settings(candidates=7),
        InitConfig(seed=3),  # plain sembridge has no random rows
    ]
    for cfg in unused:
        assert cfg.rule == base.rule or cfg.seed != base.seed
        assert cfg.identity("init", {}) != base.identity("init", {})
    assert {"weighting.candidates", "seed"} <= base.unread()
    cut = InitConfig(bridge_batch_size=7, rows_batch_size=9)  # how the work is cut
    assert cut.identity("init", {}) == base.identity("init", {})
    for read in (
        {"alpha": 1.0, "candidates": 7},
        {"method": "random", "seed": 3},
        {"seed": 3, "random_blend": 0.5},
    ):
        cfg = InitConfig.from_dict(read)
        assert not {"weighting.candidates", "seed"} & set(read) & cfg.unread()
    tune = FinetuneConfig()
    off = FinetuneConfig(eval_split="validation", eval_every=3, eval_max_queries=5)
    assert off.identity("finetune", {}) != tune.identity("finetune", {})
    assert {"eval_split", "eval_every", "eval_max_queries"} <= off.unread()
    on = FinetuneConfig(eval="dev")
    assert FinetuneConfig(eval="dev", eval_every=3).identity("finetune", {}) != on.identity(
        "finetune", {}
    )
    assert EvaluateConfig(encode_batch_size=8, stage_rows=9).identity(
        "evaluate", {}
    ) == EvaluateConfig().identity("evaluate", {})


def test_an_option_the_run_does_not_read_is_named_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        _init(
            "--method",
            "sembridge",
            "wechsel_temperature=0.2",
            "position_penalty=0.5",
            "--alpha",
            "4",
        )
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        "position_penalty does nothing in this run (it is read with position_aware only)",
        "wechsel_temperature does nothing in this run (method sembridge does not read it; only wechsel does)",
    ]
    caplog.clear()
    spec = job_spec("finetune")
    with caplog.at_level(logging.WARNING):
        parse_config(
            FinetuneConfig, ["--eval-every", "5", "--lr", "1e-4"], flags=spec.flags, job="finetune"
        )
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        "--eval-every does nothing in this run (it is read with a development set (--eval) only)"
    ]


def test_presets_of_every_job_still_load(tmp_path: Path) -> None:
    """Presets are explicit values now (not merged over the defaults): each still builds its
    config."""
    from sembridge_ray.recipes import JOBS, PRESET_DIR, load_preset_file, presets

    for job in JOBS:
        for name in presets(job):
            assert isinstance(
                load_preset_file(PRESET_DIR / f"{job}_{name}.yaml"), job_spec(job).config
            )


def test_the_weighting_section_takes_its_keys_with_or_without_its_name(tmp_path: Path) -> None:
    """``alpha`` is ``weighting.alpha`` everywhere a user writes it: a flag, an override, a preset,
    a grid's ``init`` section; the later layer wins whichever spelling each uses, and one mapping
    spelling a key both ways with two values is refused."""
    nested = InitConfig(weighting=WeightingConfig(alpha=2.0, position_aware=True))
    assert _init("--alpha", "2", "--position-aware") == _init(
        "alpha=2", "weighting.position_aware=true"
    )
    assert _init("--alpha", "2", "--position-aware").weighting == nested.weighting
    preset = tmp_path / "p.yaml"
    preset.write_text("alpha: 3\nweighting:\n  position_aware: true\n", encoding="utf-8")
    assert _init("--preset", str(preset)).weighting == replace(nested.weighting, alpha=3.0)
    assert _init("--preset", str(preset), "weighting.alpha=2").weighting == nested.weighting
    preset.write_text("weighting:\n  alpha: 3\n", encoding="utf-8")
    assert (
        _init("--preset", str(preset), "--alpha", "2", "position_aware=yes").weighting
        == nested.weighting
    )
    with pytest.raises(ConfigError, match=r"alpha is given twice: '2' and weighting\.alpha='3'"):
        InitConfig.from_dict({"alpha": "2", "weighting": {"alpha": "3"}})
    assert (
        InitConfig.from_dict({"alpha": "2", "weighting": {"alpha": "2.0"}}).weighting.alpha == 2.0
    )
    grid = ReproduceConfig.from_dict(
        {"init": {"temperature": 0.5, "weighting": {"position_aware": True}}}
    )
    assert grid.init.weighting == WeightingConfig(temperature=0.5, position_aware=True)
    assert InitConfig().with_settings(alpha=2.0, position_aware=True, seed=4) == replace(
        nested, seed=4
    )
    assert InitConfig().with_overrides(["alpha=2", "weighting.position_aware=true"]) == nested
    # named as given: --alpha, alpha=
    with pytest.raises(ConfigError, match=r"^alpha=0\.5: must be >= 1"):
        _init("--alpha", "0.5")


@pytest.mark.parametrize("key", [f.name for f in fields(WeightingConfig)])
def test_the_maths_reads_a_weighting_option_exactly_where_it_is_declared_read(key: str) -> None:
    """Each option's declaration (``embed_init.config.Read``) decides both what the maths receives
    (``InitConfig.rule``) and what the ``does nothing`` warning names (``InitConfig.unread``): for
    every method, with the option's conditions met and not, a change of it reaches the maths exactly
    where it is not declared unread. The identity records it either way."""
    tp = typing.get_type_hints(WeightingConfig)[key]
    bases: list[dict[str, object]] = [
        {},
        {"alpha": 1.0},
        {"position_aware": True},
        {"bridge_space": "abtt"},
        {"adaptive_support": "fixed"},
    ]
    for method in METHOD_NAMES:
        for extra in bases:
            try:
                cfg = InitConfig().with_settings(method=method, **extra)
            except ConfigError:
                continue  # the recipe of sembridge_plus fixes bridge_space
            value = getattr(cfg.weighting, key)
            changed = None
            for other in perturbations(value, tp, key):
                try:
                    changed = cfg.with_settings(**{key: other})
                    break
                except ConfigError:
                    continue
            if changed is None or changed == cfg:
                # refused with these settings (e.g. a recipe's key, OMP's penalty), or set back to
                # its recipe's value (a recipe fills a key at its default)
                continue
            read = f"weighting.{key}" not in cfg.unread()
            assert (changed.rule != cfg.rule) == read, (key, method, extra)
            assert changed.identity("init", {}) != cfg.identity("init", {}), (key, method, extra)
