"""The real tokenizer folders in ../shared/data/tokenizers load offline and tokenise as their models
do."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

FRANCE = "What is the capital of France?"
EXPECTED = {  # the well-known canonical ids
    "bert-base-uncased": (30522, [101, 2054, 2003, 1996, 3007, 1997, 2605, 1029, 102]),
    "roberta-base": (50262, [0, 2264, 16, 5, 812, 9, 1470, 116, 2]),
    "kobigbird-bert-base": (32500, None),
    "bert-base-chinese": (21128, None),
    "araelectra-base-discriminator": (64000, None),
    "bert-base-arabertv2": (64000, None),
}


@pytest.mark.parametrize(("name", "expected"), EXPECTED.items())
def test_real_tokenizer_loads_offline(
    shared_data: Path, name: str, expected: tuple[int, list[int] | None]
) -> None:
    tok = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / name)
    size, ids = expected
    assert len(tok) == size
    if ids is not None:
        assert tok(FRANCE)["input_ids"] == ids


def test_chinese_splits_per_character(shared_data: Path) -> None:
    tok = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "bert-base-chinese")
    assert tok.tokenize("北京大学") == ["北", "京", "大", "学"]
