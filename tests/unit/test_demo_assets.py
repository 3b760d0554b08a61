"""The demo's built inputs are recorded with the settings they were built from: a rerun with other
``demo.*`` settings is refused naming the keys, before Ray starts and without touching
``config.yaml``; ``--overwrite`` rebuilds exactly the assets those settings shape."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs import reproduce
from sembridge_ray.data.sick import read_sick_split
from sembridge_ray.recipes import PRESET_DIR, load_preset_file
from sembridge_ray.recipes.reproduce import demo
from sembridge_ray.recipes.reproduce.config import DemoSettings
from sembridge_ray.resources import sick_dir
from sembridge_ray.runtime.errors import InputError
from tests.conftest import error_lines


def stand_in(asset: demo.Asset) -> demo.Asset:
    """The asset with a builder that only writes its ready file and the settings it was built from:
    the model and tokenizer builders take ~30 s and are exercised by every demo run; here the record
    is under test."""

    def build(out: Path, settings: DemoSettings) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        (out / asset.ready).write_text(
            repr([getattr(settings, k) for k in asset.settings]), encoding="utf-8"
        )
        return out

    return dataclasses.replace(asset, build=build)


@pytest.fixture(autouse=True)
def quick_builders(monkeypatch: pytest.MonkeyPatch) -> None:
    heavy = {name: stand_in(demo.ASSETS[name]) for name in ("target", "untrained")}
    monkeypatch.setattr(demo, "ASSETS", {**demo.ASSETS, **heavy})


@pytest.fixture()
def built(tmp_path: Path) -> tuple[Path, DemoSettings]:
    """A quick run's root holding the assets its settings build and the config.yaml it wrote."""
    cfg = load_preset_file(PRESET_DIR / "reproduce_quick.yaml")
    root = tmp_path / "quick"
    demo.build_assets(root / "assets", cfg.demo)  # type: ignore[attr-defined]
    (root / "config.yaml").write_text("what a finished run wrote\n", encoding="utf-8")
    return root, cfg.demo  # type: ignore[attr-defined]


def test_same_settings_reuse_every_asset(built: tuple[Path, DemoSettings]) -> None:
    root, settings = built
    stamps = {p: p.stat().st_mtime_ns for p in (root / "assets").rglob("*") if p.is_file()}
    assert demo.asset_changes(root / "assets", settings) == []
    demo.build_assets(root / "assets", settings)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("test_pairs=100", "test_pairs"),
        ("mlm_bias=-1.0", "mlm_bias"),
        ("target_vocab=500", "target_vocab"),
    ],
)
def test_other_demo_settings_are_refused_before_ray_and_leave_config_yaml_untouched(
    built: tuple[Path, DemoSettings], capsys: pytest.CaptureFixture[str], override: str, key: str
) -> None:
    root, _ = built
    before = (root / "config.yaml").read_bytes()
    code = reproduce.main(["--preset", "quick", "--output", str(root), f"demo.{override}"])
    assert code == 2
    err = error_lines(capsys)
    assert len(err) == 1 and f"demo.{key}:" in err[0] and "--overwrite" in err[0]
    ray = sys.modules.get("ray")  # imported with the driver; it must not have started
    assert (root / "config.yaml").read_bytes() == before and (
        ray is None or not ray.is_initialized()
    )


def test_overwrite_rebuilds_only_the_assets_a_changed_setting_shapes(
    built: tuple[Path, DemoSettings],
) -> None:
    root, settings = built
    assets = root / "assets"
    stamps = {name: (assets / a.path).stat().st_mtime_ns for name, a in demo.ASSETS.items()}
    changed = dataclasses.replace(settings, test_pairs=settings.test_pairs // 2)
    with pytest.raises(InputError, match=r"demo\.test_pairs"):
        demo.check_assets(assets, changed, overwrite=False)
    demo.check_assets(assets, changed, overwrite=True)
    demo.build_assets(assets, changed)
    after = {name: (assets / a.path).stat().st_mtime_ns for name, a in demo.ASSETS.items()}
    assert [name for name in stamps if after[name] != stamps[name]] == ["beir"]
    queries = (assets / "sick-beir" / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(queries) <= changed.test_pairs and demo.asset_changes(assets, changed) == []


def test_the_dev_set_is_sick_trial_and_no_training_pair_comes_from_it(
    built: tuple[Path, DemoSettings],
) -> None:
    assets = built[0] / "assets"
    dev = assets / demo.ASSETS["dev"].path
    assert sorted(p.name for p in (dev / "qrels").iterdir()) == ["dev.tsv"]
    trial = {p.a for p in read_sick_split(sick_dir(), "trial")}
    queries = {
        json.loads(line)["text"]
        for line in (dev / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    }
    assert queries == trial  # every trial sentence A, and nothing else
    train = pq.read_table(assets / demo.ASSETS["sick_train"].path)
    assert train.num_rows == 1683  # SICK train's pairs >= 4.0; with trial's 202 it was 1885
    trial_pairs = {(p.a, p.b) for p in read_sick_split(sick_dir(), "trial")}
    assert (
        not set(
            zip(
                train.column("query").to_pylist(), train.column("positive").to_pylist(), strict=True
            )
        )
        & trial_pairs
    )


def test_an_output_whose_training_pairs_held_the_trial_split_is_told_they_changed(
    built: tuple[Path, DemoSettings],
) -> None:
    root, settings = built
    assets = root / "assets"
    record = json.loads((assets / demo.ASSETS_RECORD).read_text(encoding="utf-8"))
    # as the version before the development set recorded them
    for name in ("sick_train", "source_pairs"):
        record["assets"][name]["version"] = 1
    del record["assets"]["dev"]
    (assets / demo.ASSETS["dev"].path / "qrels" / "dev.tsv").unlink()  # and it had no dev set
    (assets / demo.ASSETS_RECORD).write_text(json.dumps(record), encoding="utf-8")
    assert demo.asset_changes(assets, settings) == [
        "sick_train version: 1 → 2",
        "source_pairs version: 1 → 2",
    ]
    with pytest.raises(
        InputError, match=r"sick_train version: 1 → 2; source_pairs version: 1 → 2.*--overwrite"
    ):
        demo.check_assets(assets, settings, overwrite=False)
    demo.build_assets(assets, settings)
    assert (
        demo.asset_changes(assets, settings) == []
        and (assets / "sick-dev-beir" / "qrels" / "dev.tsv").is_file()
    )
