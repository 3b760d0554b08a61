"""The ``reproduce`` job's contract: the SemBridge paper's grid (or its offline miniature): cells of
(model, language, method, α), each init → per dataset zero-shot evaluation → fine-tuning →
evaluation, cells as concurrent Ray tasks; ``results.csv``, ``results.md``, ``comparisons.csv`` and
``plots/``. With a development set (the demo's SICK trial split, or ``finetune.eval``) each
fine-tuning is scored on it as it trains and each source model once: ``results.csv``'s
``dev_final``, ``steps_to_95``, ``dev_auc`` and ``plots/convergence.png``.

    sembridge reproduce --preset paper --output /shared/outputs/paper --gpus-per-cell 1
    sembridge reproduce --preset paper --output ROOT --dry-run       # the plan and its GPU-hour estimate
    python -m jobs.reproduce --preset demo --output outputs/demo      # the offline miniature (2 CPUs, ~12 min)
    python -m jobs.reproduce --preset convergence --output outputs/convergence   # its dev curves, run to flatten
"""

from __future__ import annotations

import json
import logging
import math
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Literal, cast

from sembridge_ray import catalog
from sembridge_ray.embed_init.config import WeightingConfig
from sembridge_ray.embed_init.methods import METHOD_NAMES, METHODS, parse_alpha, split_variant
from sembridge_ray.languages import CODES, language
from sembridge_ray.recipes import FIGURES, OUTPUT, Flag, JobSpec, flags
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.runtime.config import Config, ConfigError, coerce, require
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import flatten
from sembridge_ray.runtime.plans import PlanResult, render_plan

BRIDGE, ALPHA = "@", "="
"""``METHOD[+pa][@BRIDGE][=ALPHA]``: a grid's ``methods`` entry with its own bridge, or its own α
(which replaces the ``alphas`` axis for that entry): ``sembridge=2``, ``sembridge@minilm``."""


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One ``methods`` entry, parsed."""

    method: str
    position_aware: bool = False
    bridge: str = ""
    alpha: str = ""
    """An ``=ALPHA`` (as ``alphas`` spells one: ``2``, ``softmax``); "" = the ``alphas`` axis."""


def parse_variant(entry: str) -> Variant:
    """``sembridge+pa@minilm=2`` -> Variant(sembridge, True, minilm, "2"); the method is checked by
    the caller."""
    rest, _, alpha = entry.partition(ALPHA)
    rest, _, bridge = rest.partition(BRIDGE)
    base, aware = split_variant(rest.strip())
    return Variant(method=base, position_aware=aware, bridge=bridge.strip(), alpha=alpha.strip())


def variant_problem(entry: str) -> str | None:
    """Why ``entry`` is not a valid ``methods`` entry, or None."""
    v = parse_variant(entry)
    if v.method not in METHODS:
        return f"unknown method {v.method!r}"
    uses_bridge = METHODS[v.method].uses_bridge
    if v.position_aware and not uses_bridge:
        return f"{entry!r}: '+pa' needs a method that uses the bridge"
    if v.position_aware and METHODS[v.method].recipe.get("position_aware"):
        return f"{entry!r}: the method is position-aware already"
    if v.bridge and not uses_bridge:
        return f"{entry!r}: '@BRIDGE' needs a method that uses the bridge"
    if v.alpha:
        if not METHODS[v.method].has_alpha:
            return f"{entry!r}: '=ALPHA' needs a method with an α"
        try:
            value = parse_alpha(v.alpha)
        except ValueError:
            return f"{entry!r}: {v.alpha!r} is not a number >= 1 or 'softmax'"
        if not (value >= 1 and value < float("inf")):
            return f"{entry!r}: {v.alpha!r} is not a finite number >= 1"
    return None


DATASETS = ("webfaq", "miracl", "sick", "xquad")
DEMO_LANGUAGE = "en-bpe"
"""The miniature's own target vocabulary: a byte-level BPE it trains on the bundled text."""
_ASSETS_OF_PRESET = {"paper": "hub", "demo": "bundled", "xling": "xling"}
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DemoSettings(Config):
    """The offline miniature: a MiniLM SPLADE source, a byte-level BPE target, SICK as retrieval
    (train pairs to fine-tune on, the trial split as the development set, test judgements to
    score)."""

    test_pairs: int = 800
    """SICK test pairs whose sentences form the retrieval set (queries A, documents B)."""
    target_vocab: int = 8000
    """Size of the cased byte-level BPE target vocabulary (trained on the bundled SICK + STS
    text)."""
    mlm_bias: float = -2.5
    """Constant decoder bias of the fresh MLM head (with 0, about 29.5k of its 30.5k dimensions fire
    on any input)."""
    source_steps: int = 30
    """InfoNCE + FLOPs steps that make the MiniLM SPLADE source a retriever."""
    source_batch: int = 32
    """Batch of the source's training."""
    source_lr: float = 5e-5
    """Learning rate of the source's training."""


