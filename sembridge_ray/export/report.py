"""What ``export_report.json`` holds (``docs/export.md``, "The report"): types only, so that the
export job's contract imports nothing heavy."""

from __future__ import annotations

from typing import TypedDict

REPORT = "export_report.json"
"""The file of an export's output that holds its report."""

ParityReport = TypedDict(
    "ParityReport",
    {
        "queries": int,
        "overlap@10": float,
        "identical_up_to_ties": float,
        "ndcg@10_exact": float | None,
        "ndcg@10_target": float | None,
    },
)
"""The parity (:class:`sembridge_ray.export.parity.Parity`), rounded to 6 decimals."""


class ExportReport(ParityReport, total=False):
    """``export_report.json`` of a target export."""

    target: str
    model: str
    checkpoint: str
    dataset: str
    split: str
    documents: int
    postings: int
    bytes: int
    seconds: float
    seconds_by_stage: dict[str, float]
    tolerance: dict[str, object]
    details: dict[str, object]
    passed: bool
