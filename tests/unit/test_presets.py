from __future__ import annotations

from pathlib import Path

import pytest

from sembridge_ray.recipes import JOBS, PRESET_DIR, load_preset_file
from sembridge_ray.runtime.config import Config

PRESETS = sorted(PRESET_DIR.glob("*.yaml"))


def test_there_are_presets_and_each_names_a_known_job() -> None:
    assert PRESETS
    assert {p.stem.split("_", 1)[0] for p in PRESETS} <= set(JOBS)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_loads_and_round_trips(path: Path) -> None:
    cfg = load_preset_file(path)
    assert isinstance(cfg, Config)
    assert type(cfg).from_dict(cfg.to_dict()) == cfg
