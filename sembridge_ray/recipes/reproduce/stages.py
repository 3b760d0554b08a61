"""The stages of a reproduction, planned before any of them runs: each stage's config, inputs and
identity.

A stage's inputs are identified without running anything upstream: a stage that reads another
stage's output refers to it as ``run:<job>:<fingerprint>`` of that stage's planned identity, which
is exactly what :func:`sembridge_ray.runtime.identity.path_identity` reports for the finished output. So the
driver can compare every stage of every cell with what is on disk before starting any work, and a
stage run later on its own (``jobs.evaluate`` on a cell's fine-tuned model) sees the same
identities."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from sembridge_ray import catalog
from sembridge_ray.embed_init.methods import method
from sembridge_ray.recipes.reproduce.baselines import BM25Config, FusionConfig
from sembridge_ray.recipes.reproduce.cells import (
    FUSED,
    STAGES,
    Cell,
    CellPaths,
    bm25_path,
    cell_paths,
    source_dev_path,
    source_test_path,
)
from sembridge_ray.recipes.reproduce.config import ReproduceConfig
from sembridge_ray.runtime.config import Config
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import RunIdentity
from sembridge_ray.runtime.placement import ResourceConfig


def cell_resources(cfg: ReproduceConfig, base: ResourceConfig, gpus: float) -> ResourceConfig:
    """A stage's resources inside a cell: on a GPU cluster, ``gpus_per_cell`` GPUs (whole GPUs as
    one worker each, a fraction as one worker with that share); without GPUs, the stage's configured
    resources."""
    if gpus <= 0 or cfg.gpus_per_cell <= 0:
        return base
    if cfg.gpus_per_cell < 1:
        return replace(base, workers=1, gpus_per_worker=cfg.gpus_per_cell)
    return replace(base, workers=math.floor(cfg.gpus_per_cell), gpus_per_worker=1.0)


Job = Literal["init", "finetune", "evaluate", "bm25", "fusion"]
MODEL = "model"  # where the init and finetune jobs put the SparseEncoder in their output


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One job run of a reproduction: ``cfg`` (its output included) and its inputs' identities."""

    name: str
    job: Job
    cfg: Config
    inputs: dict[str, str]

    @property
    def identity(self) -> RunIdentity:
        return self.cfg.identity(self.job, self.inputs)

    @property
    def output(self) -> Path:
        return Path(getattr(self.cfg, "output"))  # noqa: B009  (every stage config has one)

    @property
    def ref(self) -> str:
        """How a downstream stage identifies this stage's output."""
        return f"run:{self.job}:{self.identity.fingerprint}"


def require_under(root: Path, stage: Stage) -> None:
    """Refuse a stage whose output is not inside the grid's ``root`` (after ``..`` and links are
    resolved): values that become path components are checked where they are read, and this is the
    last word, so no setting can aim a stage at another grid's directory."""
    where = stage.output.resolve()
    if not where.is_relative_to(root.resolve()):
        raise InputError(
            f"stage {stage.name}: its output {stage.output} resolves to {where}, outside --output {root}"
        )


@dataclass(frozen=True, kw_only=True)
class DevSet:
    """The development set fine-tuning is scored on while it trains (``finetune.eval`` /
    ``eval_split``)."""

    spec: str
    split: str


@dataclass(frozen=True, kw_only=True)
class Assets:
    """Where a cell's inputs come from: model and tokenizer names or paths, (eval, train) dataset
    specs per (dataset, language), and the development set (None: fine-tuning is not scored while it
    trains): ``dev`` for every cell and the source models, ``devs`` per language where each language
    has its own."""

    models: dict[str, str]
    tokenizers: dict[str, str]
    specs: dict[tuple[str, str], tuple[str, str]]
    dev: DevSet | None = None
    devs: dict[str, DevSet] = field(default_factory=dict)
    bm25: dict[tuple[str, str], Stage] = field(default_factory=dict)
    """(language, dataset) -> the BM25 stage whose run every cell's evaluation there is fused
    with."""

    def dev_for(self, language: str) -> DevSet | None:
        return self.devs.get(language, self.dev)


