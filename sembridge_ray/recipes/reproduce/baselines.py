"""The Ray-free runs of the baseline a user would keep, as stages of a reproduction: BM25 over a
tokenizer's pieces on one (dataset, split), and the reciprocal-rank fusion of two finished runs
(``sembridge_ray.retrieval.bm25`` holds the maths). Each writes ``run.trec``, ``per_query.tsv``,
``metrics.json``, ``identity.json`` and ``_SUCCESS`` last, under the output contract."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from sembridge_ray.retrieval.bm25 import RRF_K, bm25_run, pieces, rrf, write_scored
from sembridge_ray.retrieval.metrics import METRICS, RUN
from sembridge_ray.retrieval.store import read_run
from sembridge_ray.runtime.config import Config, require
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.outputs import claim_output, is_complete


@dataclass(frozen=True, kw_only=True)
class BM25Config(Config):
    """BM25 over a tokenizer's pieces on one (dataset, split)."""

    tokenizer: str = ""
    """The tokenizer whose pieces BM25 indexes: hub id, directory or a bundled name."""
    dataset: str = ""
    """A retrieval dataset spec (the evaluate job's forms)."""
    split: str = "test"
    output: str = ""
    k1: float = 0.9
    """Term-frequency saturation (Anserini's default)."""
    b: float = 0.4
    """Length normalisation (Anserini's default)."""
    top_k: int = 100
    """Documents retrieved per query."""
    max_queries: int = 0
    """Score the seeded sample of this many judged queries that fine-tuning's development scoring
    draws (``eval_max_queries``); 0 = every judged query."""
    overwrite: bool = False

    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("tokenizer", "dataset", "output", "overwrite")

    def check(self) -> None:
        require(self.k1 >= 0, "k1", self.k1, "must be >= 0")
        require(0 <= self.b <= 1, "b", self.b, "must be in [0, 1]")
        require(self.top_k >= 1, "top_k", self.top_k, "must be >= 1")
        require(self.max_queries >= 0, "max_queries", self.max_queries, "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class FusionConfig(Config):
    """The reciprocal-rank fusion of two finished runs (a model's and BM25's) on one (dataset,
    split)."""

    runs: tuple[str, ...] = ()
    """The directories of the finished runs fused (each with ``run.trec``)."""
    dataset: str = ""
    split: str = "test"
    output: str = ""
    k: int = RRF_K
    """RRF's rank constant."""
    top_k: int = 100
    """Documents kept per query."""
    overwrite: bool = False

    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("runs", "dataset", "output", "overwrite")

    def check(self) -> None:
        require(self.k >= 1, "k", self.k, "must be >= 1")
        require(self.top_k >= 1, "top_k", self.top_k, "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a BM25 or fusion run wrote (``metrics.json`` holds the figures)."""

    output: str
    metrics: dict[str, float]
    skipped: bool = False


def run_bm25(cfg: BM25Config, inputs: dict[str, str]) -> RunResult:
    """BM25 of ``cfg.tokenizer``'s pieces on ``cfg.dataset``'s split, into ``cfg.output``
    (``inputs``: the identities of the tokenizer and the dataset, as the caller planned them)."""
    from sembridge_ray.bundled import resolve
    from sembridge_ray.retrieval.dev import load_judged
    from sembridge_ray.sparse.model import load_tokenizer

    out = Path(cfg.output)
    with claim_output(out, cfg.identity("bm25", inputs), cfg.overwrite) as claim:
        if claim.done:
            return RunResult(output=str(out), metrics=_metrics(out), skipped=True)
        # the development sample is the one fine-tuning scores (the same seed and size)
        data = load_judged(cfg.dataset, cfg.split, cfg.max_queries)
        tokenizer = load_tokenizer(resolve(cfg.tokenizer))

        def side(role: str) -> tuple[list[str], list[list[str]]]:
            chunks = [c for c in data.chunks if c.role == role]
            return [i for c in chunks for i in c.ids], pieces(
                tokenizer, [t for c in chunks for t in c.texts]
            )

        run = bm25_run(*side("document"), *side("query"), cfg.k1, cfg.b, cfg.top_k)
        metrics = write_scored(claim.path, run, data.qrels, "bm25")
        claim.finish()
    return RunResult(output=str(out), metrics=metrics)


def run_fusion(cfg: FusionConfig, inputs: dict[str, str]) -> RunResult:
    """The RRF of the finished runs ``cfg.runs`` into ``cfg.output``, scored on the qrels of
    ``cfg.dataset``'s split (``inputs``: the runs' identities)."""
    from sembridge_ray.data.registry import load_retrieval

    out = Path(cfg.output)
    with claim_output(out, cfg.identity("fusion", inputs), cfg.overwrite) as claim:
        if claim.done:
            return RunResult(output=str(out), metrics=_metrics(out), skipped=True)
        if unfinished := [r for r in cfg.runs if not is_complete(Path(r))]:
            raise InputError(f"fusion of {unfinished[0]}: that run is not finished")
        data = load_retrieval(cfg.dataset, cfg.split)
        fused = rrf([read_run(Path(r) / RUN) for r in cfg.runs], cfg.k, cfg.top_k)
        metrics = write_scored(claim.path, fused, data.qrels, "rrf")
        claim.finish()
    return RunResult(output=str(out), metrics=metrics)


def _metrics(out: Path) -> dict[str, float]:
    return dict(json.loads((out / METRICS).read_text(encoding="utf-8")))