@dataclass(frozen=True, kw_only=True)
class BM25Settings(Config):
    """BM25 over each language's target tokenizer, scored beside every model on the same queries,
    and each model's reciprocal-rank fusion with it (``sembridge_ray.retrieval.bm25``)."""

    enabled: bool = True
    """Run BM25 and the fusions (rows ``bm25`` and ``<method>+bm25`` of results.csv)."""
    k1: float = 0.9
    """BM25's term-frequency saturation (Anserini's default)."""
    b: float = 0.4
    """BM25's length normalisation (Anserini's default)."""
    rrf_k: int = 60
    """The rank constant of reciprocal-rank fusion (Cormack et al. 2009)."""

    def check(self) -> None:
        require(self.k1 >= 0, "k1", self.k1, "must be >= 0")
        require(0 <= self.b <= 1, "b", self.b, "must be in [0, 1]")
        require(self.rrf_k >= 1, "rrf_k", self.rrf_k, "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class ReproduceConfig(Config):
    """One cell per (model, language, method, α); per dataset: zero-shot eval, fine-tune, eval."""

    assets: Literal["hub", "bundled", "xling"] = "hub"
    """Where the cells' inputs come from: ``hub``, the hub's models, tokenizers and datasets (the
    paper); ``bundled``, the offline English miniature built from the package's own data
    (``DemoSettings``); ``xling``, the offline cross-lingual miniature: an English MiniLM SPLADE
    trained on XQuAD-en, bundled target tokenizers, XQuAD (KorQuAD for ko) as retrieval sets, the
    bundled multilingual bridge (docs/xling.md)."""
    output: str = ""
    """Root of the grid: one directory per cell and stage, the tables and the plots."""
    dry_run: bool = False
    """Print the plan (every cell, its hub ids, a GPU-hour estimate) and run nothing."""
    json: bool = False
    """With ``dry_run``: print the plan as JSON (every field) instead of the summary table."""
    figures: str = field(default="", metadata=FIGURES)
    """With ``dry_run``: a figures file (JSON throughputs, as the GPU check or ``jobs.bench_peers``
    write them: ``sembridge_ray.recipes.reproduce.figures``) the GPU-hour estimate divides by; empty = the
    built-in rough figures."""
    models: tuple[str, ...] = tuple(catalog.SOURCE_MODELS.values())
    """Source encoders: catalog keys, hub ids or directories (comma-separated)."""
    languages: tuple[str, ...] = CODES
    """Target languages (catalog codes, or any code with ``target_tokenizers``)."""
    datasets: tuple[str, ...] = field(default=("webfaq", "miracl"), metadata={"choices": DATASETS})
    """Datasets each cell is evaluated and fine-tuned on."""
    methods: tuple[str, ...] = field(default=METHOD_NAMES, metadata={"choices": METHOD_NAMES})
    """Initialisation methods (one cell each; sembridge once per α); a bridge method + ``+pa``
    (``sembridge+pa``) is its position-aware variant, a row of its own."""
    alphas: tuple[str, ...] = ("4",)
    """α values for sembridge cells; ``softmax`` = α 1 (the ablation is 2,3,4,softmax)."""
    seeds: int = 1
    """Seeds each cell runs (0 .. seeds - 1; with ``seed_methods``, only those entries' cells): each
    seed fine-tunes with its own pair order and dropout (``finetune.seed`` + seed), and a method
    whose init is random (``random``, ``random_blend``) initialises with its own rows
    (``init.seed`` + seed); a deterministic init is shared by every seed. Seed 0 writes where a
    cell always wrote, seed k under ``cells/<cell>/seed-k``."""
    seed_methods: tuple[str, ...] = field(default=(), metadata={"choices": METHOD_NAMES})
    """The ``methods`` entries that run ``seeds`` seeds, where the grid has them (the others run
    one); empty = every entry."""
    bm25: BM25Settings = field(default_factory=BM25Settings)
    max_concurrent: int = 0
    """Cells at once; 0 = the cluster's GPUs / gpus_per_cell (at least 1)."""
    gpus_per_cell: float = 1.0
    """GPUs each cell's stages ask for (a fraction shares a GPU between cells)."""
    miracl_mirror: str = ""
    """A local MIRACL mirror (``<lang>/topics…tsv``, ``qrels…tsv``, ``corpus/*.jsonl.gz``); empty =
    the hub."""
    xquad_dir: str = ""
    """With ``assets: xling``: a directory of XQuAD-format files ``xquad.<lang>.json`` read for
    every language instead of the bundled XQuAD and KorQuAD (any language the bridge covers, with
    its tokenizer in ``target_tokenizers``); empty = the bundled files."""
    target_tokenizers: tuple[str, ...] = ()
    """Per-language overrides of the catalog's target tokenizer, ``lang=HUB_ID_OR_PATH`` (e.g. a
    local mirror). With bundled assets: the tokenizer of each language but ``en-bpe`` (the bundled
    BPE), e.g. the settings preset's
    ``en-roberta=DIR/roberta-base,en-kobigbird=DIR/kobigbird-bert-base`` (with those in
    ``languages``)."""
    eval_split: str = "test"
    """Split evaluated (MIRACL's public judgements: ``test`` means ``dev`` there)."""
    init: InitConfig = field(default_factory=lambda: InitConfig(bridge_model=catalog.BRIDGE))
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    demo: DemoSettings = field(default_factory=DemoSettings)
    overwrite: bool = False
    """Redo the stages whose settings changed since they ran (otherwise the run is refused, listing
    them); finished stages with unchanged settings are still skipped."""

    PLANNED: ClassVar[tuple[str, ...]] = (
        "init.source_model",
        "init.target_tokenizer",
        "init.method",
        "init.weighting.alpha",
        "init.output",
        "init.overwrite",
        "init.grid",
        "init.query_length",
        "init.document_length",
        "finetune.query_length",
        "finetune.document_length",
        "finetune.model",
        "finetune.train",
        "finetune.output",
        "finetune.overwrite",
        "evaluate.model",
        "evaluate.dataset",
        "evaluate.split",
        "evaluate.output",
        "evaluate.cache_dir",
        "evaluate.overwrite",
    )
    """Stage keys the plan sets per cell and stage (from ``models``, ``languages``, ``methods``,
    ``alphas``, ``datasets``, ``eval_split``, ``output``, ``overwrite``; the written models' lengths
    from ``evaluate``'s): setting them here is refused, since it would change nothing."""
    # The stages' identities hold everything else (the sections' own NOT_IDENTITY keys aside); these
    # steer the run.
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "output",
        "dry_run",
        "json",
        "figures",
        "max_concurrent",
        "gpus_per_cell",
        "overwrite",
        "init.scores",  # a publishing setting the stages never read (they do not push)
        "finetune.scores",
        *PLANNED,
    )

    @classmethod
    def upgrade(cls, data: dict[str, object]) -> dict[str, object]:
        """The former key ``preset: paper | demo`` is ``assets: hub | bundled``. An ``init`` key set
        to something other than its default must agree with the recipe of every method of the grid
        that has one (refused here, before any cell is planned). At its default it sets the other
        methods' cells (``to_dict`` writes every key, so a default there cannot be told from one a
        user wrote)."""
        if "preset" in data:
            log.warning(
                "config key preset is now assets (paper = hub, demo = bundled); the old name goes soon"
            )
            old = str(data["preset"]).strip()
            data = {k: v for k, v in data.items() if k != "preset"} | {
                "assets": _ASSETS_OF_PRESET.get(old, old)
            }
        init = data.get("init")
        section = init.get("weighting") if isinstance(init, dict) else None
        # the recipes fix weighting options (init.alpha is init.weighting.alpha here)
        if isinstance(section, dict):
            defaults = WeightingConfig().to_dict()
            hints = typing.get_type_hints(WeightingConfig)
            changed = {
                k: v
                for k, v in section.items()
                if k in hints and coerce(v, hints[k], k) != defaults.get(k)
            }
            methods = coerce(data.get("methods", METHOD_NAMES), tuple[str, ...], "methods")
            bases = {split_variant(m)[0] for m in cast(tuple[str, ...], methods)}
            for name in bases & set(METHOD_NAMES):
                try:
                    InitConfig.upgrade({"weighting": changed, "method": name})
                except ConfigError as err:
                    raise ConfigError(f"init.{err} (method {name} is in methods)") from None
        return data

    @property
    def preset(self) -> str:
        """The former name of ``assets`` (``paper`` / ``demo``), for code written against it."""
        return next(p for p, a in _ASSETS_OF_PRESET.items() if a == self.assets)

    def check(self) -> None:
        for key in self.PLANNED:
            section, _, name = key.partition(".")
            part = getattr(self, section)
            value, default = flatten(part.to_dict())[name], flatten(type(part)().to_dict())[name]
            require(
                value == default,
                key,
                value,
                "is set per cell and stage by the grid; leave it unset",
            )
        for entry in self.methods:
            problem = variant_problem(entry)
            if problem is not None and problem.startswith("unknown method"):
                problem += f" (known: {', '.join(METHOD_NAMES)}; METHOD[+pa][@BRIDGE][=ALPHA])"
            require(problem is None, "methods", ",".join(self.methods), problem or "")
        for alpha in self.alphas:
            try:
                value = parse_alpha(alpha)
            except ValueError:
                value = math.nan
            ok = value >= 1 and math.isfinite(value)
            rule = "is not a finite number" if value >= 1 else "is not a number >= 1 or 'softmax'"
            require(ok, "alphas", ",".join(self.alphas), f"{alpha!r} {rule}")
        named = [("languages", lang) for lang in self.languages]
        named += [
            ("target_tokenizers", item.partition("=")[0].strip()) for item in self.target_tokenizers
        ]
        for key, lang in named:
            problem = catalog.path_name_problem(lang)
            require(problem is None, key, lang, problem or "")
        bad = [d for d in self.datasets if d not in DATASETS]
        require(
            not bad,
            "datasets",
            ",".join(self.datasets),
            f"unknown dataset {bad[:1]} (known: {', '.join(DATASETS)})",
        )
        require(
            self.max_concurrent >= 0,
            "max_concurrent",
            self.max_concurrent,
            "must be >= 0 (0 = by GPUs)",
        )
        require(self.gpus_per_cell >= 0, "gpus_per_cell", self.gpus_per_cell, "must be >= 0")
        require(self.seeds >= 1, "seeds", self.seeds, "must be >= 1")
        for entry in self.seed_methods:
            problem = variant_problem(entry)
            require(problem is None, "seed_methods", ",".join(self.seed_methods), problem or "")

    def seeds_of(self, entry: str) -> int:
        """How many seeds the cells of the ``methods`` entry ``entry`` run."""
        return self.seeds if not self.seed_methods or entry in self.seed_methods else 1

    def init_reads_seed(self, method: str) -> bool:
        """Whether an init of ``method`` with this grid's ``init`` section reads its seed (random
        rows)."""
        try:
            return replace(self.init, method=method).reads_seed  # type: ignore[arg-type]
        except ConfigError:  # a recipe that refuses the section: the cell's init says so
            return False

    def require_inputs(self) -> None:
        """Raise :class:`InputError` when the grid has no output root."""
        if not self.output:
            raise InputError("--output ROOT is required")

    def demo_tokenizers(self) -> dict[str, str]:
        """The miniature's target vocabularies besides the bundled ``en-bpe`` (``DEMO_LANGUAGE``,
        which it builds): ``target_tokenizers`` items LANG=DIR; a language named without one is
        refused."""
        named = self.named_tokenizers()
        missing = [lang for lang in self.languages if lang != DEMO_LANGUAGE and lang not in named]
        if missing:
            raise InputError(
                f"demo language {missing[0]!r}: name its tokenizer with target_tokenizers={missing[0]}=DIR"
            )
        return {lang: named[lang] for lang in self.languages if lang != DEMO_LANGUAGE}

    def xling_tokenizers(self) -> dict[str, str]:
        """The cross-lingual miniature's target tokenizer per language: ``target_tokenizers`` items
        LANG=DIR, else the bundled ``tok-<lang>`` (a ``languages`` row); another language
        without one is refused."""
        named = self.named_tokenizers()
        missing = [lang for lang in self.languages if lang not in named and lang not in CODES]
        if missing:
            raise InputError(
                f"language {missing[0]!r} has no bundled tokenizer ({', '.join(CODES)} have): name it with "
                f"target_tokenizers={missing[0]}=DIR (and its XQuAD-format file with xquad_dir=DIR)"
            )
        return {lang: named.get(lang) or f"tok-{lang}" for lang in self.languages}

    def named_tokenizers(self) -> dict[str, str]:
        """``target_tokenizers`` as {language: hub id or path}."""
        overrides = {}
        for item in self.target_tokenizers:
            lang, sep, name = item.partition("=")
            if not sep or not name.strip():
                raise InputError(f"target_tokenizers item {item!r}: expected lang=HUB_ID_OR_PATH")
            overrides[lang.strip()] = name.strip()
        return overrides

    def tokenizer_per_language(self) -> dict[str, str]:
        """The catalog's target tokenizer per language, unless ``target_tokenizers`` overrides
        it."""
        overrides = self.named_tokenizers()
        unknown = [lang for lang in self.languages if lang not in overrides and lang not in CODES]
        if unknown:
            raise InputError(
                f"language {unknown[0]!r} is not in the catalog ({', '.join(CODES)}); "
                "name its tokenizer with target_tokenizers=LANG=HUB_ID_OR_PATH"
            )
        return {
            lang: overrides.get(lang) or language(lang).hub_tokenizer for lang in self.languages
        }