Identify = Callable[[str, str], str]
"""(kind: "model" | "dataset", name or path) -> identity; raises InputError for a missing input."""


def cell_stages(
    cfg: ReproduceConfig, cell: Cell, assets: Assets, gpus: float, identify: Identify
) -> list[Stage]:
    """Per seed: init (its own only where the init reads the seed; else seed 0's serves), then per
    dataset zero-shot evaluation (with the init), fine-tuning (scored on ``assets.dev`` as it trains,
    when there is one), evaluation of the fine-tuned model; each evaluation fused with BM25's run
    (``assets.bm25``) where there is one."""
    stages: list[Stage] = []
    for seed in range(cell.seeds):
        paths = cell_paths(Path(cfg.output), cell, seed)
        s = _Seed(cfg=cfg, cell=cell, paths=paths, assets=assets, gpus=gpus, identify=identify)
        own_init = seed == 0 or cell.init_seeded
        init = s.init()
        stages += [init] if own_init else []
        model = f"{init.ref}/{MODEL}"
        for dataset in cfg.datasets:
            if own_init:
                zero = s.evaluation(dataset, STAGES[0], (str(paths.model), model))
                stages += [zero, *s.fusion(dataset, zero)]
            finetune = s.finetune(dataset, model)
            tuned_model = (f"{finetune.output}/{MODEL}", f"{finetune.ref}/{MODEL}")
            tuned = s.evaluation(dataset, STAGES[1], tuned_model)
            stages += [finetune, tuned, *s.fusion(dataset, tuned)]
    return stages


def _named(name: str, seed: int) -> str:
    """A stage's name within its cell: seed k's stages say which seed."""
    return name if seed == 0 else f"seed-{seed}/{name}"


