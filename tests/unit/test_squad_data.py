"""SQuAD-format retrieval sets (``sembridge_ray.data.squad``) on the bundled XQuAD, KorQuAD, CMRC
2018 and ARCD files: splits by article, one relevant sentence per question holding its answer,
parallel ids across XQuAD languages, one-line errors."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from sembridge_ray.data.pairs import pairs_from_retrieval
from sembridge_ray.data.retrieval import CORPUS_SCHEMA, RetrievalData
from sembridge_ray.data.schema import ID, POSITIVE, QUERY, TEXT
from sembridge_ray.data.squad import (
    SOURCES,
    SPLITS,
    article_splits,
    load,
    load_arcd,
    load_cmrc2018,
    load_korquad,
    load_xquad,
    sentence_spans,
    source_file,
)
from sembridge_ray.resources import asset
from sembridge_ray.runtime.errors import InputError
from tests.conftest import REPO

XQUAD_LANGS = ("en", "ar", "zh", "hi", "ru")
SPLIT_SETS = [("xquad", lang) for lang in XQUAD_LANGS] + [("korquad", "ko")]


@functools.cache
def loaded(source: str, lang: str, split: str) -> RetrievalData:
    return SOURCES[source].loader(lang, split, None)


@functools.cache
def corpus(source: str, lang: str, split: str) -> dict[str, str]:
    tables = loaded(source, lang, split).corpus.batches(500)
    return {
        i: t for b in tables for i, t in zip(b[ID].to_pylist(), b[TEXT].to_pylist(), strict=True)
    }


@functools.cache
def answers(source: str, lang: str) -> tuple[int, dict[str, str]]:
    """(article count, question id -> first answer text), read from the bundled files directly."""
    found: dict[str, str] = {}
    n = 0
    for path in SOURCES[source].files(lang):
        articles = json.loads(path.read_text(encoding="utf-8"))["data"]
        n += len(articles)
        found.update(
            {
                q["id"]: q["answers"][0]["text"]
                for a in articles
                for p in a["paragraphs"]
                for q in p["qas"]
            }
        )
    return n, found


def articles_of(doc_ids: Iterable[str]) -> set[int]:
    return {int(d.split("-")[0]) for d in doc_ids}


def prefix(doc_id: str) -> str:
    return doc_id.rsplit("-", 1)[0]


def test_the_split_rule_partitions_every_article_count() -> None:
    assert article_splits(48) == {"train": range(16), "dev": range(16, 24), "test": range(24, 48)}
    for n in range(200):
        parts = article_splits(n)
        assert [i for s in SPLITS for i in parts[s]] == list(range(n))
        assert abs(len(parts["train"]) - n / 3) <= 0.5 and abs(len(parts["dev"]) - n / 6) <= 1


@pytest.mark.parametrize(("source", "lang"), SPLIT_SETS)
def test_splits_are_disjoint_by_article_and_cover_every_article(source: str, lang: str) -> None:
    n, _ = answers(source, lang)
    per_split = {s: articles_of(corpus(source, lang, s)) for s in SPLITS}
    assert sum(len(a) for a in per_split.values()) == n
    assert set().union(*per_split.values()) == set(range(n))
    for split, indices in article_splits(n).items():
        assert per_split[split] == set(indices)


@pytest.mark.parametrize(("source", "lang"), [*SPLIT_SETS, ("cmrc2018", "zh"), ("arcd", "ar")])
def test_each_question_has_one_relevant_sentence_that_holds_its_answer(
    source: str, lang: str
) -> None:
    _, expected = answers(source, lang)
    seen: list[str] = []
    for split in SOURCES[source].splits:
        data, docs = loaded(source, lang, split), corpus(source, lang, split)
        assert set(data.queries) == set(data.qrels)
        for qid, judged in data.qrels.items():
            ((doc, grade),) = judged.items()
            assert grade == 1 and doc in docs
            # ARCD: 3 answers differ from their context by a doubled space (see
            # assets/sembridge_ray_assets/data/README.md)
            if source != "arcd":
                assert expected[qid].strip() in docs[doc], (qid, expected[qid], docs[doc])
        seen.extend(data.queries)
    assert sorted(seen) == sorted(expected)
    if source == "xquad":
        assert len(seen) == 1190


@pytest.mark.parametrize("split", SPLITS)
def test_xquad_languages_share_question_ids_and_paragraph_positions(split: str) -> None:
    ref = loaded("xquad", "en", split)
    for lang in XQUAD_LANGS[1:]:
        data = loaded("xquad", lang, split)
        assert set(data.queries) == set(ref.queries)
        assert {prefix(d) for d in corpus("xquad", lang, split)} == {
            prefix(d) for d in corpus("xquad", "en", split)
        }
        assert {q: prefix(next(iter(d))) for q, d in data.qrels.items()} == {
            q: prefix(next(iter(d))) for q, d in ref.qrels.items()
        }


def test_korquad_split_sizes_follow_the_proportions() -> None:
    sizes = {s: len(articles_of(corpus("korquad", "ko", s))) for s in SPLITS}
    assert sizes == {"train": 47, "dev": 23, "test": 70}  # 140 articles: a third, a sixth, the rest


@pytest.mark.parametrize(
    ("source", "lang", "questions"), [("cmrc2018", "zh", 4221), ("arcd", "ar", 693)]
)
def test_training_only_sources_give_train_and_refuse_dev_and_test(
    source: str, lang: str, questions: int
) -> None:
    loader = {"cmrc2018": load_cmrc2018, "arcd": load_arcd}[source]
    assert len(loader(lang, "train").queries) == questions
    for split in ("dev", "test"):
        one_line_error(functools.partial(loader, lang, split), source, "train", repr(split))


def test_sentences_split_as_the_rule_says() -> None:
    def sentences(text: str, keep: tuple[tuple[int, int], ...] = ()) -> list[str]:
        return [text[lo:hi].strip() for lo, hi in sentence_spans(text, keep)]

    assert sentences("Pi is 3.14 here. Yes! Really? U.S.A is big.") == [
        "Pi is 3.14 here.",
        "Yes!",
        "Really?",
        "U.S.A is big.",
    ]
    assert sentences("他来了。她走了！真的？好") == ["他来了。", "她走了！", "真的？", "好"]
    assert sentences("वह आया। वह गया।") == ["वह आया।", "वह गया।"]
    assert sentences("ماذا؟نعم") == ["ماذا؟", "نعم"]
    text = "It was named by John C. Messenger in 1900. Then more."
    start = text.index("John")
    assert sentences(text) == ["It was named by John C.", "Messenger in 1900.", "Then more."]
    assert sentences(text, ((start, start + len("John C. Messenger")),)) == [
        "It was named by John C. Messenger in 1900.",
        "Then more.",
    ]
    assert sentence_spans("  ") == [] and sentence_spans(" A. B") == [(0, 4), (4, 5)]


def write_xquad(root: Path, lang: str, n_articles: int, answer_start: int = 0) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    context = "First one. Second one。Third"
    qas = [
        {
            "id": "q",
            "question": "Which?",
            "answers": [{"text": "First", "answer_start": answer_start}],
        }
    ]
    data = [
        {"title": f"T{a}", "paragraphs": [{"context": context, "qas": [{**qas[0], "id": f"q{a}"}]}]}
        for a in range(n_articles)
    ]
    (root / f"xquad.{lang}.json").write_text(
        json.dumps({"version": "1.1", "data": data}), encoding="utf-8"
    )
    return root


def test_an_xquad_format_directory_gives_any_language(tmp_path: Path) -> None:
    root = write_xquad(tmp_path / "x", "de", 6)
    data = load_xquad("de", "dev", root)
    assert data.name == f"xquad:de@{root}" and data.queries == {"q2": "Which?"}
    assert data.qrels == {"q2": {"2-0-0": 1}}
    assert [t.to_pylist() for t in data.corpus.batches(2)] == [
        [{ID: "2-0-0", TEXT: "First one."}, {ID: "2-0-1", TEXT: "Second one。"}],
        [{ID: "2-0-2", TEXT: "Third"}],
    ]


def one_line_error(call: Callable[[], object], *needles: str) -> None:
    with pytest.raises(InputError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_missing_files_languages_and_bad_answers_are_one_line_errors(tmp_path: Path) -> None:
    one_line_error(lambda: load_xquad("de", "test"), "xquad", "'de'", "xquad.de.json")
    one_line_error(
        lambda: load_xquad("ar", "test", tmp_path / "absent"), "xquad", str(tmp_path / "absent")
    )
    one_line_error(
        lambda: load_xquad("ar", "test", tmp_path), str(tmp_path / "xquad.ar.json"), "not found"
    )
    one_line_error(lambda: load_xquad("../en", "test"), "not a language code")
    one_line_error(lambda: load_korquad("en", "test"), "korquad", "'en'", "ko")
    one_line_error(lambda: load_korquad("en", "test", tmp_path), "korquad", "'en'", "ko")
    one_line_error(lambda: load("squad2", "en", "test"), "squad2", "xquad, korquad, cmrc2018, arcd")
    one_line_error(
        lambda: load_korquad("ko", "test", tmp_path), str(tmp_path / "KorQuAD_v1.0_dev.json")
    )
    one_line_error(
        lambda: load_xquad("en", "validation"), "xquad", "train, dev, test", "validation"
    )
    root = write_xquad(tmp_path / "bad", "de", 3, answer_start=99)
    one_line_error(
        lambda: load_xquad("de", "train", root), "'q0'", "answer_start 99", "no sentence"
    )
    (root / "xquad.de.json").write_text('{"data": [{"title": "T"}]}', encoding="utf-8")
    one_line_error(lambda: load_xquad("de", "train", root), "xquad.de.json", "not SQuAD")
    (root / "xquad.de.json").write_text('{"data": [', encoding="utf-8")
    one_line_error(lambda: load_xquad("de", "train", root), "xquad.de.json:1:", "not JSON")


@pytest.mark.parametrize("lang", XQUAD_LANGS)
def test_xquad_train_gives_one_question_answer_sentence_pair_per_question(lang: str) -> None:
    data = loaded("xquad", lang, "train")
    table, stats = pairs_from_retrieval(data, batch=100)
    docs = corpus("xquad", lang, "train")
    expected = {(data.queries[q], docs[next(iter(d))]) for q, d in data.qrels.items()}
    assert stats.rows == table.num_rows == len(data.queries) == 426
    assert set(zip(table[QUERY].to_pylist(), table[POSITIVE].to_pylist(), strict=True)) == expected


def test_corpora_stream_as_bounded_arrow_batches() -> None:
    sizes = [t.num_rows for t in loaded("korquad", "ko", "test").corpus.batches(1000)]
    assert max(sizes) == 1000 and len(sizes) > 3
    assert all(t.schema == CORPUS_SCHEMA for t in loaded("xquad", "hi", "dev").corpus.batches(64))


def test_the_source_table_and_the_bundled_files_match_the_readme() -> None:
    assert {k: (s.licence, s.languages, s.splits, s.mirror) for k, s in SOURCES.items()} == {
        "xquad": ("CC BY-SA 4.0", None, SPLITS, True),
        "korquad": ("CC BY-ND 2.0 KR", ("ko",), SPLITS, True),
        "cmrc2018": ("CC BY-SA 4.0", ("zh",), ("train",), False),
        "arcd": ("MIT", ("ar",), ("train",), False),
    }
    assert [s.loader for s in SOURCES.values()] == [
        load_xquad,
        load_korquad,
        load_cmrc2018,
        load_arcd,
    ]
    assert source_file("xquad", "ar") == asset("data") / "xquad" / "xquad.ar.json"
    assert source_file("cmrc2018", "zh") == asset("data") / "cmrc2018"
    assert load("arcd", "ar", "train").queries == load_arcd("ar", "train").queries
    readme = (asset("data") / "README.md").read_text(encoding="utf-8")
    listed = dict(
        re.findall(
            r"\| `((?:xquad|korquad|cmrc2018|arcd)/[^`]+)` \| \d+ \| `([0-9a-f]{64})` \|", readme
        )
    )
    bundled = [p for s in SOURCES.values() for lang in s.bundled_languages for p in s.files(lang)]
    assert {str(p.relative_to(asset("data"))) for p in bundled} <= set(listed)
    for rel, digest in listed.items():
        assert hashlib.sha256((asset("data") / rel).read_bytes()).hexdigest() == digest, rel
    for notice in (
        "xquad/CC-BY-SA4.0.txt",
        "korquad/NOTICE.md",
        "cmrc2018/NOTICE.md",
        "arcd/LICENSE",
    ):
        assert (asset("data") / notice).is_file()
    # they ship in the assets' distribution, not in sembridge_ray's wheel
    project = tomllib.loads((REPO / "assets" / "pyproject.toml").read_text(encoding="utf-8"))
    assert "**/*" in project["tool"]["setuptools"]["package-data"]["sembridge_ray_assets"]
