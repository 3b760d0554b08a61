"""The model card the init job writes: it names the method, α, bridge and target tokenizer, and sentence-transformers
loads the model with it and keeps it (so a push carries it); pushing offline is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sembridge_ray.cli import run_job
from sembridge_ray.distributed.init_job import initialise
from sembridge_ray.jobs.init import InitConfig
from sembridge_ray.model_card import read_provenance, render


@pytest.fixture(scope="module")
def model_dir(fixtures_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("card") / "init"
    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-bytebpe"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(out),
        alpha=3.0,
        language="ko",
        cache_dir=str(out.parent / "cache"),
        samples=2,
    )
    return Path(initialise(cfg).model)


def test_the_card_names_the_method_alpha_bridge_and_target(model_dir: Path, fixtures_root: Path) -> None:
    card = (model_dir / "README.md").read_text(encoding="utf-8")
    assert "| method | sembridge, α = 3 |" in card and "language: ko" in card
    assert f"| bridge model | {fixtures_root / 'bridge'} |" in card
    assert f"| target tokenizer | {fixtures_root / 'tok-bytebpe'} |" in card
    prov = read_provenance(model_dir)["init"]
    assert sum(prov["kinds"].values()) > 0 and f"{sum(prov['support_histogram'].values())} tokens)" in card
    assert "## Licences of the inputs" in card


def test_sparse_encoder_loads_the_model_and_keeps_the_card(model_dir: Path) -> None:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(model_dir), device="cpu")
    assert model._model_card_text == (model_dir / "README.md").read_text(encoding="utf-8")
    vocab = len(model.tokenizer)
    assert model.encode_query(["a man plays a guitar"], convert_to_tensor=True).shape[-1] == vocab


def test_a_fine_tuned_card_extends_the_initialisation() -> None:
    prov = {
        "init": {"source_model": "naver/splade-v3", "method": "focus", "language": "ar"},
        "finetune": {"train": "miracl:ar", "steps": 120, "batch_size": 64, "lr": 2e-5},
    }
    card = render(prov)
    assert "# Fine-tuned sparse encoder (ar)" in card and "base_model: naver/splade-v3" in card
    assert "| training data | miracl:ar |" in card and "CC BY-NC-SA 4.0" in card  # splade-v3's licence


def test_pushing_offline_is_one_line(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    from sembridge_ray.sparse.model import push_model

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert run_job(lambda: bool(push_model(model_dir, "someone/sembridge-test"))) == 2
    assert capsys.readouterr().err.strip() == (
        "error: cannot push to the hub repository 'someone/sembridge-test': HF_HUB_OFFLINE is set (offline)"
    )
