"""The paper grid: the dry run names every hub id and contacts nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs import init_embeddings
from sembridge_ray import catalog


def test_grid_dry_run_names_every_hub_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert init_embeddings.main(["--grid", "paper", "--dry-run", "--output", str(tmp_path)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan) == 20 and {c["status"] for c in plan} == {"todo"}
    assert {c["source_model"] for c in plan} == set(catalog.SOURCE_MODELS.values())
    assert {c["target_tokenizer"] for c in plan} == {lang.tokenizer for lang in catalog.LANGUAGES.values()}
    assert {c["bridge_model"] for c in plan} == {"BAAI/bge-m3"}
    assert len({c["cell"] for c in plan}) == 20
    assert "monologg/kobigbird-bert-base" in {c["target_tokenizer"] for c in plan}


def test_unknown_grid_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert init_embeddings.main(["--grid", "huge", "--dry-run", "--output", str(tmp_path)]) == 2
    assert "grid: 'huge' is not one of ['', 'paper']" in capsys.readouterr().err
