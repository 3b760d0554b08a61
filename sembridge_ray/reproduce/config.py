"""ReproduceConfig: the paper grid (or its offline miniature) and the three jobs' settings, nested."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sembridge_ray import catalog
from sembridge_ray.config import Config, require
from sembridge_ray.embed_init.config import InitConfig
from sembridge_ray.embed_init.methods import METHOD_NAMES
from sembridge_ray.errors import InputError
from sembridge_ray.retrieval.config import EvaluateConfig
from sembridge_ray.sparse.config import FinetuneConfig

DATASETS = ("webfaq", "miracl", "sick")


@dataclass(frozen=True)
class DemoSettings(Config):
    """The offline miniature: a MiniLM SPLADE source, a byte-level BPE target, SICK as retrieval."""

    test_pairs: int = 800
    """SICK test pairs whose sentences form the retrieval set (queries A, documents B)."""
    target_vocab: int = 8000
    """Size of the cased byte-level BPE target vocabulary (trained on the bundled SICK + STS text)."""
    mlm_bias: float = -2.5
    """Constant decoder bias of the fresh MLM head (0 makes ~29.5k of 30.5k dimensions fire: FINDINGS.md)."""
    source_steps: int = 30
    source_batch: int = 32
    source_lr: float = 5e-5


@dataclass(frozen=True)
class ReproduceConfig(Config):
    """One cell per (model, language, method, α); per dataset: zero-shot eval, fine-tune, eval."""

    preset: Literal["paper", "demo"] = "paper"
    output: str = ""
    dry_run: bool = False
    models: tuple[str, ...] = tuple(catalog.SOURCE_MODELS.values())
    languages: tuple[str, ...] = tuple(catalog.LANGUAGES)
    datasets: tuple[str, ...] = ("webfaq", "miracl")
    methods: tuple[str, ...] = METHOD_NAMES
    alphas: tuple[str, ...] = ("4",)
    """α values for sembridge cells; ``softmax`` = α 1 (the ablation is 2,3,4,softmax)."""
    max_concurrent: int = 0
    """Cells at once; 0 = the cluster's GPUs / gpus_per_cell (at least 1)."""
    gpus_per_cell: float = 1.0
    miracl_mirror: str = ""
    """A local MIRACL mirror (``<lang>/topics…tsv``, ``qrels…tsv``, ``corpus/*.jsonl.gz``); empty = the hub."""
    target_tokenizers: tuple[str, ...] = ()
    """Per-language overrides of the catalog's target tokenizer, ``lang=HUB_ID_OR_PATH`` (e.g. a local mirror)."""
    eval_split: str = "test"
    init: InitConfig = field(default_factory=lambda: InitConfig(bridge_model=catalog.BRIDGE))
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    demo: DemoSettings = field(default_factory=DemoSettings)
    overwrite: bool = False
    """Redo the stages whose settings changed since they ran (otherwise the run is refused, listing them);
    finished stages with unchanged settings are still skipped."""

    def check(self) -> None:
        from sembridge_ray.reproduce.cells import parse_alpha

        unknown = [m for m in self.methods if m not in METHOD_NAMES]
        require(not unknown, "methods", ",".join(self.methods), f"unknown method {unknown[:1]} (known: "
                f"{', '.join(METHOD_NAMES)})")
        for alpha in self.alphas:
            try:
                value = parse_alpha(alpha)
            except ValueError:
                value = float("nan")
            require(value >= 1, "alphas", ",".join(self.alphas), f"{alpha!r} is not a number >= 1 or 'softmax'")
        bad = [d for d in self.datasets if d not in DATASETS]
        require(not bad, "datasets", ",".join(self.datasets), f"unknown dataset {bad[:1]} (known: {', '.join(DATASETS)})")
        require(self.max_concurrent >= 0, "max_concurrent", self.max_concurrent, "must be >= 0 (0 = by GPUs)")
        require(self.gpus_per_cell >= 0, "gpus_per_cell", self.gpus_per_cell, "must be >= 0")

    def tokenizer_per_language(self) -> dict[str, str]:
        """The catalog's target tokenizer per language, unless ``target_tokenizers`` overrides it."""
        overrides = {}
        for item in self.target_tokenizers:
            lang, sep, name = item.partition("=")
            if not sep or not name.strip():
                raise InputError(f"target_tokenizers item {item!r}: expected lang=HUB_ID_OR_PATH")
            overrides[lang.strip()] = name.strip()
        unknown = [lang for lang in self.languages if lang not in overrides and lang not in catalog.LANGUAGES]
        if unknown:
            raise InputError(f"language {unknown[0]!r} is not in the catalog ({', '.join(catalog.LANGUAGES)}); "
                             "name its tokenizer with target_tokenizers=LANG=HUB_ID_OR_PATH")
        return {lang: overrides.get(lang) or catalog.LANGUAGES[lang].tokenizer for lang in self.languages}
