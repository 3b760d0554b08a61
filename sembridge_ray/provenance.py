"""What a model this project made records about its inputs (``sembridge.json`` beside its card) and
how each input is named and licensed there (:mod:`sembridge_ray.model_card`
renders it).

**Names**: a bundled name, hub id or dataset spec as given, a local input by its last path component
(two for a directory named ``model``): never an absolute path of the machine.

**Licences**, by what each input is: a bundled name or catalogued hub id (``catalog.LICENCES``); a
dataset spec (``registry.licence``); a bundled asset materialised to a path, by the marker written
beside it when it was built (:func:`mark_asset`, checked against its content's identity); a model
this project made (the licences its own ``sembridge.json`` lists); an explicit ``license:`` in the
front matter of a local input's README (a directory's own, or the one beside a file). Anything else
is :data:`UNKNOWN`."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from sembridge_ray import catalog, languages
from sembridge_ray.catalog import KNOWN_ASSETS, KnownAsset
from sembridge_ray.runtime.atomic import atomic_write_json
from sembridge_ray.runtime.identity import path_identity

log = logging.getLogger(__name__)
PROVENANCE, README, ASSET_MARKER = "sembridge.json", "README.md", ".asset.json"
UNKNOWN = "unknown — check before publishing"


class InputLicence(TypedDict):
    """One input and its licence: ``role`` (``source model``, ``training data``, …), ``name``,
    ``licence`` (as its source states it), ``hub`` (the hub's licence id), ``found`` (where),
    ``hub_id`` (the input on the hub)."""

    role: str
    name: str
    licence: str
    hub: str
    found: str
    hub_id: NotRequired[str]


class Evaluation(TypedDict, total=False):
    """One evaluation of a model (from an evaluate output's ``metrics.json``); ``dataset_id``: the
    same data on the hub, where known."""

    dataset: str
    dataset_id: str
    split: str
    metrics: dict[str, float]
    queries: int
    documents: int
    run: str
    health: Health


class Health(TypedDict, total=False):
    """The health of a model's vectors on one evaluation: mean active dimensions of queries and
    documents, the shares of empty ones, and why it counts as collapsed ("" when it does not:
    ``sparse.convergence.query_collapse``)."""

    active_dims_query: float
    active_dims_doc: float
    empty_share_query: float
    empty_share_doc: float
    collapsed: str


class ExportParity(TypedDict, total=False):
    """One export of a model (from an export output's ``export_report.json``): its top-10 on a dataset's judged
    queries searched in the target and compared with the exact sparse search on the same vectors
    (``jobs.export --target``)."""

    target: str
    dataset: str
    split: str
    queries: int
    documents: int
    overlap10: float
    ndcg10_exact: float | None
    ndcg10_target: float | None
    passed: bool


class DevScores(TypedDict, total=False):
    """The development set's nDCG@10 in a fine-tuning run: before the first step and at the
    published step."""

    dataset: str
    dataset_id: str
    split: str
    zero_shot: float
    fine_tuned: float
    step: int


class InitFacts(TypedDict, total=False):
    """What the init job records (``recipes.init.config.card_facts``); ``base_model``: the hub id
    it is or was built from."""

    source_model: str
    target_tokenizer: str
    bridge_model: str
    language: str
    method: str
    alpha: float
    position_aware: bool
    kinds: dict[str, int]
    support_histogram: dict[str, int]
    base_model: str
    vocab_size: int
    query_length: int
    document_length: int
    licences: list[InputLicence]


class FinetuneFacts(TypedDict, total=False):
    """What the fine-tuning job adds (``final_model.card_provenance``); ``zero_shot``: the input
    model's scores, as a version that read them when fine-tuning ended recorded them (a card now
    takes them at publish time)."""

    model: str
    train: str
    steps: int
    batch_size: int
    lr: float
    ranking: str
    lambda_q: float
    lambda_d: float
    final_loss: float | None
    train_id: str
    eval: str
    select: str
    query_length: int
    document_length: int
    licences: list[InputLicence]
    zero_shot: list[Evaluation]
    dev: DevScores


class Provenance(TypedDict, total=False):
    """``sembridge.json``: one section per job that made the model."""

    init: InitFacts
    finetune: FinetuneFacts


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_provenance(model_dir: str | Path) -> Provenance:
    """The provenance of a model this project wrote ({} for any other model)."""
    data = _json(Path(model_dir) / PROVENANCE)
    return cast(Provenance, data) if isinstance(data, dict) else {}


def is_local(name: str) -> bool:
    """Whether ``name`` is a path on this machine (not a bundled name, hub id or dataset spec)."""
    return bool(name) and (
        name.startswith(("/", ".", "~")) or (":" not in name and Path(name).exists())
    )


def display_name(name: str) -> str:
    """``name`` as a card shows it (the module's docstring); a spec's local mirror by its last
    component."""
    if not is_local(name):
        kind, sep, rest = name.partition(":")
        lang, at, mirror = rest.partition("@")
        return f"{kind}:{lang}@<local mirror {Path(mirror).name}>" if sep and at else name
    parts = [p for p in Path(name).expanduser().parts if p not in ("/", "~", ".", "..")]
    return "/".join(parts[-2 if parts and parts[-1] == "model" else -1 :]) or "(unnamed)"


# ---- what an input declares: a bundled asset's marker, a README's front matter


def _marker(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ASSET_MARKER)


def mark_asset(path: Path, asset: str, what: str = "") -> None:
    """Record beside a freshly built bundled asset which one it is (a ``catalog.KNOWN_ASSETS`` key)
    and its content identity, so a card names its licence when a job is given its path. A marker
    that cannot be written is skipped."""
    record = {
        "asset": asset,
        "what": what or KNOWN_ASSETS[asset].what,
        "identity": path_identity(Path(path)),
    }
    try:
        atomic_write_json(_marker(path), record)
    except OSError as err:
        log.debug("no asset marker beside %s: %s", path, err)


def ensure_marked(path: Path, asset: str, what: str = "") -> None:
    """:func:`mark_asset` unless a marker is there already (an asset built before markers existed
    gets one)."""
    if Path(path).exists() and not _marker(path).is_file():
        mark_asset(path, asset, what)


def known_asset(named: str, resolved: str = "") -> KnownAsset | None:
    """The bundled asset an input is: by its name, or by the marker beside the path it was
    materialised to (its ``what`` as the marker says) if the content is still what was marked."""
    path = Path(resolved or named).expanduser()
    if named in KNOWN_ASSETS or not is_local(str(resolved or named)):
        return KNOWN_ASSETS.get(named)
    record = _json(_marker(path))
    if not isinstance(record, dict) or record.get("asset") not in KNOWN_ASSETS or not path.exists():
        return None
    if path_identity(path) != record.get("identity"):
        return None
    asset = KNOWN_ASSETS[record["asset"]]
    return asset._replace(what=str(record.get("what") or asset.what))


def declared(path: str | Path, key: str) -> tuple[str, str]:
    """(value, where) of ``key`` in the front matter of a local input's README (a directory's own,
    or the one beside a file); ("", "") when none declares it."""
    from huggingface_hub.repocard import metadata_load

    path = Path(path).expanduser()
    readme = (path if path.is_dir() else path.parent) / README
    where = f"its {README}" if path.is_dir() else "the README beside it"
    try:
        value = (metadata_load(readme) or {}).get(key) if readme.is_file() else None
    except Exception:  # front matter that is not YAML declares nothing
        value = None
    value = " and ".join(map(str, value)) if isinstance(value, list) else str(value or "").strip()
    return (value, where) if value else ("", "")


# ---- licences

_CC = re.compile(r"\bCC[- ]BY((?:-(?:NC|SA|ND))*)[- ](\d\.\d)\b", re.IGNORECASE)
_APACHE = re.compile(r"\s*apache[- ]?(licen[cs]e[, ]*)?(version )?2(\.0)?\b", re.IGNORECASE)


def hub_licence(text: str) -> str:
    """The hub's licence id for a licence as a source states it (``CC BY-NC-SA 3.0 (SICK 2014)`` ->
    ``cc-by-nc-sa-3.0``); ``other`` for several licences or one the hub has no id for, ``unknown``
    for none."""
    text = text.strip()
    if not text or text == UNKNOWN:
        return "unknown"
    if re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", text):  # a hub id already (a README's front matter)
        return text
    head = re.sub(r"\([^)]*\)", "", text)
    if re.search(r"\band\b|;", head):
        return "other"
    if match := _CC.search(head):
        return f"cc-by{match.group(1).lower()}-{match.group(2)}"
    return (
        "apache-2.0" if _APACHE.match(head) else "mit" if re.match(r"\s*MIT\b", head) else "other"
    )


def combined_licence(licences: Sequence[InputLicence]) -> tuple[str, str]:
    """(hub id, name) of a model made from inputs under ``licences``: the most restrictive;
    ``unknown`` when any is; ``other`` (named by the list) for one the hub has no id for or for two
    share-alike ones that differ."""
    ids = sorted({item["hub"] for item in licences})
    if not ids or "unknown" in ids:
        return "unknown", ""
    rank = {i: (int("-nc" in i), int("-sa" in i or "-nd" in i)) for i in ids}
    strictest = [i for i in ids if rank[i] == max(rank.values())]
    if "other" in ids or (len(strictest) > 1 and rank[strictest[0]][1]):
        terms = "; ".join(sorted({item["licence"] for item in licences}))
        return "other", f"the terms of its inputs ({terms})"
    return max(strictest, key=lambda i: ("apache" in i, i)), ""


def _licence(role: str, name: str, licence: str, found: str, hub_id: str = "") -> InputLicence:
    item = InputLicence(
        role=role, name=name, licence=licence or UNKNOWN, hub=hub_licence(licence), found=found
    )
    return InputLicence(**item, hub_id=hub_id) if hub_id else item


def input_licences(role: str, named: str, resolved: str = "") -> list[InputLicence]:
    """The licence entries of one input (``named`` as the user gave it, ``resolved`` the path a
    bundled name was materialised to): one entry, or, for a model this project made, those of its
    own inputs (roles prefixed)."""
    name, path = display_name(named), resolved or named
    if not named:
        return []
    if named in catalog.LICENCES:
        hub_id = KNOWN_ASSETS[named].hub_id if named in KNOWN_ASSETS else named
        return [_licence(role, name, catalog.LICENCES[named], "the project's catalog", hub_id)]
    if (specs := dataset_specs(named)) is not None:
        registry = "the project's dataset registry"
        return [
            _licence(role, display_name(spec), text, registry if text else "", hub)
            for spec, text, hub in specs
        ]
    if (known := known_asset(named, resolved)) is not None:
        return [_licence(role, name, known.licence, f"recognised as {known.what}", known.hub_id)]
    if not is_local(path):
        return [_licence(role, name, "", "", named if catalog.looks_like_hub(named) else "")]
    if prov := read_provenance(path):
        return under(role, all_licences(prov)) or [_licence(role, name, "", "")]
    return [_licence(role, name, *declared(path, "license"))]


def dataset_specs(named: str) -> list[tuple[str, str, str]] | None:
    """(spec, licence, hub id) of each part of a registry dataset spec (``xquad:ar+arcd:ar``); None
    for anything else (a path, a hub id, a bundled name)."""
    if ":" not in named or is_local(named):
        return None
    from sembridge_ray.data import registry  # it loads pyarrow: only where a card names a dataset

    parts = [(p, p.partition(":")[0]) for p in registry.parts(named)]
    if any(kind not in registry.SOURCES or is_local(p) for p, kind in parts):
        return None
    return [(p, registry.licence(p), registry.SOURCES[kind].hub_id) for p, kind in parts]


def under(role: str, licences: Sequence[InputLicence]) -> list[InputLicence]:
    """``licences`` of the inputs of an input (``role``), their roles prefixed with it."""
    return [InputLicence(**{**item, "role": f"{role} › {item['role']}"}) for item in licences]


def all_licences(prov: Mapping[str, object]) -> list[InputLicence]:
    """Every input licence a provenance records (the init's, then the fine-tuning's); one written
    before licences were recorded has them looked up by the names it holds."""
    init, tune = cast(Provenance, prov).get("init", {}), cast(Provenance, prov).get("finetune", {})
    if "licences" in init:
        found = list(init["licences"])
    else:
        found = [
            item
            for key in ("source_model", "target_tokenizer", "bridge_model")
            for item in input_licences(key.replace("_", " "), str(init.get(key, "")))
        ]
    if "licences" in tune:
        found += tune["licences"]
    elif tune:
        found += input_licences("training data", tune.get("train", ""))
    return found


# ---- what else a card says about an input


def base_model(named: str, resolved: str = "") -> str:
    """The hub id a source model is or was built from ("" when none is known)."""
    path = resolved or named
    if (known := known_asset(named, resolved)) is not None:
        return known.hub_id
    if not is_local(path):
        return named if catalog.looks_like_hub(named) else ""
    found = (
        read_provenance(path).get("init", {}).get("base_model") or declared(path, "base_model")[0]
    )
    return found if catalog.looks_like_hub(found) else ""


def language_of(named: str, resolved: str = "") -> str:
    """The language code of a target tokenizer: the catalog's, a bundled asset's, or its README's
    ("" if none)."""
    if code := languages.of_hub_tokenizer(named):
        return code
    if (known := known_asset(named, resolved)) is not None:
        return known.language
    path = resolved or named
    return declared(path, "language")[0].split(" and ")[0] if is_local(path) else ""


def dataset_ref(named: str, resolved: str = "") -> tuple[str, str]:
    """(name as the card shows it, hub id or "") of a dataset input."""
    name = display_name(named)
    if (known := known_asset(named, resolved)) is not None:
        return f"{name} ({known.what})", known.hub_id
    if (specs := dataset_specs(named)) is not None:
        return name, " + ".join(hub for _, _, hub in specs if hub)
    return name, named if catalog.looks_like_hub(named) else ""
