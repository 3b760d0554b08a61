"""Retrieval sets from SQuAD v1.1-format reading-comprehension files: XQuAD, KorQuAD 1.0, CMRC 2018,
ARCD.

The rules, the same for every source:

- A query is a question; its id is the question's ``id`` (XQuAD uses the same ids in every
  language).
- The documents are the sentences of the paragraphs of the split's articles, with ids
  ``<article>-<paragraph>-<sentence>`` (indices from 0; the article index counts across a source's
  files in the order :data:`SOURCES` lists them). The article-paragraph prefix is the same in every
  XQuAD language; the sentence count may differ. Titles are not used.
- Sentences (:func:`sentence_spans`): a sentence ends after ``.`` ``!`` ``?`` followed by
  whitespace, and after ``।`` ``。`` ``！`` ``？`` ``؟`` (no whitespace needed), except inside a
  question's answer. The spans partition the paragraph, so every ``answer_start`` inside it falls in
  exactly one sentence.
- The one relevant document of a question (grade 1) is the sentence holding its first answer's
  ``answer_start``; a start outside its paragraph is an :class:`InputError` naming the question.
- Splits by article index (:func:`article_splits`): ``train`` the first third, ``dev`` the next
  sixth, ``test`` the rest; CMRC 2018 and ARCD are training data only, with every article in
  ``train``.

KorQuAD 1.0 is CC BY-ND 2.0 KR (no derivatives): its file ships unmodified and is converted here, in
memory only."""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from sembridge_ray.data.retrieval import CORPUS_SCHEMA, Corpus, Qrels, RetrievalData
from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.languages import bundled_in
from sembridge_ray.resources import asset
from sembridge_ray.runtime.errors import InputError

SPLITS = ("train", "dev", "test")
# A boundary: whitespace after . ! ? (so "3.14" and "U.S.A" stay whole), or right after a CJK,
# Devanagari or Arabic sentence end. The whitespace joins the sentence before it.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[।。！？؟])\s*")
LANG_CODE = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]+)*")


@dataclass(frozen=True, kw_only=True)
class Question:
    """A question and its first answer's character span in the paragraph (``end`` from the answer
    text's length)."""

    qid: str
    text: str
    start: int
    end: int


@dataclass(frozen=True, kw_only=True)
class Paragraph:
    context: str
    questions: tuple[Question, ...]


Article = tuple[Paragraph, ...]


def _read_json(path: Path) -> Any:
    """A JSON file (UTF-8, an optional BOM); a missing file, bad UTF-8 or bad JSON is one line
    naming the file."""
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise InputError(f"{path}: file not found") from None
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x})") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}:{err.colno}: not JSON ({err.msg})") from None


def _question(qa: Any, where: str) -> Question:
    qid, text, answers = str(qa["id"]), qa["question"], qa["answers"]
    if not answers:
        raise InputError(
            f"{where}: question {qid!r} has no answer (SQuAD 2.0 unanswerable questions are not read)"
        )
    start, answer = answers[0]["answer_start"], answers[0]["text"]
    if not isinstance(text, str) or not isinstance(answer, str) or type(start) is not int:
        raise InputError(
            f"{where}: question {qid!r}: 'question', 'text' or 'answer_start' has the wrong type"
        )
    return Question(qid=qid, text=text, start=start, end=start + len(answer))


def read_squad(path: Path) -> list[Article]:
    """The articles of a SQuAD v1.1 JSON file (``data[].paragraphs[].{context, qas[]}``), in file
    order; a field that is missing or of the wrong type is an :class:`InputError` naming the article
    and paragraph."""
    data = _read_json(path)
    articles: list[Article] = []
    try:
        for a, article in enumerate(data["data"]):
            paragraphs = []
            for p, par in enumerate(article["paragraphs"]):
                where = f"{path}: article {a}, paragraph {p}"
                if not isinstance(par["context"], str):
                    raise InputError(f"{where}: 'context' is not text")
                questions = tuple(_question(qa, where) for qa in par["qas"])
                paragraphs.append(Paragraph(context=par["context"], questions=questions))
            articles.append(tuple(paragraphs))
    except (KeyError, TypeError, IndexError) as err:
        raise InputError(f"{path}: not SQuAD v1.1 JSON ({type(err).__name__}: {err})") from None
    return articles


