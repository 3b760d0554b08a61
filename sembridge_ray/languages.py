"""The target languages, one row each: every table of the package that names a language (the
paper's hub tokenizer, the bundled ``tok-<code>``, the cross-lingual miniature's datasets, WebFAQ's
config names, a model card's language, the dry run's sizes) reads it here.

Adding a language is one :class:`Language` row in :data:`LANGUAGES` and its resources (a tokenizer
folder under ``tokenizers/<code>/`` of the assets distribution (``assets/``), its SQuAD-format
files under its ``data/``).
The order of :data:`LANGUAGES` is the order of every output that lists them.

Target tokenizers: the SemBridge authors name only the Korean one (``monologg/kobigbird-bert-base``,
from their example). The others are our choices of widely used monolingual tokenizers, documented
here and in docs/sembridge.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sembridge_ray.runtime.errors import InputError

Recipe = Literal["wordpiece", "arabic-wordpiece", "unigram", "me5-trimmed"]


@dataclass(frozen=True, kw_only=True)
class BundledTokenizer:
    """A target-language tokenizer the package offers under the bundled name ``tok-<code>``."""

    what: str
    licence: str
    """As its source states it (what a model card shows)."""
    recipe: Recipe
    """How ``target_tokenizers`` builds it: ``wordpiece``, the bundled folder as it is;
    ``arabic-wordpiece``, the same with AraBERT's removal of diacritics in front; ``unigram``, the
    bundled ``tokenizer.json`` with XLM-R's roles; ``me5-trimmed``, the bridge's XLM-R vocabulary
    trimmed to the language's text."""
    hub_id: str = ""
    """The same vocabulary on the hub, where there is one."""


@dataclass(frozen=True)
class DatasetSize:
    """Rough size of one dataset in one language, for the dry run's compute estimate."""

    passages: int
    train_queries: int


@dataclass(frozen=True, kw_only=True)
class Language:
    """One target language of the transfer."""

    code: str
    """ISO 639-1: names the grid's directories and the dataset specs (``xquad:<code>``)."""
    iso639_3: str
    """Names WebFAQ's configs (``ara-corpus``, ...)."""
    name: str
    """In English, as a model card names it."""
    hub_tokenizer: str
    """The paper's target tokenizer on the hub."""
    why: str
    """Why that tokenizer."""
    bundled: BundledTokenizer
    retrieval: str = "xquad"
    """The bundled SQuAD-format set the cross-lingual miniature retrieves on (``data.squad``)."""
    extra_training: tuple[str, ...] = ()
    """Bundled training-only SQuAD-format sets the miniature also fine-tunes on."""
    sizes: Mapping[str, DatasetSize]
    """Per dataset (``miracl``, ``webfaq``). MIRACL: its README and the topics files. WebFAQ: ara
    from the dataset card; the others are order-of-magnitude placeholders of the same size."""


