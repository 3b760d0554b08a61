"""Publishing a model this project made: the card pushed to the hub is rendered at publish time
(:func:`publish`) from the model's provenance and the scores of the finished evaluate and export
outputs the user names (``--scores``). No job writes into another's finished output: an
evaluation's scores stay in its ``metrics.json``, an export's parity in its ``export_report.json``,
and each names the model it scored by identity, so scores are shown on no other model's card."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sembridge_ray.bundled import resolve
from sembridge_ray.export.report import REPORT, ExportReport
from sembridge_ray.json_types import JSONObject
from sembridge_ray.model_card import CARD, SHOWN_METRICS, key_of, render
from sembridge_ray.provenance import Evaluation, ExportParity, Health, dataset_ref, read_provenance
from sembridge_ray.retrieval.metrics import METRICS
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import RunIdentity, path_identity
from sembridge_ray.runtime.manifest import is_complete
from sembridge_ray.runtime.outputs import atomic_write_json, read_identity
from sembridge_ray.sparse.convergence import query_collapse

SCORED = {"evaluate": METRICS, "export": REPORT}
"""The file of each job's output that holds its scores."""
PUSHED = "pushed.json"
"""Beside a finished output's manifest (not in it): every push of its model, newest last."""


@dataclass(frozen=True, kw_only=True)
class Scores:
    """What a published card shows beyond the provenance: the model's evaluations, those of the
    model it was fine-tuned from (the zero-shot column) and its exports' parities."""

    own: list[Evaluation]
    before: list[Evaluation]
    exports: list[ExportParity]


def _scored_output(named: str) -> tuple[str, str, str, JSONObject]:
    """(job, run fingerprint, identity of the model it scored, its scores file) of a finished
    evaluate or export output."""
    out = Path(named).expanduser()
    identity = read_identity(out)
    if identity is None or identity.job not in SCORED or not is_complete(out):
        raise InputError(f"--scores {named!r} is not a finished evaluate or export output")
    if "model" not in identity.inputs:
        raise InputError(
            f"--scores {named!r} exported a checkpoint (its model is in that output), not a published model"
        )
    found = json.loads((out / SCORED[identity.job]).read_text(encoding="utf-8"))
    return identity.job, identity.fingerprint, identity.inputs["model"], found


def scores_of(model_id: str, started_from: str, outputs: Sequence[str]) -> Scores:
    """The scores of ``outputs`` (finished evaluate and export outputs) sorted by the model each
    scored: the model of identity ``model_id``, or for an evaluation the model a fine-tuning run
    ``started_from`` (its identity; "" for none). One that scored another model is refused in one
    line naming both; of two on the same dataset and split (and target), the one named last is
    kept."""
    own: dict[tuple[str, ...], Evaluation] = {}
    before: dict[tuple[str, ...], Evaluation] = {}
    exports: dict[tuple[str, ...], ExportParity] = {}
    for named in outputs:
        job, run, scored, found = _scored_output(named)
        if job == "export" and scored == model_id:
            parity = export_parity(cast(ExportReport, found))
            exports[key_of(parity)] = parity
        elif job == "evaluate" and scored in (model_id, started_from):
            dataset = str(found["dataset"])
            item = evaluation(
                dataset, resolve(dataset), str(found["split"]), found, f"run:evaluate:{run}"
            )
            (own if scored == model_id else before)[key_of(item)] = item
        else:
            also = f" nor the model it was fine-tuned from ({started_from})" if started_from else ""
            raise InputError(
                f"--scores {named!r} scored another model ({scored}), not this one ({model_id}){also}"
            )
    return Scores(own=[*own.values()], before=[*before.values()], exports=[*exports.values()])


def started_from(identity: RunIdentity | None) -> str:
    """The identity of the model a fine-tuning run started from ("" for any other run)."""
    return identity.inputs.get("model", "") if identity and identity.job == "finetune" else ""


def check_scores(identity: RunIdentity, model: str, outputs: Sequence[str]) -> None:
    """Refuse, before the run, a ``--scores`` output that is not a finished evaluate or export
    output, or that scored neither the model this run writes (``<output>/<model>``, named by the
    run's identity) nor, for a fine-tuning, its input model: one line each."""
    scores_of(f"run:{identity.job}:{identity.fingerprint}/{model}", started_from(identity), outputs)


def publish(out: Path, model: str, repo_id: str, scores: Sequence[str] = ()) -> str:
    """Push the model ``out/model`` of a finished output with its card rendered again with
    ``scores`` (:func:`scores_of`), and record the push in ``out/pushed.json`` (repository, URL,
    the run's fingerprint, the scores' outputs, time); returns the URL. Nothing else of the output
    is written to: the card is rendered into a directory of links to the model's files."""
    from sembridge_ray.sparse import model as sparse_model

    out, identity = Path(out), read_identity(Path(out))
    found = scores_of(path_identity(out / model), started_from(identity), scores)
    card = render(read_provenance(out / model), found.own, found.exports, found.before)
    with tempfile.TemporaryDirectory(prefix="sembridge-publish-") as name:
        linked = Path(name)  # links to the model's files, and the card as its README
        for path in (out / model).rglob("*"):
            if path.is_file() and (rel := path.relative_to(out / model)) != Path(CARD):
                (linked / rel).parent.mkdir(parents=True, exist_ok=True)
                (linked / rel).symlink_to(path.resolve())
        (linked / CARD).write_text(card, encoding="utf-8")
        url = sparse_model.push_model(linked, repo_id)
    try:
        pushes = json.loads((out / PUSHED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pushes = []
    run = identity.fingerprint if identity else ""
    push = {"repo_id": repo_id, "url": url, "run": run, "scores": list(scores), "at": time.time()}
    atomic_write_json(out / PUSHED, [*pushes, push])
    return url


# ---- what a card keeps of a job's scores


def evaluation(
    dataset: str, resolved: str, split: str, metrics: Mapping[str, Any], run: str = ""
) -> Evaluation:
    """An :class:`Evaluation` from an evaluate job's ``metrics.json`` (``dataset`` as the user named
    it)."""
    name, hub_id = dataset_ref(dataset, resolved)
    shown = {k: round(float(metrics[k]), 4) for k in SHOWN_METRICS if k in metrics}
    found = Evaluation(dataset=name, split=split, metrics=shown)
    if hub_id:
        found["dataset_id"] = hub_id
    if "num_queries" in metrics and "num_docs" in metrics:
        found["queries"], found["documents"] = int(metrics["num_queries"]), int(metrics["num_docs"])
    if run:
        found["run"] = run
    if "mean_active_dims_query" in metrics and "mean_active_dims_doc" in metrics:
        dims_q = float(metrics["mean_active_dims_query"])
        found["health"] = Health(
            active_dims_query=round(dims_q, 1),
            active_dims_doc=round(float(metrics["mean_active_dims_doc"]), 1),
            empty_share_query=round(float(metrics.get("empty_share_query", 0.0)), 4),
            empty_share_doc=round(float(metrics.get("empty_share_doc", 0.0)), 4),
            collapsed=query_collapse(dims_q) or "",
        )
    return found


def export_parity(report: ExportReport) -> ExportParity:
    """What a card keeps of an export's ``export_report.json``."""
    return ExportParity(
        target=report["target"],
        dataset=report["dataset"],
        split=report["split"],
        queries=report["queries"],
        documents=report["documents"],
        overlap10=report["overlap@10"],
        ndcg10_exact=report["ndcg@10_exact"],
        ndcg10_target=report["ndcg@10_target"],
        passed=report["passed"],
    )