@dataclass(frozen=True, kw_only=True)
class CellOutcome:
    """How one cell ended: ``ok``, or its error (and the traceback, written to
    ``cells/<cell>/error.txt``)."""

    cell: str
    ok: bool
    error: str = ""
    traceback: str = ""


@dataclass(frozen=True, kw_only=True)
class ReproduceResult:
    """What a reproduction run did: cells planned and run, failures, and where the tables are."""

    output: str
    cells: int
    ran: int
    failures: dict[str, str]
    """cell -> error."""
    plan: PlanResult | None = None
    """With ``dry_run``: the plan (nothing ran)."""

    @property
    def ok(self) -> bool:
        return not self.failures


FLAGS = flags(
    OUTPUT,
    "dry_run json figures",
    Flag(name="--model", key="models", aliases=("--models",)),
    "languages datasets methods alphas max_concurrent gpus_per_cell",
    Flag(
        key="init.resources.workers",
        also=("finetune.resources.workers", "evaluate.resources.workers"),
    ),
    Flag(
        key="init.resources.gpus_per_worker",
        also=("finetune.resources.gpus_per_worker", "evaluate.resources.gpus_per_worker"),
    ),
    Flag(key="evaluate.max_query_length", also=("finetune.max_query_length",)),
    Flag(key="evaluate.max_doc_length", also=("finetune.max_doc_length",)),
    Flag(
        key="init.trust_remote_code",
        also=("finetune.trust_remote_code", "evaluate.trust_remote_code"),
    ),
    "overwrite",
)


def report(result: ReproduceResult) -> str:
    if result.plan is not None:
        return render_plan(result.plan)
    results = Path(result.output, "results.md")
    summary = {"cells": result.cells, "ran": result.ran, "failures": result.failures}
    return f"{results.read_text(encoding='utf-8')}\n{json.dumps(summary, indent=2)}\nresults.md: {results}"


JOB = JobSpec(
    summary="the paper's grid (or --preset demo, its offline miniature)",
    config=ReproduceConfig,
    flags=FLAGS,
    dry_driver="sembridge_ray.recipes.reproduce.plan:dry_run_result",
    report=report,
    default_preset="paper",
)
