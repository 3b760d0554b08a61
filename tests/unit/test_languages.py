"""The language registry: one row per target language, and every table that read a language of its
own before now reads the row; each value below is what those tables held, written out by hand."""

from __future__ import annotations

import pytest

from sembridge_ray import catalog, languages
from sembridge_ray.data.squad import SOURCES
from sembridge_ray.recipes.reproduce.config import ReproduceConfig
from sembridge_ray.recipes.reproduce.grid import xling_specs
from sembridge_ray.resources import asset
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.target_tokenizers import licence_files

ISO639_3 = {"ar": "ara", "zh": "zho", "hi": "hin", "ko": "kor", "ru": "rus"}
NAMES = {"ar": "Arabic", "zh": "Chinese", "hi": "Hindi", "ko": "Korean", "ru": "Russian"}
HUB_TOKENIZERS = {
    "ar": "aubmindlab/araelectra-base-discriminator",
    "zh": "google-bert/bert-base-chinese",
    "hi": "l3cube-pune/hindi-bert-scratch",
    "ko": "monologg/kobigbird-bert-base",
    "ru": "DeepPavlov/rubert-base-cased",
}
BUNDLED_HUB_IDS = {
    "ar": "aubmindlab/araelectra-base-discriminator",
    "zh": "google-bert/bert-base-chinese",
    "hi": "",
    "ko": "monologg/kobigbird-bert-base",
    "ru": "intfloat/multilingual-e5-small",
}
LICENCES = {
    "ar": "AraBERT licence (American University of Beirut; attribution, share-alike)",
    "zh": "Apache 2.0 (google-bert/bert-base-chinese)",
    "hi": "MIT (iNLTK Hindi vocabulary, goru001/nlp-for-hindi)",
    "ko": "Apache 2.0 (monologg/kobigbird-bert-base)",
    "ru": "MIT (XLM-R vocabulary of intfloat/multilingual-e5-small)",
}
MIRACL = {
    "ar": (2_061_414, 3_495),
    "zh": (4_934_368, 1_312),
    "hi": (506_264, 1_169),
    "ko": (1_486_752, 868),
    "ru": (9_543_918, 4_683),
}
WEBFAQ = {"ar": (142_664, 132_664), **dict.fromkeys(("zh", "hi", "ko", "ru"), (150_000, 130_000))}
XLING_SPECS = {
    "ar": ("xquad:ar", "xquad:ar+arcd:ar"),
    "zh": ("xquad:zh", "xquad:zh+cmrc2018:zh"),
    "hi": ("xquad:hi", "xquad:hi"),
    "ko": ("korquad:ko", "korquad:ko"),
    "ru": ("xquad:ru", "xquad:ru"),
}


def test_the_rows_hold_what_the_old_tables_held() -> None:
    assert languages.CODES == ("ar", "zh", "hi", "ko", "ru")
    for code in languages.CODES:
        row = languages.language(code)
        assert (row.iso639_3, row.name, row.hub_tokenizer) == (
            ISO639_3[code],
            NAMES[code],
            HUB_TOKENIZERS[code],
        )
        assert (row.bundled.licence, row.bundled.hub_id) == (LICENCES[code], BUNDLED_HUB_IDS[code])
        size = (languages.dataset_size("miracl", code), languages.dataset_size("webfaq", code))
        assert [(s.passages, s.train_queries) for s in size] == [MIRACL[code], WEBFAQ[code]]
        assert languages.of_hub_tokenizer(HUB_TOKENIZERS[code]) == code


def test_the_tables_read_from_the_rows_keep_their_values_and_order() -> None:
    assert [languages.iso639_3(c) for c in ("ar", "ko", "en", "tr", "xx")] == [
        "ara",
        "kor",
        "eng",
        "tur",
        "xx",
    ]
    assert [languages.english_name(c) for c in ("zh", "ja", "fa")] == ["Chinese", "Japanese", "fa"]
    assert not set(languages.OTHER_ISO639_3) & set(languages.CODES)
    assert not set(languages.OTHER_NAMES) & set(languages.CODES)
    tokenizers = [k for k in catalog.LICENCES if k.startswith("tok-")]
    assert tokenizers == ["tok-ar", "tok-zh", "tok-hi", "tok-ko", "tok-ru"]
    assert {k: catalog.LICENCES[k] for k in tokenizers} == {
        f"tok-{c}": LICENCES[c] for c in LICENCES
    }
    assert catalog.KNOWN_ASSETS["tok-hi"] == catalog.KnownAsset(
        "iNLTK's Hindi SentencePiece Unigram (30,000) with SPLADE special tokens, bundled",
        "",
        "hi",
        LICENCES["hi"],
    )
    bundled = {name: s.bundled_languages for name, s in SOURCES.items()}
    assert bundled == {
        "xquad": ("en", "ar", "zh", "hi", "ru"),
        "korquad": ("ko",),
        "cmrc2018": ("zh",),
        "arcd": ("ar",),
    }
    assert [SOURCES[s].languages for s in ("korquad", "cmrc2018", "arcd")] == [
        ("ko",),
        ("zh",),
        ("ar",),
    ]
    cfg = ReproduceConfig(assets="xling")
    assert {code: xling_specs(cfg, code) for code in languages.CODES} == XLING_SPECS
    assert xling_specs(cfg, "de") == ("xquad:de", "xquad:de")
    assert ReproduceConfig().languages == languages.CODES


@pytest.mark.parametrize("code", languages.CODES)
def test_every_row_has_its_resources_in_the_assets(code: str) -> None:
    row = languages.language(code)
    if row.bundled.recipe in ("wordpiece", "arabic-wordpiece"):
        assert asset(f"tokenizers/{code}/vocab.txt").is_file()
    elif row.bundled.recipe == "unigram":
        assert asset(f"tokenizers/{code}/tokenizer.json").is_file()
    assert licence_files(code), f"no licence file travels with tok-{code}"
    for source in (row.retrieval, *row.extra_training):
        assert all(path.is_file() for path in SOURCES[source].files(code))


def test_an_unknown_code_is_one_line_naming_the_codes() -> None:
    with pytest.raises(
        InputError, match=r"^no bundled target tokenizer for 'xx' \(have: ar, zh, hi, ko, ru\)$"
    ):
        languages.language("xx")
    assert languages.find("xx") is None
    assert languages.dataset_size("miracl", "xx") == languages.DatasetSize(0, 0)
