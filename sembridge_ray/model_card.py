"""The model card the init and fine-tuning jobs write into every model they produce (``<output>/model/README.md``),
and the machine-readable provenance beside it (``sembridge.json``).

sentence-transformers keeps a loaded model's README when it saves or pushes the model again untrained, so the card
travels with ``SparseEncoder(dir).push_to_hub(...)``. A fine-tuned model's provenance extends the one of the model
it started from, so a card names the whole chain: base model, target tokenizer and language, bridge, method and α,
token counts per kind and support sizes, then the fine-tuning data and steps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict, cast

from sembridge_ray import catalog

PROVENANCE = "sembridge.json"
CARD = "README.md"


class InitFacts(TypedDict, total=False):
    """What the init job records about an initialisation (``distributed/init_job.card_facts``)."""

    source_model: str
    target_tokenizer: str
    bridge_model: str
    language: str
    method: str
    alpha: float
    position_aware: bool
    kinds: dict[str, int]
    """Target tokens per kind."""
    support_histogram: dict[str, int]
    """Support size (as a string) -> bridged tokens with that many source tokens."""


class FinetuneFacts(TypedDict, total=False):
    """What the fine-tuning job adds (``distributed/finetune.card_provenance``)."""

    model: str
    train: str
    steps: int
    batch_size: int
    lr: float
    lambda_q: float
    lambda_d: float
    final_loss: float | None


class Provenance(TypedDict, total=False):
    """``sembridge.json``: one section per job that made the model."""

    init: InitFacts
    finetune: FinetuneFacts


def read_provenance(model_dir: str | Path) -> Provenance:
    """The provenance of a model this project wrote ({} for any other model)."""
    try:
        data = json.loads((Path(model_dir) / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cast(Provenance, data) if isinstance(data, dict) else {}  # as write_card wrote it


def _licence(name: str) -> str:
    known = catalog.LICENCES.get(name)
    return f"{known} (as stated on its hub page; check before use)" if known else "see its own card or source"


def _front_matter(prov: Provenance) -> str:
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: feature-extraction",
        "tags:",
        "- sentence-transformers",
        "- sparse-encoder",
        "- splade",
        "- sembridge",
    ]
    base = prov.get("init", {}).get("source_model", "")
    if base and catalog.looks_like_hub(base):
        lines.append(f"base_model: {base}")
    language = prov.get("init", {}).get("language", "")
    if language:
        lines.append(f"language: {language}")
    return "\n".join([*lines, "---", ""])


def render(prov: Mapping[str, object], scores: dict[str, float] | None = None) -> str:
    """The card's Markdown, from a :class:`Provenance` (``init`` and, after fine-tuning, ``finetune`` sections)."""
    facts = cast(Provenance, prov)
    init, tune = facts.get("init", {}), facts.get("finetune", {})
    language = init.get("language") or "unknown"
    title = "Fine-tuned" if tune else "Initialised"
    out = [
        _front_matter(facts),
        f"# {title} sparse encoder ({language}), made with sembridge_ray",
        "",
        "A SPLADE-style sparse retrieval encoder whose vocabulary was swapped for a target-language tokenizer "
        "and whose new token embeddings were initialised from the source model's (SemBridge, arXiv 2605.26002, "
        "or a baseline).",
        "",
        "```python",
        "from sentence_transformers import SparseEncoder",
        "",
        'model = SparseEncoder("path/to/this/model")',
        'queries = model.encode_query(["a man is playing a guitar"])',
        'documents = model.encode_document(["A man plays the guitar on stage."])',
        "print(model.similarity(queries, documents))",
        "```",
        "",
        "## Initialisation",
        "",
    ]
    if init:
        alpha = f", α = {init['alpha']:g}" if init.get("method") == "sembridge" else ""
        rows = [
            ("source model", init.get("source_model")),
            ("target tokenizer", init.get("target_tokenizer")),
            ("target language", language),
            ("method", f"{init.get('method')}{alpha}"),
            ("bridge model", init.get("bridge_model") or "none (no bridge)"),
            ("position-aware bridging", "yes" if init.get("position_aware") else "no (the released rule)"),
            ("target tokens per kind", ", ".join(f"{n} {k}" for k, n in sorted(init.get("kinds", {}).items()))),
            ("support size of bridged tokens", _support(init.get("support_histogram", {}))),
        ]
        out += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    if tune:
        out += [
            "## Fine-tuning",
            "",
            "| | |",
            "|---|---|",
            f"| training data | {tune.get('train')} |",
            f"| steps | {tune.get('steps')} |",
            f"| batch (global) | {tune.get('batch_size')} |",
            f"| learning rate | {tune.get('lr')} |",
            f"| loss | InfoNCE + FLOPs (λq {tune.get('lambda_q')}, λd {tune.get('lambda_d')}) |",
            f"| final loss | {tune.get('final_loss', '–')} |",
            "",
        ]
    if scores:
        out += ["## Scores", "", *(f"- {k}: {v:.4f}" for k, v in scores.items()), ""]
    inputs = [init.get("source_model"), init.get("target_tokenizer"), init.get("bridge_model"), tune.get("train")]
    out += [
        "## Licences of the inputs",
        "",
        *(f"- `{name}`: {_licence(name)}" for name in inputs if name),
        "",
        "This model inherits the terms of its inputs; the most restrictive one applies.",
        "",
    ]
    return "\n".join(out)


def _support(histogram: dict[str, int]) -> str:
    if not histogram:
        return "–"
    sizes = sorted((int(k), n) for k, n in histogram.items())
    total = sum(n for _, n in sizes)
    mean = sum(k * n for k, n in sizes) / total
    return f"mean {mean:.1f}, max {sizes[-1][0]} (over {total} tokens)"


def write_card(model_dir: Path, prov: Mapping[str, object], scores: dict[str, float] | None = None) -> None:
    """Write ``README.md`` and ``sembridge.json`` (a :class:`Provenance`) into a SparseEncoder directory (before it
    is renamed into place)."""
    (Path(model_dir) / PROVENANCE).write_text(json.dumps(prov, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (Path(model_dir) / CARD).write_text(render(prov, scores), encoding="utf-8")