def sentence_spans(
    context: str, keep_whole: Iterable[tuple[int, int]] = ()
) -> list[tuple[int, int]]:
    """Sentence spans ``[start, end)`` that partition ``context`` (empty for blank text), each one's
    whitespace kept at its end. No boundary falls strictly inside a ``keep_whole`` span: the answers
    of a paragraph's questions, so that the relevant sentence holds the whole answer (initials as in
    "John C. Messenger" and answers of two sentences would otherwise be cut; 2-17 of XQuAD's 1,190
    questions per language)."""
    if not context.strip():
        return []
    keep = list(keep_whole)
    cuts = [
        m.end()
        for m in SENTENCE_END.finditer(context)
        if m.end() < len(context) and not any(lo < m.end() < hi for lo, hi in keep)
    ]
    edges = [0, *sorted(set(cuts)), len(context)]
    return list(itertools.pairwise(edges))


def article_splits(n: int) -> dict[str, range]:
    """Article indices per split for a file of ``n`` articles: ``train`` the first third, ``dev``
    the next sixth, ``test`` the rest (half), the two boundaries n/3 and n/2 rounded half up to
    whole articles: ``(n + 1) // 3`` and ``(n + 1) // 2``. XQuAD (48): 0-15, 16-23, 24-47. KorQuAD
    1.0 dev (140): 0-46, 47-69, 70-139."""
    first, second = (n + 1) // 3, (n + 1) // 2
    return {"train": range(first), "dev": range(first, second), "test": range(second, n)}


def squad_retrieval(
    name: str, split: str, articles: Sequence[Article], indices: range
) -> RetrievalData:
    """The retrieval set of the articles at ``indices`` (see the module docstring for the rules)."""
    queries: dict[str, str] = {}
    qrels: Qrels = {}
    ids: list[str] = []
    texts: list[str] = []
    for a in indices:
        for p, par in enumerate(articles[a]):
            spans = sentence_spans(par.context, ((q.start, q.end) for q in par.questions))
            ids.extend(f"{a}-{p}-{s}" for s in range(len(spans)))
            texts.extend(par.context[lo:hi].strip() for lo, hi in spans)
            starts = [lo for lo, _ in spans]
            for q in par.questions:
                s = bisect.bisect_right(starts, q.start) - 1
                if not 0 <= q.start < len(par.context) or s < 0:
                    raise InputError(
                        f"{name}: question {q.qid!r}: answer_start {q.start} falls in no sentence of "
                        f"article {a}, paragraph {p} ({len(par.context)} characters)"
                    )
                if q.qid in queries:
                    raise InputError(f"{name}: question id {q.qid!r} appears twice")
                queries[q.qid] = q.text
                qrels[q.qid] = {f"{a}-{p}-{s}": 1}

    def batches(n: int) -> Iterator[pa.Table]:
        step = max(1, n)
        for i in range(0, len(ids), step):
            yield pa.table({ID: ids[i : i + step], TEXT: texts[i : i + step]}, schema=CORPUS_SCHEMA)

    return RetrievalData(
        name=name,
        split=split,
        queries=queries,
        qrels=qrels,
        corpus=Corpus(f"{name}/{split}", batches),
    )


SquadLoader = Callable[[str, str, Path | None], RetrievalData]


@dataclass(frozen=True, kw_only=True)
class SquadSource:
    """A SQuAD-format source, as the dataset registry reads it."""

    name: str
    loader: SquadLoader
    licence: str
    languages: tuple[str, ...] | None
    """The languages it reads from a directory; None: any (an XQuAD-format
    ``<dir>/xquad.<lang>.json``)."""
    bundled_languages: tuple[str, ...]
    bundled: str
    """The bundled directory, an asset name (``data/<source>``: :func:`sembridge_ray.resources.asset`;
    its README and licence notice beside the files)."""
    file_names: Callable[[str], tuple[str, ...]]
    """The files read for a language, in order, under ``bundled`` or the directory given."""
    split_rule: Callable[[int], dict[str, range]]
    mirror: bool
    """Whether the registry's spec takes ``@DIR`` (every loader here reads a directory given as
    ``root``)."""

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.split_rule(0))

    def files(self, lang: str, root: Path | None = None) -> list[Path]:
        """The files for ``lang``: bundled, or under ``root``; a missing one is one line naming what
        was sought."""
        if not LANG_CODE.fullmatch(lang):
            raise InputError(f"{self.name}: {lang!r} is not a language code")
        if self.languages is not None and lang not in self.languages:
            raise InputError(
                f"{self.name}: no language {lang!r} (it has: {', '.join(self.languages)})"
            )
        if root is None:
            if lang not in self.bundled_languages:
                raise InputError(
                    f"{self.name}: no bundled {lang!r} file (bundled: {', '.join(self.bundled_languages)}; a "
                    f"directory holding {', '.join(self.file_names(lang))} can be given)"
                )
            return [asset(self.bundled) / f for f in self.file_names(lang)]
        if not Path(root).is_dir():
            raise InputError(f"{self.name}: directory {root} not found")
        paths = [Path(root) / f for f in self.file_names(lang)]
        if missing := [str(path) for path in paths if not path.is_file()]:
            raise InputError(f"{self.name}: {', '.join(missing)} not found")
        return paths


