"""Cells of the reproduction grid and where each stage of a cell writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sembridge_ray import catalog
from sembridge_ray.embed_init.methods import METHODS, POSITION_AWARE, MethodName, parse_alpha
from sembridge_ray.recipes.reproduce.config import BRIDGE, parse_variant

if TYPE_CHECKING:
    from sembridge_ray.recipes.reproduce.config import ReproduceConfig

STAGES = ("zero_shot", "finetuned")
FUSED = "+bm25"
"""The suffix of a fusion with BM25: its stage directory (``zero_shot+bm25``) and its results
``method`` (``sembridge+bm25``)."""
BM25 = "bm25"


@dataclass(frozen=True, kw_only=True)
class Cell:
    model: str
    language: str
    method: MethodName
    alpha: float | None  # None for the baselines, which have no α
    position_aware: bool = False
    """The ``+pa`` variant: the init's position-aware bridging (docs/position-aware.md), not the
    released rule."""
    bridge: str = ""
    """The ``@BRIDGE`` variant: this cell's bridge model instead of the grid's ``init.bridge_model``
    (the wrong-bridge control, ``sembridge@minilm``); "" = the grid's."""
    seeds: int = field(default=1, compare=False)
    """Seeds the cell runs (0 .. seeds - 1): fine-tuning at each; the init too where it reads a seed
    (``init_seeded``), else one init and one zero-shot evaluation serve every seed."""
    init_seeded: bool = field(default=False, compare=False)
    """Whether the cell's init reads its seed (the random rows of ``random``, ``random_blend``)."""

    @property
    def variant(self) -> str:
        """The method as the grid's ``methods`` names it (without an ``=α``): ``sembridge``,
        ``sembridge+pa``, ``sembridge@minilm``, ``focus``, ..."""
        aware = POSITION_AWARE if self.position_aware else ""
        return self.method + aware + (f"{BRIDGE}{self.bridge}" if self.bridge else "")

    @property
    def name(self) -> str:
        variant = self.method + (POSITION_AWARE if self.position_aware else "")
        variant += f"{BRIDGE}{catalog.slug(self.bridge)}" if self.bridge else ""
        base = f"{catalog.slug(self.model)}__{self.language}__{variant}"
        return base if self.alpha is None else f"{base}__a{self.alpha:g}"

    @property
    def alpha_label(self) -> str:
        return "" if self.alpha is None else ("softmax" if self.alpha == 1 else f"{self.alpha:g}")


def expand(
    models: tuple[str, ...],
    languages: tuple[str, ...],
    methods: tuple[str, ...],
    alphas: tuple[str, ...],
    seeds: Callable[[str], int] = lambda entry: 1,
    init_seeded: Callable[[str], bool] = lambda method: False,
) -> list[Cell]:
    """Every (model, language, method, α) cell, in a deterministic order; baselines once, without α;
    an entry with its own ``=α`` once, at that α. ``seeds``: how many seeds a ``methods`` entry's
    cells run; ``init_seeded``: whether a method's init reads the seed."""
    cells: list[Cell] = []
    for model in models:
        for lang in languages:
            for entry in methods:
                v = parse_variant(entry)
                method = METHODS[v.method]
                # one cell per α (its own, or the axis'); the others once, without α
                for alpha in ((v.alpha,) if v.alpha else alphas) if method.has_alpha else ("",):
                    cells.append(
                        Cell(
                            model=model,
                            language=lang,
                            method=method.name,
                            alpha=parse_alpha(alpha) if alpha else None,
                            position_aware=v.position_aware,
                            bridge=v.bridge,
                            seeds=seeds(entry),
                            init_seeded=init_seeded(method.name),
                        )
                    )
    return cells


def config_cells(cfg: ReproduceConfig) -> list[Cell]:
    """The cells a ReproduceConfig describes."""
    return expand(
        cfg.models, cfg.languages, cfg.methods, cfg.alphas, cfg.seeds_of, cfg.init_reads_seed
    )


def _base(root: Path, seed: int) -> Path:
    """Seed 0 writes where a cell always wrote; seed k under ``seed-k``."""
    return root if seed == 0 else root / f"seed-{seed}"


@dataclass(frozen=True, kw_only=True)
class CellPaths:
    """Where one seed of a cell writes: its fine-tuning under its own seed's directory; its init
    and zero-shot evaluation under ``init_seed``'s (its own where the init reads the seed, else
    seed 0's, which every seed shares)."""

    root: Path
    seed: int = 0
    init_seed: int = 0

    @property
    def init(self) -> Path:
        return _base(self.root, self.init_seed) / "init"

    @property
    def model(self) -> Path:
        return self.init / "model"

    def eval(self, dataset: str, stage: str) -> Path:
        return (
            _base(self.root, self.init_seed if stage == STAGES[0] else self.seed) / dataset / stage
        )

    def fusion(self, dataset: str, stage: str) -> Path:
        """The fusion of the stage's run with BM25's."""
        return self.eval(dataset, stage).with_name(stage + FUSED)

    def finetune(self, dataset: str) -> Path:
        return _base(self.root, self.seed) / dataset / "finetune"


def cell_paths(output: Path, cell: Cell, seed: int = 0) -> CellPaths:
    return CellPaths(
        root=Path(output) / "cells" / cell.name,
        seed=seed,
        init_seed=seed if cell.init_seeded else 0,
    )


def bm25_path(output: Path, language: str, dataset: str, split: str) -> Path:
    """Where BM25 over ``language``'s target tokenizer is scored on ``dataset``'s ``split``."""
    return Path(output) / "baselines" / BM25 / language / dataset / split


def source_test_path(output: Path, model: str) -> Path:
    """Where the source model ``model`` is scored with its own tokenizer on the English test: the
    miniature's trained ``minilm-splade`` in ``assets/source-eval`` (as it always was), any other
    source under ``sources/``."""
    if model == "minilm-splade":
        return Path(output) / "assets" / "source-eval"
    return Path(output) / "sources" / catalog.slug(model) / "test"


def source_dev_path(output: Path, model: str) -> Path:
    """Where the source model ``model`` (as ``models`` names it) is scored on the development set,
    with its own tokenizer: the level the fine-tuned transfers' dev curves are drawn against."""
    return Path(output) / "sources" / catalog.slug(model) / "dev"
