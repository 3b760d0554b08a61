"""The model card of every model the init and fine-tuning jobs write (``model/README.md``),
rendered from the provenance beside it (``sembridge.json``, :mod:`sembridge_ray.provenance`): on
disk with, for a fine-tuned model, its run's development-set scores; again at publish time
(:mod:`sembridge_ray.publish`) with the evaluations and exports named there (``--scores``) and, for
a fine-tuned model, the evaluations of the model it started from (its zero-shot column).

sentence-transformers' ``SparseEncoderModelCardData`` and the hub's ``ModelCard.from_template``
render the metadata (``library_name``, ``pipeline_tag``, ``tags``, ``base_model``, ``language``,
``license``: the most restrictive of the inputs', ``datasets``, ``model-index``) and the body; the
project adds the transfer's provenance, every input's licence, the scores table and the loss.
sentence-transformers keeps the card when it loads and pushes the model again."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from sembridge_ray import __version__, catalog, resources
from sembridge_ray.embed_init.config import ENTMAX_BRIDGES
from sembridge_ray.languages import english_name
from sembridge_ray.provenance import (
    PROVENANCE,
    UNKNOWN,
    DevScores,
    Evaluation,
    ExportParity,
    FinetuneFacts,
    InitFacts,
    InputLicence,
    Provenance,
    all_licences,
    combined_licence,
    is_local,
)
from sembridge_ray.sparse.config import RANKING_LABELS

log = logging.getLogger(__name__)
CARD = "README.md"
LICENCE_NAME = "terms-of-the-inputs"
"""``license_name`` of a card whose ``license`` is ``other`` (its ``license_link``: the card's
licence section)."""
TEMPLATE = Path(resources.__file__).resolve().parent / "model_card_template.md"
PRIMARY, SHOWN_METRICS = "nDCG@10", ("nDCG@10", "RR@10", "R@100")


def dev_scores(
    history: Sequence[Mapping[str, float]],
    step: int,
    dataset: tuple[str, str],
    split: str,
    key: str = "dev_nDCG@10",
) -> DevScores:
    """A fine-tuning run's development nDCG@10 before its first step and at the published ``step``
    ({} when it was not evaluated there)."""
    scored = {int(m["step"]): float(m[key]) for m in history if key in m and "step" in m}
    if step not in scored:
        return {}
    found = DevScores(dataset=dataset[0], split=split, fine_tuned=round(scored[step], 4), step=step)
    if dataset[1]:
        found["dataset_id"] = dataset[1]
    if 0 in scored and step != 0:
        found["zero_shot"] = round(scored[0], 4)
    return found


def _health_row(item: Evaluation) -> list[str] | None:
    """One row of the card's health table (None for an evaluation recorded without it)."""
    health = item.get("health")
    if not health:
        return None
    return [
        *key_of(item),
        f"{health.get('active_dims_query', 0):g} / {health.get('active_dims_doc', 0):g}",
        f"{health.get('empty_share_query', 0):.1%} / {health.get('empty_share_doc', 0):.1%}",
        f"**yes**: {health['collapsed']}" if health.get("collapsed") else "no",
    ]


METHODS = {
    "sembridge": "SemBridge",
    "sembridge_plus": "SemBridge+",
    "sembridge_x": "SemBridge-X (the project's cross-lingual recipe)",
    "focus": "FOCUS",
    "wechsel": "WECHSEL",
    "omp": "OMP (orthogonal matching pursuit over the shared tokens)",
    "fvt": "FVT",
    "mean": "mean-initialised",
    "random": "randomly initialised",
}


@lru_cache(maxsize=1)
def _card_data_class() -> type[Any]:
    """sentence-transformers' ``SparseEncoderModelCardData``, filled from a provenance instead of a
    loaded model (imported on first use: reading a provenance never loads sentence-transformers)."""
    from huggingface_hub.utils import yaml_dump
    from sentence_transformers.sparse_encoder.model_card import SparseEncoderModelCardData

    @dataclass(kw_only=True)
    class SemBridgeCardData(SparseEncoderModelCardData):
        sembridge: dict[str, Any] = field(default_factory=dict)
        facts: dict[str, Any] = field(default_factory=dict)
        model_index: list[dict[str, Any]] = field(default_factory=list)
        license_name: str | None = None

        def get_model_specific_metadata(self) -> dict[str, Any]:
            return dict(self.facts)

        def to_dict(self) -> dict[str, Any]:
            data: dict[str, Any] = super().to_dict()  # ST caches this very dict for to_yaml
            if self.model_index:
                data["model-index"] = self.model_index
                data["metrics"] = sorted(
                    {m["type"] for r in self.model_index[0]["results"] for m in r["metrics"]}
                )
            return data

        def to_yaml(self, line_break: Any = None, original_order: list[str] | None = None) -> str:
            text: str = super().to_yaml(line_break=line_break)
            if self.license_name:  # license: other: the hub asks for a name and a link
                extra = {"license_name": self.license_name, "license_link": CARD}
                text += "\n" + yaml_dump(extra, sort_keys=False, line_break=line_break).strip()
            return text

    return SemBridgeCardData