@dataclass(frozen=True, kw_only=True)
class _Seed:
    """One seed of a cell: what each of its stages is built from."""

    cfg: ReproduceConfig
    cell: Cell
    paths: CellPaths
    assets: Assets
    gpus: float
    identify: Identify

    def evaluation(self, dataset: str, stage: str, model: tuple[str, str]) -> Stage:
        """The evaluation of ``model`` (its path, its stage ref) at ``stage`` on ``dataset``'s
        evaluated split."""
        paths, spec = self.paths, self.assets.specs[(dataset, self.cell.language)][0]
        name = _named(f"{dataset}/{stage}", paths.init_seed if stage == STAGES[0] else paths.seed)
        data = (spec, self.identify("dataset", spec))
        output = paths.eval(dataset, stage)
        return _evaluation(self.cfg, name, model, data, self.cfg.eval_split, output, self.gpus)

    def fusion(self, dataset: str, evaluated: Stage) -> list[Stage]:
        """The fusion of an evaluation's run with BM25's on the same queries (none without
        BM25)."""
        cfg = self.cfg
        bm25 = self.assets.bm25.get((self.cell.language, dataset))
        if bm25 is None:
            return []
        stage = evaluated.name.rpartition("/")[2]
        fused = FusionConfig(
            runs=(str(evaluated.output), str(bm25.output)),
            dataset=getattr(evaluated.cfg, "dataset"),  # noqa: B009  (an evaluate stage)
            split=cfg.eval_split,
            output=str(self.paths.fusion(dataset, stage)),
            k=cfg.bm25.rrf_k,
            top_k=cfg.evaluate.top_k,
            overwrite=cfg.overwrite,
        )
        inputs = {"model_run": evaluated.ref, "bm25_run": bm25.ref}
        return [Stage(name=evaluated.name + FUSED, job="fusion", cfg=fused, inputs=inputs)]

    def init(self) -> Stage:
        """The cell's init: its source model through its language's tokenizer, by its method."""
        cfg, cell, paths, identify = self.cfg, self.cell, self.paths, self.identify
        source, tokenizer = self.assets.models[cell.model], self.assets.tokenizers[cell.language]
        init_cfg = replace(
            cfg.init,
            source_model=source,
            target_tokenizer=tokenizer,
            bridge_model=cell.bridge or cfg.init.bridge_model,
            language=cfg.init.language or (cell.language if cfg.assets == "xling" else ""),
            method=cell.method,
            weighting=replace(
                cfg.init.weighting,
                position_aware=cell.position_aware or cfg.init.weighting.position_aware,
                alpha=cell.alpha if cell.alpha is not None else cfg.init.weighting.alpha,
            ),
            output=str(paths.init),
            seed=cfg.init.seed + paths.init_seed,
            overwrite=cfg.overwrite,
            resources=cell_resources(cfg, cfg.init.resources, self.gpus),
            query_length=cfg.evaluate.max_query_length,  # the written model encodes as it is scored
            document_length=cfg.evaluate.max_doc_length,
        )
        inputs = {
            "source_model": identify("model", source),
            "target_tokenizer": identify("model", tokenizer),
        }
        if method(cell.method).uses_bridge:
            inputs["bridge_model"] = identify("bridge", init_cfg.bridge_model)
        return Stage(name=_named("init", paths.init_seed), job="init", cfg=init_cfg, inputs=inputs)

    def finetune(self, dataset: str, model: str) -> Stage:
        """The cell's fine-tuning of its init ``model`` (a stage ref) on ``dataset``'s training
        spec, scored on its dev set if any."""
        cfg, paths, identify = self.cfg, self.paths, self.identify
        train_spec = self.assets.specs[(dataset, self.cell.language)][1]
        ft_cfg = replace(
            cfg.finetune,
            model=str(paths.model),
            train=train_spec,
            output=str(paths.finetune(dataset)),
            seed=cfg.finetune.seed + paths.seed,
            overwrite=cfg.overwrite,
            resources=cell_resources(cfg, cfg.finetune.resources, self.gpus),
            query_length=cfg.evaluate.max_query_length,  # the written model encodes as it is scored
            document_length=cfg.evaluate.max_doc_length,
        )
        ft_inputs = {"model": model, "train": identify("dataset", train_spec)}
        if (dev := self.assets.dev_for(self.cell.language)) is not None:
            ft_cfg = replace(ft_cfg, eval=dev.spec, eval_split=dev.split)
            ft_inputs["eval"] = identify("dataset", dev.spec)
        name = _named(f"{dataset}/finetune", paths.seed)
        return Stage(name=name, job="finetune", cfg=ft_cfg, inputs=ft_inputs)


def source_stages(
    cfg: ReproduceConfig, untrained: Path, pairs: str | Path, beir: str | Path, identify: Identify
) -> tuple[Stage, Stage]:
    """A miniature's source encoder: a brief fine-tuning of the untrained MiniLM SPLADE on ``pairs``
    (a training set spec), and its evaluation with its own tokenizer on ``beir`` (a dataset spec;
    the level a transfer would ideally recover)."""
    root = Path(cfg.output) / "assets"
    optim = replace(
        cfg.finetune.optim,
        max_steps=cfg.demo.source_steps,
        batch_size=cfg.demo.source_batch,
        lr=cfg.demo.source_lr,
    )
    ft_cfg = replace(
        cfg.finetune,
        model=str(untrained),
        train=str(pairs),
        output=str(root / "minilm-splade"),
        optim=optim,
        # the source's recipe is fixed (demo.source_*), its last step kept: it is scored on dev
        # once, by source_dev_stage
        eval="",
        select="last",
        # an ablation of the transfers' batches leaves the source as it is
        batch_sampler="no_duplicates",
        overwrite=cfg.overwrite,
        query_length=cfg.evaluate.max_query_length,  # the written model encodes as it is scored
        document_length=cfg.evaluate.max_doc_length,
    )
    inputs = {"model": identify("model", str(untrained)), "train": identify("dataset", str(pairs))}
    finetune = Stage(name="assets/source", job="finetune", cfg=ft_cfg, inputs=inputs)
    model = (f"{finetune.output}/{MODEL}", f"{finetune.ref}/{MODEL}")
    data = (str(beir), identify("dataset", str(beir)))
    name, output = "assets/source-eval", root / "source-eval"
    return finetune, _evaluation(cfg, name, model, data, cfg.eval_split, output)


