"""The registry of export targets against what the documentation promises: every ``--target``
besides ``sentence-transformers`` is registered, in the documented order, as an object that
implements the :class:`ExportTarget` protocol, with the tolerance ``docs/export.md`` states; the
tolerance rule is the one that document describes. No Ray, no model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest

from sembridge_ray.export.base import ExportTarget, Tolerance
from sembridge_ray.export.report import ExportReport
from sembridge_ray.export.targets import MODEL_DIRECTORY, TARGETS, target
from sembridge_ray.recipes.export.config import TargetName

DOCUMENTED = (
    "qdrant",
    "milvus",
    "seismic",
    "pisa",
    "opensearch",
    "opensearch-sparse-vector",
    "elasticsearch",
    "onnx",
    "onnx-optimized",
    "onnx-int8",
    "openvino",
    "doc-only",
)
"""docs/export.md's "Targets" table and docs/cli.md's ``--target``, written out by hand."""

DOCS = Path(__file__).resolve().parents[2] / "docs" / "export.md"


def documented_tolerances() -> dict[str, str]:
    """target -> the tolerance cell of docs/export.md's "Targets" table."""
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("## Targets") :].split("\n\n")[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {row[0].strip("| `"): row[-1].strip(" |") for row in rows}


def test_the_registry_holds_the_documented_targets_in_order() -> None:
    assert tuple(TARGETS) == DOCUMENTED
    assert tuple(documented_tolerances()) == DOCUMENTED
    assert get_args(TargetName) == (MODEL_DIRECTORY, *DOCUMENTED)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_target_implements_the_protocol_under_its_own_name(name: str) -> None:
    found = target(name)
    assert isinstance(found, ExportTarget)
    assert found.name == name and found.summary
    assert found.package is None or (found.package.module and found.package.pip)
    assert all(scheme in ("http", "https", "tcp") for scheme in found.schemes)


def test_an_object_without_the_targets_behaviour_is_not_one() -> None:
    class NoExport:
        name, summary, package, schemes, tolerance = "x", "", None, (), Tolerance()

    assert not isinstance(NoExport(), ExportTarget)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_tolerance_is_the_documented_one(name: str) -> None:
    cell = documented_tolerances()[name]
    rule = target(name).tolerance.rule()
    if cell == "exact":
        assert rule == {"rule": "identical up to ties on every query"}
    elif cell.startswith("none"):
        assert rule == {
            "rule": "scored beside the full model, not held to a tolerance (another model)"
        }
    else:
        overlap, loss = re.fullmatch(
            r"overlap@10 ≥ ([0-9.]+), nDCG@10 loss ≤ ([0-9.]+)", cell
        ).groups()  # type: ignore[union-attr]
        assert rule == {"min_overlap@10": float(overlap), "max_ndcg@10_loss": float(loss)}


def report(overlap: float, identical: float, exact: float | None, got: float | None) -> Any:
    return ExportReport(
        {
            "queries": 40,
            "overlap@10": overlap,
            "identical_up_to_ties": identical,
            "ndcg@10_exact": exact,
            "ndcg@10_target": got,
        }
    )


def test_the_tolerance_passes_as_docs_export_md_says() -> None:
    """An exact target fails unless every query is identical up to ties; a quantised or approximate
    one fails below its overlap@10 or above its nDCG@10 loss (exact minus target); another model
    never fails."""
    exact, approximate = target("qdrant").tolerance, target("seismic").tolerance
    assert exact.passes(report(1.0, 1.0, 0.5, 0.5))
    assert not exact.passes(report(1.0, 0.975, 0.5, 0.5))
    assert approximate.passes(report(0.95, 0.0, 0.50, 0.48))  # at both limits
    assert not approximate.passes(report(0.949, 1.0, 0.5, 0.5))
    assert not approximate.passes(report(1.0, 1.0, 0.50, 0.4799))
    assert approximate.passes(report(1.0, 1.0, None, None))  # no judgement: no loss
    assert target("doc-only").tolerance.passes(report(0.0, 0.0, 0.9, 0.0))


def test_an_unknown_name_lists_every_target() -> None:
    from sembridge_ray.runtime.errors import InputError

    with pytest.raises(InputError) as refused:
        target("lucene")
    assert str(refused.value) == (
        f"--target 'lucene': unknown (known: {', '.join(get_args(TargetName))})"
    )
