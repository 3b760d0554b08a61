"""The bundled files live in the distribution ``sembridge-ray-assets`` (the checkout's ``assets/``),
not in ``sembridge_ray``'s wheel: bundled names resolve to the same bytes as when the package held
them, and without the assets every use is one line naming the asset and the install (exit 2)."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sembridge_ray import cli, resources
from sembridge_ray.data.squad import source_files
from sembridge_ray.embed_init.bridge import shipped_vectors
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese import augment
from sembridge_ray.target_tokenizers import build_target_tokenizer
from tests.conftest import REPO, error_lines

ORIGINAL = {
    "data/sick2014/SICK_train.txt": "266cf8047149bd1d68138dd30439f3122bff30069740ac6705bb6197d9f1b48e",
    "data/sick2014/readme.txt": "4ff14a2b07603f2214c2803a6e012048c795be5ba4e5d1d33b87d7210f633bf7",
    "data/sts/2012/00-readme.train.txt": "bc0641542694710006cb02f7e5975ada74cfeb83ff9f0f72cb5b1a6aa35fdca6",
    "data/xquad/xquad.ru.json": "208d5b1aa154c52b1b5c5eda16281e455e8fd198cdb9af3f469f0d6037d973bf",
    "data/korquad/KorQuAD_v1.0_dev.json": "25ffeb51e6c51ec02c071b60a10188e10005c144110f0d876b26079d80a35bdf",
    "data/arcd/LICENSE": "be4d6b90fd5ae3a7044ab3f1a462887c422882e8befdd58f1c8faaa3b43b500a",
    "tokenizers/hi/tokenizer.json": "eb241d5be00b74e76b2f061416ff6154300672045b75b407639ed5b01ba56e01",
    "tokenizers/ko/vocab.txt": "e6096039c6af973b9fbcef311d9b6f6623b6862403cc1c71aa321374b8308caf",
    "tokenizers/ar/LICENSE": "62aa57377325cd7c7e608c9a1837a5fea8903ba3f79d6e360e3fbb6d7efc3b70",
    "thesaurus/sick_wordnet30.tsv": "1cbe39adc2049bee3b38fee3795e74647a6576fe31cda4874e800dc288cfc6b2",
    "thesaurus/WORDNET_LICENSE.txt": "f461bac9a5a1810c4fe1e3cec0a980f79406e3a8c1c147f3874979fb00e2cc0e",
}
"""sha256 of files as the package held them, from git (``git show
2215d47:sembridge_ray/resources/<name> | sha256sum``, the commit before they moved)."""


@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_a_bundled_name_resolves_to_the_original_bytes(name: str) -> None:
    assert hashlib.sha256(resources.asset(name).read_bytes()).hexdigest() == ORIGINAL[name]


def test_the_accessors_point_into_the_assets() -> None:
    root = resources.assets_root()
    assert root is not None and (root / "__init__.py").is_file()
    assert resources.sick_dir() == root / "data" / "sick2014"
    assert resources.sts_dir() == root / "data" / "sts"
    assert resources.bridge_cache_dir() == root / "bridge_cache"
    assert augment.bundled_thesaurus() == root / "thesaurus" / "sick_wordnet30.tsv"
    assert source_files("xquad", "ar") == [root / "data" / "xquad" / "xquad.ar.json"]


def test_the_wheel_of_sembridge_ray_leaves_the_assets_out() -> None:
    """Only the small files the code reads stay package data; the assets' own distribution takes
    every file under its package."""
    ours = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    data = ours["tool"]["setuptools"]["package-data"]["sembridge_ray"]
    assert not [p for p in data if "**" in p or p.startswith(("resources/data", "resources/tok"))]
    kept = [p for p in data if p.startswith("resources/")]
    assert all((REPO / "sembridge_ray" / p).is_file() for p in kept)
    folder = REPO / "sembridge_ray" / "resources"
    files = [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sorted(p.name for p in files) == [
        "__init__.py",
        "model_card_template.md",
        "ray_data_logging.yaml",
    ]
    theirs = tomllib.loads((REPO / "assets" / "pyproject.toml").read_text(encoding="utf-8"))
    assert theirs["project"]["name"] == "sembridge-ray-assets"
    assert theirs["tool"]["setuptools"]["package-data"]["sembridge_ray_assets"] == ["**/*"]


@pytest.fixture
def no_assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the package installed nor a checkout's ``assets/`` beside ``sembridge_ray``."""
    monkeypatch.setattr(resources, "PACKAGE", "sembridge_ray_assets_not_installed")
    monkeypatch.setattr(resources, "CHECKOUT_ASSETS", tmp_path / "no-assets")


MISSING = (
    "the bundled {} is not here: it ships in the sembridge-ray-assets distribution, which is not "
    "installed; install it with pip install -e ./assets in the checkout (bash cluster/local.sh "
    "setup does)"
)


@pytest.mark.usefixtures("no_assets")
@pytest.mark.parametrize(
    ("use", "name"),
    [
        (resources.sick_dir, "data/sick2014"),
        (resources.sts_dir, "data/sts"),
        (augment.bundled_thesaurus, "thesaurus/sick_wordnet30.tsv"),
        (lambda: source_files("korquad", "ko"), "data/korquad"),
        (lambda: build_target_tokenizer("ko", Path("unused")), "tokenizers/ko"),
    ],
)
def test_without_the_assets_each_use_is_one_line_naming_it(use: object, name: str) -> None:
    with pytest.raises(InputError) as err:
        use()  # type: ignore[operator]
    assert str(err.value) == MISSING.format(name)


@pytest.mark.usefixtures("no_assets")
def test_without_the_assets_the_shipped_vectors_are_simply_absent() -> None:
    assert resources.assets_root() is None and resources.bridge_cache_dir() is None

    def never(strings: pa.Table) -> np.ndarray:
        raise AssertionError("nothing is encoded when no vectors are shipped")

    assert shipped_vectors("any-key", pa.table({"text": ["a"]}), never) is None


def test_without_the_assets_a_job_exits_2_with_the_line(
    no_assets: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.run("malstm", ["--preset", "smoke", "--output", str(tmp_path / "out")])
    assert code == cli.EXIT_INPUT == 2
    assert error_lines(capsys) == [f"error: {MISSING.format('data/sick2014')}"]
