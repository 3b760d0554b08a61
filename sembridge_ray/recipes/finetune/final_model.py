"""A fine-tuning run's published model: the final checkpoint's weights (``select=last``) or the best
evaluated ones (``select=best``) written as a SparseEncoder directory with its model card, the one
writer of ``<output>/model`` and of an exported checkpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from sembridge_ray.bundled import resolve
from sembridge_ray.model_card import dev_scores, write_card
from sembridge_ray.provenance import (
    FinetuneFacts,
    Provenance,
    base_model,
    dataset_ref,
    display_name,
    input_licences,
    language_of,
    read_provenance,
    under,
)
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.runtime.atomic import atomic_new_path
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import is_local
from sembridge_ray.runtime.outputs import atomic_path, atomic_write_text
from sembridge_ray.sparse import loop
from sembridge_ray.sparse.checkpoints import (
    TRAIN_METRICS,
    BestState,
    checkpoint_name,
    checkpoint_problem,
    load_best,
    load_part,
)
from sembridge_ray.sparse.convergence import Convergence, read_evaluations
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import (
    Serving,
    SpladeEncoder,
    load_mlm,
    read_pooling,
    save_sparse_encoder,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MODEL_DIR = "model"


@dataclass(frozen=True, kw_only=True)
class Exported:
    """What :func:`export_checkpoint` published, read from the final checkpoint's metrics."""

    final: dict[str, float]
    best: dict[str, object] = field(default_factory=dict)
    collapsed: list[dict[str, object]] = field(default_factory=list)
    convergence: Convergence | dict[str, object] = field(default_factory=dict)
    eval_seconds: float = 0.0


def serving(cfg: FinetuneConfig) -> Serving:
    """What the written model encodes with (its lengths and the input model's pooling)."""
    return Serving(
        query_length=cfg.query_length,
        document_length=cfg.document_length,
        pooling=read_pooling(cfg.model),
    )


def export_checkpoint(
    checkpoint: Path | None,
    cfg: FinetuneConfig,
    out: Path,
    total_steps: int,
    run_dir: str,
    named: FinetuneConfig | None = None,
) -> Exported:
    """Write the final checkpoint's model (``select=last``) or the best evaluated weights it carries
    (``select=best``) into ``out/model`` as a SparseEncoder directory, and its metrics.jsonl; the
    final checkpoint must verify (on a path) and the weights be finite, or nothing is written."""
    state, history, kept = _final_checkpoint(checkpoint, total_steps, run_dir)
    mlm, tokenizer = load_mlm(cfg.model, cfg.trust_remote_code)
    exported = Exported(**read_evaluations(history, int(mlm.config.vocab_size), cfg.select))
    weights = state["model"]  # select=last; select=best: the best kept, which the metrics name
    if cfg.select == "best":
        if kept is None or not exported.best:
            raise InputError(
                f"select=best: every evaluation on {cfg.eval!r} collapsed ({len(exported.collapsed)} steps), so "
                "there is no model to publish; see metrics.jsonl"
            )
        if kept["step"] != exported.best["step"]:
            raise RuntimeError(
                f"the best weights kept are of step {kept['step']}, the metrics say {exported.best}"
            )
        weights = kept["model"]
    require_finite(
        weights, f"the {'best' if cfg.select == 'best' else 'final'} weights of {run_dir}"
    )
    published = int(cast(int, exported.best["step"])) if cfg.select == "best" else total_steps
    card = card_provenance(named or cfg, total_steps, exported.final, history, published)
    write_model(out / MODEL_DIR, weights, mlm, tokenizer, cfg, card)
    atomic_write_text(out / TRAIN_METRICS, "".join(json.dumps(m) + "\n" for m in history))
    return exported


