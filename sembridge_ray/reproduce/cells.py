"""Cells of the reproduction grid and where each stage of a cell writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sembridge_ray import catalog
from sembridge_ray.embed_init.methods import METHODS, POSITION_AWARE, MethodName, parse_alpha
from sembridge_ray.jobs.reproduce import BRIDGE, parse_variant

if TYPE_CHECKING:
    from sembridge_ray.jobs.reproduce import ReproduceConfig

STAGES = ("zero_shot", "finetuned")


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
) -> list[Cell]:
    """Every (model, language, method, α) cell, in a deterministic order; baselines once, without α;
    an entry with its own ``=α`` once, at that α."""
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
                        )
                    )
    return cells


def config_cells(cfg: ReproduceConfig) -> list[Cell]:
    """The cells a ReproduceConfig describes."""
    return expand(cfg.models, cfg.languages, cfg.methods, cfg.alphas)


@dataclass(frozen=True)
class CellPaths:
    root: Path

    @property
    def init(self) -> Path:
        return self.root / "init"

    @property
    def model(self) -> Path:
        return self.init / "model"

    def eval(self, dataset: str, stage: str) -> Path:
        return self.root / dataset / stage

    def finetune(self, dataset: str) -> Path:
        return self.root / dataset / "finetune"


def cell_paths(output: Path, cell: Cell) -> CellPaths:
    return CellPaths(Path(output) / "cells" / cell.name)


def source_dev_path(output: Path, model: str) -> Path:
    """Where the source model ``model`` (as ``models`` names it) is scored on the development set,
    with its own tokenizer: the level the fine-tuned transfers' dev curves are drawn against."""
    return Path(output) / "sources" / catalog.slug(model) / "dev"