def _evaluation(
    cfg: ReproduceConfig,
    name: str,
    model: tuple[str, str],
    data: tuple[str, str],
    split: str,
    output: Path,
    gpus: float = 0.0,
) -> Stage:
    """The evaluate stage ``name``: ``model`` on ``data``'s ``split`` (each as its path or spec, and
    its identity), written to ``output``."""
    ev_cfg = replace(
        cfg.evaluate,
        model=model[0],
        dataset=data[0],
        split=split,
        output=str(output),
        cache_dir=str(Path(cfg.output) / "cache" / "eval"),
        overwrite=cfg.overwrite,
        resources=cell_resources(cfg, cfg.evaluate.resources, gpus),
    )
    inputs = {"model": model[1], "dataset": data[1]}
    return Stage(name=name, job="evaluate", cfg=ev_cfg, inputs=inputs)


def source_dev_stage(
    cfg: ReproduceConfig, name: str, model: str, dev: DevSet, gpus: float, identify: Identify
) -> Stage:
    """The source model ``name`` (as ``models`` names it; at ``model``, a path, hub id or stage ref)
    scored once on the development set with its own tokenizer, under
    :func:`~sembridge_ray.recipes.reproduce.cells.source_dev_path`: the level the dev curves of its
    transfers are drawn against."""
    output = source_dev_path(Path(cfg.output), name)
    found, data = (model, identify("model", model)), (dev.spec, identify("dataset", dev.spec))
    return _evaluation(
        cfg, f"sources/{catalog.slug(name)}/dev", found, data, dev.split, output, gpus
    )


def bm25_stage(
    cfg: ReproduceConfig,
    language: str,
    dataset: str,
    tokenizer: str,
    spec: str,
    split: str,
    identify: Identify,
    max_queries: int = 0,
) -> Stage:
    """BM25 over ``language``'s target ``tokenizer`` on ``spec``'s ``split`` (``max_queries``: the
    development sample fine-tuning scores), under :func:`~sembridge_ray.recipes.reproduce.cells.bm25_path`."""
    bm25 = BM25Config(
        tokenizer=tokenizer,
        dataset=spec,
        split=split,
        output=str(bm25_path(Path(cfg.output), language, dataset, split)),
        k1=cfg.bm25.k1,
        b=cfg.bm25.b,
        top_k=cfg.evaluate.top_k,
        max_queries=max_queries,
        overwrite=cfg.overwrite,
    )
    inputs = {"tokenizer": identify("model", tokenizer), "dataset": identify("dataset", spec)}
    name = f"baselines/bm25/{language}/{dataset}/{split}"
    return Stage(name=name, job="bm25", cfg=bm25, inputs=inputs)


def source_test_stage(
    cfg: ReproduceConfig, name: str, model: str, spec: str, identify: Identify
) -> Stage:
    """The source model ``name`` (at ``model``, a path, bundled name or stage ref) scored with its
    own tokenizer on ``spec``'s test split: the level a transfer would ideally recover."""
    output = source_test_path(Path(cfg.output), name)
    found, data = (model, identify("model", model)), (spec, identify("dataset", spec))
    return _evaluation(
        cfg, f"sources/{catalog.slug(name)}/test", found, data, cfg.eval_split, output
    )