def _final_checkpoint(
    checkpoint: Path | None, total_steps: int, run_dir: str
) -> tuple[loop.TrainState, list[dict[str, float]], BestState | None]:
    """(rank 0's state, the metrics, the best weights kept) of the run's final checkpoint: on a
    path, the one of step ``total_steps``, which must verify; on object storage, the one Ray Train
    reported."""
    if is_local(run_dir):
        checkpoint = Path(run_dir) / checkpoint_name(total_steps)
        if (problem := checkpoint_problem(checkpoint)) is not None:
            raise RuntimeError(f"the final checkpoint {checkpoint} does not verify ({problem})")
    elif checkpoint is None:
        raise RuntimeError("the training run reported no checkpoint")
    state, _, history = load_part(checkpoint, 0)
    kept = load_best(checkpoint)
    if state["step"] != total_steps:
        raise RuntimeError(
            f"the latest checkpoint is at step {state['step']}, not the last step {total_steps}"
        )
    return state, history, kept


def write_model(
    out: Path,
    weights: Mapping[str, torch.Tensor],
    mlm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: FinetuneConfig,
    provenance: Provenance,
    new: bool = False,
) -> None:
    """``weights`` (a SpladeEncoder state) as the SparseEncoder directory ``out`` (atomically), with
    its card: the one writer of the run's ``model/`` and of an exported checkpoint. ``new``: ``out``
    must not exist, also not when the directory is complete
    (:func:`~sembridge_ray.runtime.atomic.atomic_new_path`: an export never replaces one)."""
    encoder = SpladeEncoder(mlm)
    encoder.load_state_dict(weights)
    # the init job's layout: <output>/model
    with (atomic_new_path if new else atomic_path)(out) as tmp:
        save_sparse_encoder(encoder.mlm, tokenizer, tmp, serving(cfg))
        write_card(tmp, provenance)


def card_provenance(
    cfg: FinetuneConfig,
    steps: int,
    final: dict[str, float],
    history: Sequence[Mapping[str, float]] = (),
    published: int | None = None,
) -> Provenance:
    """The input model's provenance (its init, when this project wrote it) extended by this
    fine-tuning (``cfg`` with the inputs as the user named them): names without absolute paths, the
    licences of the training and development data, and the development set's nDCG@10 before the
    first step and at the ``published`` one (default: the last)."""
    model, train = resolve(cfg.model), resolve(cfg.train)
    prov = read_provenance(model)
    if "init" not in prov:  # a model this project did not make: what the card can say about it
        prov["init"] = {
            "source_model": display_name(cfg.model),
            "base_model": base_model(cfg.model, model),
            "language": language_of(cfg.model, model),
            "licences": input_licences("starting model", cfg.model, model),
        }
    licences = under("earlier fine-tuning", prov.get("finetune", {}).get("licences", []))
    licences += input_licences("training data", cfg.train, train)
    train_name, train_id = dataset_ref(cfg.train, train)
    facts: FinetuneFacts = {
        "model": display_name(cfg.model),
        "train": train_name,
        "steps": steps,
        "batch_size": cfg.optim.batch_size,
        "lr": cfg.optim.lr,
        "ranking": cfg.loss.ranking,
        "lambda_q": cfg.loss.lambda_q,
        "lambda_d": cfg.loss.lambda_d,
        "final_loss": round(final["loss"], 4) if "loss" in final else None,
        "select": cfg.select,
        "query_length": cfg.query_length,
        "document_length": cfg.document_length,
    }
    if train_id:
        facts["train_id"] = train_id
    if cfg.eval:  # its licences, name and nDCG@10 before the first step and at the published one
        dev = resolve(cfg.eval)
        licences += input_licences("development data", cfg.eval, dev)
        dev_ref = dataset_ref(cfg.eval, dev)
        facts["eval"] = dev_ref[0]
        step = steps if published is None else published
        if scores := dev_scores(history, step, dev_ref, cfg.eval_split):
            facts["dev"] = scores
    facts["licences"] = licences
    prov["finetune"] = facts
    return prov