LANGUAGES: tuple[Language, ...] = (
    Language(
        code="ar",
        iso639_3="ara",
        name="Arabic",
        hub_tokenizer="aubmindlab/araelectra-base-discriminator",
        why="our choice: AraBERT family, 64k WordPiece, works on raw (unsegmented) text",
        bundled=BundledTokenizer(
            what="AraELECTRA's Arabic WordPiece (64,000), diacritics removed first as AraBERT does, bundled",
            licence="AraBERT licence (American University of Beirut; attribution, share-alike)",
            recipe="arabic-wordpiece",
            hub_id="aubmindlab/araelectra-base-discriminator",
        ),
        extra_training=("arcd",),
        sizes={"miracl": DatasetSize(2_061_414, 3_495), "webfaq": DatasetSize(142_664, 132_664)},
    ),
    Language(
        code="zh",
        iso639_3="zho",
        name="Chinese",
        hub_tokenizer="google-bert/bert-base-chinese",
        why="our choice: the standard Chinese BERT vocabulary",
        bundled=BundledTokenizer(
            what="bert-base-chinese's WordPiece (21,128), bundled",
            licence="Apache 2.0 (google-bert/bert-base-chinese)",
            recipe="wordpiece",
            hub_id="google-bert/bert-base-chinese",
        ),
        extra_training=("cmrc2018",),
        sizes={"miracl": DatasetSize(4_934_368, 1_312), "webfaq": DatasetSize(150_000, 130_000)},
    ),
    Language(
        code="hi",
        iso639_3="hin",
        name="Hindi",
        hub_tokenizer="l3cube-pune/hindi-bert-scratch",
        why="our choice: a Hindi BERT trained from scratch on monolingual Hindi",
        bundled=BundledTokenizer(
            what="iNLTK's Hindi SentencePiece Unigram (30,000) with SPLADE special tokens, bundled",
            licence="MIT (iNLTK Hindi vocabulary, goru001/nlp-for-hindi)",
            recipe="unigram",
        ),
        sizes={"miracl": DatasetSize(506_264, 1_169), "webfaq": DatasetSize(150_000, 130_000)},
    ),
    Language(
        code="ko",
        iso639_3="kor",
        name="Korean",
        hub_tokenizer="monologg/kobigbird-bert-base",
        why="the SemBridge authors' Korean example",
        bundled=BundledTokenizer(
            what="KoBigBird's Korean WordPiece (32,500), bundled",
            licence="Apache 2.0 (monologg/kobigbird-bert-base)",
            recipe="wordpiece",
            hub_id="monologg/kobigbird-bert-base",
        ),
        retrieval="korquad",
        sizes={"miracl": DatasetSize(1_486_752, 868), "webfaq": DatasetSize(150_000, 130_000)},
    ),
    Language(
        code="ru",
        iso639_3="rus",
        name="Russian",
        hub_tokenizer="DeepPavlov/rubert-base-cased",
        why="our choice: the widely used Russian BERT",
        bundled=BundledTokenizer(
            what="multilingual-e5-small's XLM-R Unigram trimmed to the pieces of Russian text (XQuAD-ru articles 0-23)",
            licence="MIT (XLM-R vocabulary of intfloat/multilingual-e5-small)",
            recipe="me5-trimmed",
            hub_id="intfloat/multilingual-e5-small",
        ),
        sizes={"miracl": DatasetSize(9_543_918, 4_683), "webfaq": DatasetSize(150_000, 130_000)},
    ),
)
"""The target languages, in the order every output lists them."""

CODES = tuple(row.code for row in LANGUAGES)
_BY_CODE = {row.code: row for row in LANGUAGES}

OTHER_ISO639_3 = {
    "en": "eng",
    "de": "deu",
    "fr": "fra",
    "es": "spa",
    "ja": "jpn",
    "fa": "fas",
    "it": "ita",
    "pt": "por",
    "tr": "tur",
}
"""ISO 639-1 -> 639-3 of the other languages WebFAQ's configs are named by."""
OTHER_NAMES = {"de": "German", "en": "English", "es": "Spanish", "fr": "French", "ja": "Japanese"}
"""English names of the other languages a model card names."""


def language(code: str) -> Language:
    """The row of ``code``; an :class:`InputError` naming the codes there are (each row carries a
    bundled target tokenizer, so none is bundled for ``code``)."""
    if (row := _BY_CODE.get(code)) is None:
        raise InputError(f"no bundled target tokenizer for {code!r} (have: {', '.join(CODES)})")
    return row


def find(code: str) -> Language | None:
    """The row of ``code``, or None."""
    return _BY_CODE.get(code)


def iso639_3(code: str) -> str:
    """ISO 639-3 of ``code`` as WebFAQ names its configs; any other code passes through
    unchanged."""
    return row.iso639_3 if (row := _BY_CODE.get(code)) else OTHER_ISO639_3.get(code, code)


def english_name(code: str) -> str:
    """``code``'s English name, or ``code`` itself when it has none here."""
    return row.name if (row := _BY_CODE.get(code)) else OTHER_NAMES.get(code, code)


def bundled_in(source: str) -> tuple[str, ...]:
    """The codes whose bundled files include the SQuAD-format ``source`` (retrieval or training),
    in row order."""
    return tuple(row.code for row in LANGUAGES if source in (row.retrieval, *row.extra_training))


def of_hub_tokenizer(tokenizer: str) -> str:
    """The code whose paper's target tokenizer is ``tokenizer`` ("" when none)."""
    return next((row.code for row in LANGUAGES if row.hub_tokenizer == tokenizer), "")


def dataset_size(dataset: str, code: str) -> DatasetSize:
    """Rough size of ``dataset`` in ``code`` (zeros when unknown)."""
    return (row.sizes if (row := _BY_CODE.get(code)) else {}).get(dataset, DatasetSize(0, 0))