def _num(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else "–"


def key_of(item: Mapping[str, Any]) -> tuple[str, ...]:
    """What a recorded item replaces: one of the same (target,) dataset and split."""
    where = (item.get("dataset", ""), item.get("split", ""))
    return (item["target"], *where) if "target" in item else where


def _eval_rows(
    own: Sequence[Evaluation], before: Sequence[Evaluation], dev: DevScores, tuned: bool
) -> list[list[str]]:
    """Per (dataset, split): nDCG@10 zero-shot and (fine-tuned) fine-tuned, then the other metrics
    of this model."""
    base = {key_of(e): e.get("metrics", {}).get(PRIMARY) for e in before}
    rows = []
    for item in own:
        got = item.get("metrics", {})
        zero = [_num(base.get(key_of(item)))] if tuned else []
        rows.append([*key_of(item), *zero, *(_num(got.get(m)) for m in SHOWN_METRICS)])
    if tuned:
        rows += [
            [*k, _num(v), "not evaluated yet", "–", "–"]
            for k, v in base.items()
            if k not in map(key_of, own)
        ]
    if dev:
        name = f"{dev.get('dataset')} (fine-tuning's development set, step {dev.get('step')})"
        scores = [_num(dev.get("zero_shot")), _num(dev.get("fine_tuned"))]
        rows.append([name, dev.get("split", ""), *scores, "–", "–"])
    return rows


def _export_row(item: ExportParity) -> list[str]:
    return [
        f"`{item.get('target', '')}`",
        *key_of(item)[1:],
        str(item.get("queries", "–")),
        _num(item.get("overlap10")),
        _num(item.get("ndcg10_exact")),
        _num(item.get("ndcg10_target")),
        "yes" if item.get("passed") else "**no**",
    ]


def _model_index(
    name: str, own: Sequence[Evaluation], before: Sequence[Evaluation], dev: DevScores, tuned: bool
) -> list[dict[str, Any]]:
    """The hub's ``model-index``: per dataset and split, this model's nDCG@10 (RR@10, R@100) and,
    for a fine-tuned model, the zero-shot nDCG@10 of the model it started from (metric type
    ``ndcg@10-zero-shot``)."""
    from huggingface_hub.repocard_data import EvalResult, eval_results_to_model_index

    stage = " (fine-tuned)" if tuned else " (zero-shot)"
    zero_shot = "ndcg@10-zero-shot", "nDCG@10 zero-shot (before fine-tuning)"
    found: list[tuple[Evaluation | DevScores, str, str, object]] = [
        (item, metric.lower(), metric + (stage if metric == PRIMARY else ""), score)
        for item in own
        for metric, score in item.get("metrics", {}).items()
    ]
    found += [
        (item, *zero_shot, item.get("metrics", {}).get(PRIMARY))
        for item in (before if tuned else [])
    ]
    if dev:
        found += [
            (dev, "ndcg@10", f"nDCG@10{stage}", dev.get("fine_tuned")),
            (dev, *zero_shot, dev.get("zero_shot")),
        ]
    results = [
        EvalResult(
            task_type="sparse-information-retrieval",
            task_name="Sparse Information Retrieval",
            dataset_type=where.get("dataset_id") or where.get("dataset", ""),
            dataset_name=where.get("dataset", ""),
            dataset_split=where.get("split", ""),
            metric_type=kind,
            metric_name=label,
            metric_value=float(value),
        )
        for where, kind, label, value in found
        if isinstance(value, int | float)
    ]
    return eval_results_to_model_index(name, results) if results else []


def _title(init: InitFacts, tune: FinetuneFacts, alpha: str) -> str:
    """A title from the facts: method (and α), language, source model, target vocabulary, training
    data."""
    method, code = init.get("method", ""), init.get("language", "")
    tokenizer = init.get("target_tokenizer", "")
    label = METHODS.get(method, method) + (f" (α = {alpha})" if alpha else "")
    title = f"{label + ' s' if label else 'S'}parse encoder{f' for {english_name(code)}' if code else ''}: "
    title += re.sub(r"/model$", "", init.get("source_model", "")) or "a sparse encoder"
    title += f" with the {tokenizer} vocabulary" if tokenizer and method else ""
    return title + (
        f", fine-tuned on {tune.get('train', 'retrieval pairs').split(' (')[0]}" if tune else ""
    )


def _support(histogram: dict[str, int]) -> str:
    sizes = sorted((int(k), n) for k, n in histogram.items())
    total = sum(n for _, n in sizes)
    return (
        f"mean {sum(k * n for k, n in sizes) / total:.1f}, max {sizes[-1][0]} (over {total} tokens)"
        if total
        else "–"
    )


def render(
    prov: Mapping[str, object],
    scores: Sequence[Evaluation] = (),
    exports: Sequence[ExportParity] = (),
    zero_shot: Sequence[Evaluation] = (),
) -> str:
    """The card's Markdown, from a :class:`Provenance`, the model's evaluations and exports and, for
    a fine-tuned model, the evaluations of the model it started from (``zero_shot``; added to those
    a provenance of an older version recorded)."""
    from huggingface_hub import ModelCard

    facts = cast(Provenance, prov)
    init, tune = facts.get("init", {}), facts.get("finetune", {})
    own, dev = list(scores), tune.get("dev", {})
    before = [*{key_of(e): e for e in [*tune.get("zero_shot", []), *zero_shot]}.values()]
    code, licences = init.get("language", ""), all_licences(facts)
    alpha = f"{init['alpha']:g}" if init.get("method") in ENTMAX_BRIDGES and "alpha" in init else ""
    hub, licence_name = combined_licence(licences)
    title = _title(init, tune, alpha)
    train = {"name": tune.get("train", "")}
    if "train_id" in tune:
        train["id"] = tune["train_id"]
    card_data = _card_data_class()(
        language=[code] if code else [],
        license=hub,
        model_name=title,
        local_files_only=True,
        generate_widget_examples=False,
        train_datasets=[train] if "train" in tune else [],
        tags=[
            "sentence-transformers",
            "sparse-encoder",
            "sparse",
            "splade",
            "sembridge",
            "vocabulary-transfer",
        ],
        sembridge={  # what the template shows beyond sentence-transformers' own fields
            "init": init,
            "tune": tune,
            "alpha": alpha,
            "language": f"{english_name(code)} (`{code}`)" if code else "",
            "support": _support(init.get("support_histogram", {})),
            "ranking": RANKING_LABELS.get(tune.get("ranking", "infonce"), tune.get("ranking", "")),
            "eval_rows": _eval_rows(own, before, dev, bool(tune)),
            "health_rows": [row for e in own if (row := _health_row(e)) is not None],
            "export_rows": [_export_row(e) for e in exports],
            "licences": licences,
            "licence_name": licence_name,
            "unknown": sum(item["hub"] == "unknown" for item in licences),
            "version": __version__,
        },
        facts={  # what the card says about using the model
            "output_dimensionality": init.get("vocab_size"),
            "similarity_fn_name": "Dot Product",
            "query_length": tune.get("query_length") or init.get("query_length"),
            "document_length": tune.get("document_length") or init.get("document_length"),
        },
        model_index=_model_index(title, own, before, dev, bool(tune)),
        license_name=LICENCE_NAME if hub == "other" else None,
    )
    _set_hub_fields(card_data, init, tune, licences)
    card = ModelCard.from_template(card_data, template_path=str(TEMPLATE))
    return card.content.rstrip("\n") + "\n"


def _set_hub_fields(
    card_data: Any, init: InitFacts, tune: FinetuneFacts, licences: Sequence[InputLicence]
) -> None:
    """The hub metadata the card's data class does not take as arguments: pipeline, task, datasets,
    base model."""
    card_data.pipeline_tag, card_data.model_type = "feature-extraction", "SPLADE Sparse Encoder"
    card_data.task_name = "semantic search and sparse retrieval"
    ids = {item.get("hub_id", "") for item in licences if "data" in item["role"]}
    card_data.datasets = sorted((ids | {tune.get("train_id", "")}) - {""})
    # a provenance without base_model: the source, if a hub id
    source = init.get("source_model", "")
    hub_source = source if catalog.looks_like_hub(source) and not is_local(source) else ""
    card_data.base_model = init.get("base_model", hub_source) or None


def write_card(model_dir: Path, prov: Mapping[str, object]) -> None:
    """Write ``README.md`` and ``sembridge.json`` (a :class:`Provenance`) into a SparseEncoder
    directory (before it is renamed into place); inputs whose licence is unknown are named in one
    warning line."""
    if unknown := [
        f"{item['role']} {item['name']!r}"
        for item in all_licences(prov)
        if item["hub"] == "unknown"
    ]:
        log.warning(
            "the model card names no licence for %s: %s (`license:` in the front matter of its README declares one)",
            ", ".join(unknown),
            UNKNOWN,
        )
    (Path(model_dir) / PROVENANCE).write_text(
        json.dumps(prov, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (Path(model_dir) / CARD).write_text(render(prov), encoding="utf-8")