def source_files(name: str, lang: str, root: Path | None = None) -> list[Path]:
    """The files a source reads for ``lang``, bundled or under ``root`` (see
    :meth:`SquadSource.files`)."""
    return _source(name).files(lang, root)


def source_file(name: str, lang: str, root: Path | None = None) -> Path:
    """The one path whose contents identify what a source reads: its file, or the directory holding
    its files where it reads several (CMRC 2018: dev + trial)."""
    files = source_files(name, lang, root)
    return files[0] if len(files) == 1 else files[0].parent


def _source(name: str) -> SquadSource:
    if name not in SOURCES:
        raise InputError(f"no SQuAD-format source {name!r} (known: {', '.join(SOURCES)})")
    return SOURCES[name]


def load(name: str, lang: str, split: str, root: Path | None = None) -> RetrievalData:
    """One split of a source's retrieval set; a split it lacks is one line naming the source and its
    splits."""
    source = _source(name)
    if split not in source.splits:
        raise InputError(
            f"{source.name} has only the split(s) {', '.join(source.splits)}, not {split!r}"
        )
    articles = [article for path in source.files(lang, root) for article in read_squad(path)]
    indices = source.split_rule(len(articles))[split]
    spec = f"{name}:{lang}" + (f"@{root}" if root is not None else "")
    if not indices:
        raise InputError(
            f"{spec}: split {split!r} has no articles (the file(s) hold {len(articles)})"
        )
    return squad_retrieval(spec, split, articles, indices)


def load_xquad(lang: str, split: str, root: Path | None = None) -> RetrievalData:
    """XQuAD ``xquad.<lang>.json``: bundled for en, ar, zh, hi, ru; any language from a directory.
    Split by article."""
    return load("xquad", lang, split, root)


def load_korquad(lang: str, split: str, root: Path | None = None) -> RetrievalData:
    """KorQuAD 1.0 dev (ko), ``KorQuAD_v1.0_dev.json``: 140 articles split by article."""
    return load("korquad", lang, split, root)


def load_cmrc2018(lang: str, split: str, root: Path | None = None) -> RetrievalData:
    """CMRC 2018 (zh), ``cmrc2018_dev.json`` then ``cmrc2018_trial.json``: training data only."""
    return load("cmrc2018", lang, split, root)


def load_arcd(lang: str, split: str, root: Path | None = None) -> RetrievalData:
    """ARCD (ar), ``arcd-train.json`` (its published training split): training data only."""
    return load("arcd", lang, split, root)


def _bundled(
    name: str,
    loader: SquadLoader,
    licence: str,
    file_names: Callable[[str], tuple[str, ...]],
    *,
    training: bool = False,
) -> SquadSource:
    """Source ``name``, bundled under ``data/<name>`` for the languages whose :mod:`languages` rows
    list it, the languages it reads; ``training``: training data only (every article in
    ``train``), with no ``@DIR``."""
    here = bundled_in(name)
    return SquadSource(
        name=name,
        loader=loader,
        licence=licence,
        languages=here,
        bundled_languages=here,
        bundled=f"data/{name}",
        file_names=file_names,
        split_rule=(lambda n: {"train": range(n)}) if training else article_splits,
        mirror=not training,
    )


SOURCES: Mapping[str, SquadSource] = {
    source.name: source
    for source in (
        replace(
            _bundled("xquad", load_xquad, "CC BY-SA 4.0", lambda lang: (f"xquad.{lang}.json",)),
            languages=None,
            bundled_languages=("en", *bundled_in("xquad")),
        ),
        _bundled(
            "korquad", load_korquad, "CC BY-ND 2.0 KR", lambda lang: ("KorQuAD_v1.0_dev.json",)
        ),
        _bundled(
            "cmrc2018",
            load_cmrc2018,
            "CC BY-SA 4.0",
            lambda lang: ("cmrc2018_dev.json", "cmrc2018_trial.json"),
            training=True,
        ),
        _bundled("arcd", load_arcd, "MIT", lambda lang: ("arcd-train.json",), training=True),
    )
}
"""Source name -> its loader, licence, languages and bundled files: read by the dataset registry
(specs ``xquad:<lang>[@DIR]``, ``korquad:ko[@DIR]``, ``cmrc2018:zh``, ``arcd:ar``), with
:func:`load` and :func:`source_file`."""
