"""The reproduction's grid, planned before anything runs, without Ray: the demo's assets and the
source models' development stages, every cell's stages with their configs and the identities of
their inputs (``Plan``). The driver (``sembridge_ray.recipes.reproduce.run``) checks it against the
disk and runs it; the dry run (``reproduce.plan``) reads each stage's settings from it to say which
stages a run would refuse."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sembridge_ray import bundled, catalog, languages
from sembridge_ray.data.registry import dataset_identity
from sembridge_ray.embed_init.bridge import check_bridge
from sembridge_ray.recipes.reproduce import cells as cellmod
from sembridge_ray.recipes.reproduce import demo
from sembridge_ray.recipes.reproduce.config import DEMO_LANGUAGE, ReproduceConfig
from sembridge_ray.recipes.reproduce.stages import (
    MODEL,
    Assets,
    DevSet,
    Stage,
    bm25_stage,
    cell_stages,
    require_under,
    source_dev_stage,
    source_stages,
    source_test_stage,
)
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import model_identity

log = logging.getLogger(__name__)
DEMO_MODEL, DEMO_DATASET = "minilm-splade", "sick"


@dataclass(kw_only=True)
class Plan:
    """Every stage to run, in order: the demo's asset stages first, then the source models'
    development scores, then the cells'; cells that could not be planned (a missing input) with
    their error."""

    assets: list[Stage] = field(default_factory=list)
    sources: list[Stage] = field(default_factory=list)
    baselines: list[Stage] = field(default_factory=list)
    """BM25 per language and dataset (and on each language's development set): the cells' fusions
    read their runs."""
    cells: dict[str, list[Stage]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def all_stages(self) -> list[tuple[str, Stage]]:
        named = [("assets", self.assets), ("sources", self.sources), ("baselines", self.baselines)]
        return [(n, s) for n, stages in [*named, *self.cells.items()] for s in stages]


def input_identity(kind: str, name: str) -> str:
    """The identity of one input of a stage (see :mod:`sembridge_ray.runtime.identity`; bundled names are
    resolved here, at the job's boundary); a missing one is an InputError."""
    identify = {"dataset": dataset_identity, "bridge": check_bridge}.get(kind, model_identity)
    return identify(bundled.resolve(name))


class Identities:
    """Input identities, computed once per (kind, name): a grid asks for the same models and
    datasets many times. ``known`` maps the paths of inputs that are themselves stages (the demo's
    source model) to their stage refs."""

    def __init__(self, compute: Callable[[str, str], str] = input_identity) -> None:
        self.known: dict[str, str] = {}
        self._computed = functools.cache(compute)

    def __call__(self, kind: str, name: str) -> str:
        return self.known[name] if name in self.known else self._computed(kind, name)


def paper_assets(cfg: ReproduceConfig) -> Assets:
    mirror = f"@{cfg.miracl_mirror}" if cfg.miracl_mirror else ""
    specs = {}
    for lang in cfg.languages:
        specs[("webfaq", lang)] = (f"webfaq:{lang}",) * 2
        specs[("miracl", lang)] = (f"miracl:{lang}{mirror}",) * 2
    models = {m: catalog.SOURCE_MODELS.get(m, m) for m in cfg.models}
    dev = (
        DevSet(spec=cfg.finetune.eval, split=cfg.finetune.eval_split) if cfg.finetune.eval else None
    )
    return Assets(models=models, tokenizers=cfg.tokenizer_per_language(), specs=specs, dev=dev)


def demo_files(cfg: ReproduceConfig, names: tuple[str, ...] | None = None) -> dict[str, Path]:
    """The miniature's deterministic inputs under ``<output>/assets`` (the retrieval set, training
    pairs, the target tokenizer and the untrained MiniLM SPLADE; ``names``: only those), built when
    missing, and rebuilt under ``--overwrite`` when built from other ``demo.*`` settings
    (:func:`~sembridge_ray.recipes.reproduce.demo.check_assets` refused it otherwise)."""
    root = Path(cfg.output) / "assets"
    demo.check_assets(root, cfg.demo, cfg.overwrite, names)
    return demo.build_assets(root, cfg.demo, names)


def bundled_assets(
    cfg: ReproduceConfig, files: dict[str, Path], identify: Identities, result: Plan
) -> Assets:
    """The English miniature's cells' inputs, and its source stages (in ``result.assets``): the
    untrained MiniLM SPLADE trained on the bundled pairs, scored on the SICK retrieval set."""
    source, source_eval = source_stages(
        cfg, files["untrained"], files["source_pairs"], files["beir"], identify
    )
    result.assets = [source, source_eval]
    source_model = f"{source.output}/{MODEL}"
    identify.known[source_model] = f"{source.ref}/{MODEL}"
    # en-bpe: the bundled BPE built above; any other "language" is another English target
    # vocabulary named in target_tokenizers (e.g. en-roberta=DIR): the same source and retrieval
    # set, another segmentation
    tokenizers = {DEMO_LANGUAGE: str(files["target"]), **cfg.demo_tokenizers()}
    return Assets(
        models={DEMO_MODEL: source_model},
        tokenizers=tokenizers,
        specs={
            (DEMO_DATASET, lang): (str(files["beir"]), str(files["sick_train"]))
            for lang in tokenizers
        },
        dev=DevSet(spec=cfg.finetune.eval or str(files["dev"]), split=cfg.finetune.eval_split),
    )


XLING_ASSETS = ("untrained",)
"""What the cross-lingual miniature builds under ``<output>/assets`` when ``minilm-splade`` is one of
its sources: the untrained MiniLM SPLADE (its retrieval sets and tokenizers are bundled, as is the
``splade-tiny`` source). That source trains on English XQuAD training articles alone: adding the
bundled SICK + STS pairs (60 steps instead of one 13-step epoch) scored the same on English
development articles (nDCG@10 0.797 vs 0.798) in 2.4 times the time (docs/xling.md)."""
XLING_SOURCE_LANGUAGE = "en"


def xling_asset_names(cfg: ReproduceConfig) -> tuple[str, ...]:
    """The assets the cross-lingual miniature builds: the untrained MiniLM SPLADE, when
    ``minilm-splade`` is a source."""
    return XLING_ASSETS if DEMO_MODEL in cfg.models else ()


def xling_specs(cfg: ReproduceConfig, lang: str) -> tuple[str, str]:
    """(retrieval set, training set) of one language of the cross-lingual miniature: XQuAD
    (``xquad_dir`` when given) or the row's own set (KorQuAD for Korean), and the row's extra
    training sets (CMRC 2018 for Chinese, ARCD for Arabic): ``sembridge_ray.languages``."""
    row = languages.find(lang)
    retrieval = row.retrieval if row else "xquad"
    xquad_file = bool(cfg.xquad_dir) and (Path(cfg.xquad_dir) / f"xquad.{lang}.json").is_file()
    if retrieval != "xquad" and not xquad_file:
        spec = f"{retrieval}:{lang}"
    else:
        spec = f"xquad:{lang}" + (f"@{cfg.xquad_dir}" if cfg.xquad_dir else "")
    extra = [f"+{source}:{lang}" for source in (row.extra_training if row else ())]
    return spec, spec + "".join(extra)


def xling_assets(
    cfg: ReproduceConfig, files: dict[str, Path], identify: Identities, result: Plan
) -> Assets:
    """The cross-lingual miniature's cells' inputs, and its source stages (in ``result.assets``):
    every source scored on English XQuAD test with its own tokenizer (the level a transfer would
    ideally recover) and BM25 beside it; ``minilm-splade`` is first trained on English XQuAD
    training articles (a bundled model such as ``splade-tiny`` is taken as it is)."""
    english = f"xquad:{XLING_SOURCE_LANGUAGE}"
    models = {}
    for name in cfg.models:
        if name == DEMO_MODEL:
            source, source_eval = source_stages(cfg, files["untrained"], english, english, identify)
            models[name] = f"{source.output}/{MODEL}"
            identify.known[models[name]] = f"{source.ref}/{MODEL}"
            result.assets += [source, source_eval]
        else:
            models[name] = name
            result.assets.append(source_test_stage(cfg, name, name, english, identify))
    if cfg.bm25.enabled:  # English BM25 over the first source's own tokenizer
        first = cfg.models[0]
        tokenizer = str(files["untrained"]) if first == DEMO_MODEL else first
        result.baselines.append(
            bm25_stage(
                cfg, XLING_SOURCE_LANGUAGE, "xquad", tokenizer, english, cfg.eval_split, identify
            )
        )
    tokenizers = cfg.xling_tokenizers()
    specs = {("xquad", lang): xling_specs(cfg, lang) for lang in tokenizers}
    if cfg.finetune.eval:  # the user's development set, for every cell and the source
        dev, devs = DevSet(spec=cfg.finetune.eval, split=cfg.finetune.eval_split), {}
    else:  # each language's own development articles, English's for the source
        split = cfg.finetune.eval_split
        dev = DevSet(spec=english, split=split)
        devs = {lang: DevSet(spec=specs[("xquad", lang)][0], split=split) for lang in tokenizers}
    return Assets(models=models, tokenizers=tokenizers, specs=specs, dev=dev, devs=devs)


def require_xling_inputs(cfg: ReproduceConfig) -> None:
    """Refuse, before any work, a cross-lingual grid whose language lacks its XQuAD-format file or
    whose target tokenizer does not load (one :class:`InputError` naming it): a cell without them
    could not run, and the grid would have scored its sources first for nothing."""
    from sembridge_ray.sparse.model import load_tokenizer

    named = cfg.named_tokenizers()
    for lang, tokenizer in cfg.xling_tokenizers().items():
        spec = xling_specs(cfg, lang)[0]
        try:
            dataset_identity(spec)
        except InputError as err:
            raise InputError(f"language {lang!r}: {err}") from None
        if lang in named:  # the bundled ones are built and checked where they are resolved
            load_tokenizer(bundled.resolve(tokenizer), cfg.init.trust_remote_code)


def bm25_stages(cfg: ReproduceConfig, assets: Assets, identify: Identities) -> list[Stage]:
    """BM25 over each language's target tokenizer on each dataset's evaluated split (recorded in
    ``assets.bm25`` for the cells' fusions) and on the language's development set (the sample
    fine-tuning scores): none when ``bm25.enabled`` is off."""
    if not cfg.bm25.enabled:
        return []
    stages = []
    for lang in cfg.languages:
        tokenizer = assets.tokenizers[lang]
        for dataset in cfg.datasets:
            spec = assets.specs[(dataset, lang)][0]
            stage = bm25_stage(cfg, lang, dataset, tokenizer, spec, cfg.eval_split, identify)
            assets.bm25[(lang, dataset)] = stage
            stages.append(stage)
        if (dev := assets.dev_for(lang)) is not None:
            max_queries = cfg.finetune.eval_max_queries
            stages.append(
                bm25_stage(cfg, lang, "dev", tokenizer, dev.spec, dev.split, identify, max_queries)
            )
    return stages


def plan(
    cfg: ReproduceConfig,
    gpus: float,
    files: dict[str, Path] | None = None,
    identify: Identities | None = None,
) -> Plan:
    """Every stage of every cell, with identities; no stage runs here. ``files`` (the demo's assets;
    built when not given) and ``identify`` (default: by content) let a test plan without building or
    reading anything."""
    result = Plan()
    identify = identify or Identities()
    if cfg.assets == "bundled":
        assets = bundled_assets(cfg, files or demo_files(cfg), identify, result)
    elif cfg.assets == "xling":
        files = files or demo_files(cfg, xling_asset_names(cfg))
        assets = xling_assets(cfg, files, identify, result)
    else:
        assets = paper_assets(cfg)
    result.sources = source_dev_stages(cfg, assets, gpus, identify)
    try:
        result.baselines += bm25_stages(cfg, assets, identify)
    except InputError as err:  # a tokenizer or dataset that is missing: its cells say so too
        log.error("BM25 cannot run: %s", err)
    for cell in cellmod.config_cells(cfg):
        try:
            result.cells[cell.name] = cell_stages(cfg, cell, assets, gpus, identify)
        except InputError as err:
            log.error("cell %s cannot run: %s", cell.name, err)
            result.failures[cell.name] = f"{type(err).__name__}: {err}"
    for _, stage in result.all_stages():
        require_under(Path(cfg.output), stage)
    return result


def source_dev_stages(
    cfg: ReproduceConfig, assets: Assets, gpus: float, identify: Identities
) -> list[Stage]:
    """Each source model scored on the development set (none without one); a model that cannot be
    identified is left out here: its cells record the error."""
    if assets.dev is None:
        return []
    stages = []
    for name, model in assets.models.items():
        try:
            stages.append(source_dev_stage(cfg, name, model, assets.dev, gpus, identify))
        except InputError as err:
            log.warning("source %s is not scored on the development set: %s", name, err)
    return stages
