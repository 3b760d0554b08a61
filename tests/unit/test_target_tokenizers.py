"""The five target tokenizers (``tok-ar``, ``tok-zh``, ``tok-hi``, ``tok-ko``, ``tok-ru``): each
loads with ``AutoTokenizer``, has the five roles a SPLADE transfer maps, wraps a sentence of its
language in cls ... sep, and leaves few pieces unknown on held-out text of its language; the Russian
one is XLM-R's vocabulary trimmed in order, never the unlicensed Wikipedia SentencePiece beside the
checkout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from sembridge_ray import languages
from sembridge_ray import target_tokenizers as tt
from sembridge_ray.resources import asset
from sembridge_ray.runtime.atomic import sha256_file

# Unknown pieces on held-out text, at most (measured: ar 0.31%, zh 1.17% (curly quotes and
# upper-case Latin, which bert-base-chinese's vocabulary lacks), hi 0.81%, ko 0.02%, ru 0.05%):
# XQuAD's test articles 24-47 (paragraphs); Korean, which XQuAD lacks, on Tatoeba's 1,000 Korean
# sentences.
UNKNOWN_BOUND = {"ar": 0.01, "zh": 0.02, "hi": 0.015, "ko": 0.005, "ru": 0.005}
SENTENCE = {
    "ar": "عاصمة فرنسا هي باريس.",
    "zh": "法国的首都是巴黎。",
    "hi": "फ्रांस की राजधानी पेरिस है।",
    "ko": "프랑스의 수도는 파리입니다.",
    "ru": "Столица Франции — Париж.",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("target_tokenizers")
    return {lang: tt.build_target_tokenizer(lang, root / f"tok-{lang}") for lang in languages.CODES}


def held_out(language: str, shared: Path) -> list[str]:
    if language == "ko":
        path = shared / "tatoeba" / "tatoeba.kor-eng.kor"
        if not path.is_file():
            pytest.skip(f"{path} not found")
        return path.read_text(encoding="utf-8").splitlines()
    path = asset("data") / "xquad" / f"xquad.{language}.json"
    path = path if path.is_file() else shared / "xquad" / f"xquad.{language}.json"
    if not path.is_file():
        pytest.skip(f"XQuAD-{language} not found")
    return [
        p["context"]
        for a in json.loads(path.read_text(encoding="utf-8"))["data"][24:]
        for p in a["paragraphs"]
    ]


@pytest.mark.parametrize("language", languages.CODES)
def test_each_loads_with_the_five_roles_and_wraps_a_sentence(
    built: dict[str, Path], language: str
) -> None:
    tok = AutoTokenizer.from_pretrained(str(built[language]))
    roles = {role: getattr(tok, f"{role}_token_id") for role in tt.SPLADE_ROLES}
    assert None not in roles.values() and len(set(roles.values())) == 5, roles
    ids = tok(SENTENCE[language])["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.unk_token_id not in ids and len(ids) > 4
    assert tok.pad_token_id not in ids[1:-1] and tok.mask_token_id not in ids[1:-1]
    licence = (built[language] / "README.md").read_text(encoding="utf-8")
    assert languages.language(language).bundled.licence in licence
    assert any(p.name.startswith(("LICENSE", "NOTICE")) for p in built[language].iterdir())


@pytest.mark.parametrize("language", languages.CODES)
def test_held_out_text_has_few_unknown_pieces(
    built: dict[str, Path], language: str, shared_data: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(str(built[language]))
    encoded = tok(held_out(language, shared_data), add_special_tokens=False)["input_ids"]
    pieces = sum(len(ids) for ids in encoded)
    unknown = sum(ids.count(tok.unk_token_id) for ids in encoded)
    assert unknown / pieces <= UNKNOWN_BOUND[language], f"{unknown} of {pieces}"


def test_a_build_is_marked_with_its_licence(built: dict[str, Path]) -> None:
    marker = json.loads(Path(f"{built['ar']}.asset.json").read_text(encoding="utf-8"))
    assert marker["asset"] == "tok-ar" and "AraELECTRA" in marker["what"]


def test_arabic_diacritics_are_removed_before_the_wordpiece(built: dict[str, Path]) -> None:
    tok = AutoTokenizer.from_pretrained(str(built["ar"]))
    assert tok.tokenize("أيضاً يُطلق") == tok.tokenize("أيضا يطلق")
    assert tok.unk_token not in tok.tokenize("أيضاً يُطلق")


def test_the_hindi_file_bundled_is_left_as_it_is(built: dict[str, Path]) -> None:
    bundled = json.loads((tt.asset("tokenizers/hi/tokenizer.json")).read_text(encoding="utf-8"))
    assert bundled["added_tokens"] == [] and bundled["post_processor"] is None
    tok = AutoTokenizer.from_pretrained(str(built["hi"]))
    # <pad>, <mask> appended; <unk> <s> </s> are pieces 0-2
    assert len(tok) == len(bundled["model"]["vocab"]) + 2
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<unk>", "<s>", "</s>"]


def test_the_russian_tokenizer_keeps_xlmr_pieces_in_their_order(built: dict[str, Path]) -> None:
    from sembridge_ray.bridges import me5_sources

    xlmr = json.loads(me5_sources()[1].read_text(encoding="utf-8"))["model"]["vocab"]
    ours = json.loads((built["ru"] / "tokenizer.json").read_text(encoding="utf-8"))["model"][
        "vocab"
    ]
    position = {piece: i for i, (piece, _) in enumerate(xlmr)}
    kept = [position[piece] for piece, _ in ours]
    assert kept == sorted(kept) and all(
        xlmr[i][1] == score for i, (_, score) in zip(kept, ours, strict=True)
    )
    assert (
        5_000 < len(ours) < 10_000 and ours[:4] == xlmr[:4] and ours[-1] == xlmr[-1]
    )  # <s> <pad> </s> <unk> .. <mask>
    letters = [
        p for c in "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАЯ" for p in (c, f"▁{c}") if p in position
    ]
    # any Cyrillic text still segments
    assert len(letters) > 40 and {position[p] for p in letters} <= set(kept)


def test_the_russian_pieces_come_from_training_articles_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[slice] = []
    real = tt.xquad_texts

    def spy(path: Path, articles: slice) -> list[str]:
        seen.append(articles)
        return real(path, articles)[:3]

    monkeypatch.setattr(tt, "xquad_texts", spy)
    tt.russian_tokenizer()
    assert seen == [slice(0, 24)]


def test_trim_unigram_renumbers_the_unknown_the_added_tokens_and_the_template() -> None:
    vocab = [
        ["<s>", 0.0],
        ["<pad>", 0.0],
        ["</s>", 0.0],
        ["<unk>", 0.0],
        ["▁a", -1.0],
        ["b", -2.0],
        ["<mask>", 0.0],
    ]
    spec: dict[str, Any] = {
        "model": {"type": "Unigram", "unk_id": 3, "vocab": vocab},
        "added_tokens": [
            {"id": i, "content": vocab[i][0], "special": True} for i in (0, 1, 2, 3, 6)
        ],
        "post_processor": {
            "type": "TemplateProcessing",
            "special_tokens": {"</s>": {"id": "</s>", "ids": [2]}},
        },
    }
    out = tt.trim_unigram(spec, [0, 2, 3, 5, 6])  # <pad> and ▁a dropped
    assert (
        out["model"]["vocab"] == [vocab[i] for i in (0, 2, 3, 5, 6)] and out["model"]["unk_id"] == 2
    )
    assert [(t["content"], t["id"]) for t in out["added_tokens"]] == [
        ("<s>", 0),
        ("</s>", 1),
        ("<unk>", 2),
        ("<mask>", 4),
    ]
    assert out["post_processor"]["special_tokens"]["</s>"]["ids"] == [1]
    assert spec["model"]["vocab"] == vocab  # the input is not changed


def test_kept_characters_cover_cyrillic_latin_digits_and_punctuation() -> None:
    assert all(tt.is_kept_character(p) for p in ("ж", "▁Ж", "q", "7", "«", "—", "…", "№", "▁", "°"))
    assert not any(tt.is_kept_character(p) for p in ("ab", "▁жи", "中", "ا", "ℵ"))


def test_none_is_the_unlicensed_russian_wikipedia_sentencepiece(
    built: dict[str, Path], shared_data: Path
) -> None:
    ruwiki = shared_data / "tokenizers" / "ruwiki-sentencepiece"
    if not ruwiki.is_dir():
        pytest.skip("the ruwiki SentencePiece is not beside the checkout")
    theirs = {sha256_file(p) for p in ruwiki.iterdir() if p.is_file() and p.stat().st_size > 1000}
    package, assets = Path(tt.__file__).resolve().parent, asset("")
    roots = (package, assets, *built.values())
    files = [p for root in roots for p in Path(root).rglob("*") if p.is_file()]
    assert not [p for p in files if sha256_file(p) in theirs]
    spm = json.loads((ruwiki / "ruwiki16k.tokenizer.json").read_text(encoding="utf-8"))["model"][
        "vocab"
    ]
    ours = json.loads((built["ru"] / "tokenizer.json").read_text(encoding="utf-8"))["model"][
        "vocab"
    ]
    assert len(ours) != len(spm) and {p for p, _ in ours} != {p for p, _ in spm}
