"""Convergence figures of a dev curve and the choice of the best step, on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from sembridge_ray.sparse.convergence import (
    DEV_PRIMARY,
    collapse,
    convergence,
    dev_curve,
    read_evaluations,
)


def _line(
    step: int, ndcg: float, q: float = 40.0, d: float = 80.0, **more: float
) -> dict[str, float]:
    return {"step": step, DEV_PRIMARY: ndcg, "dev_active_dims_q": q, "dev_active_dims_d": d, **more}


def test_steps_to_95_and_the_area_under_the_curve() -> None:
    curve = [(0, 0.2), (10, 0.5), (20, 0.58), (30, 0.6)]
    figures = convergence(curve)
    assert figures["final"] == 0.6 and figures["evaluations"] == 4
    assert figures["steps_to_95"] == 20  # 0.95 * 0.6 = 0.57: 0.5 < 0.57 <= 0.58
    # trapezoids: 10 * (0.35 + 0.54 + 0.59) / 30
    assert figures["auc"] == pytest.approx((0.35 + 0.54 + 0.59) / 3)
    # already above 95% of the final score
    assert convergence([(0, 0.7), (10, 0.6)])["steps_to_95"] == 0
    empty = convergence([])
    assert empty["steps_to_95"] is None and math.isnan(empty["final"])


def test_the_curve_reads_the_evaluated_lines_only() -> None:
    history = [_line(0, 0.1), {"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0, **_line(2, 0.3)}]
    assert dev_curve(history) == [(0, 0.1), (2, 0.3)]


def test_collapse_is_empty_or_dense_vectors() -> None:
    assert collapse(40, 80, 1000) is None
    assert "query vectors are empty" in (collapse(0.4, 80, 1000) or "")
    assert "document vectors are dense" in (collapse(40, 950, 1000) or "")


def test_a_collapsed_step_is_never_the_best_even_with_the_highest_score() -> None:
    history = [
        _line(0, 0.20),
        {"step": 5, "loss": 2.0, **_line(5, 0.35)},
        # empty queries: the score is an artefact
        {"step": 10, "loss": 1.5, **_line(10, 0.90, q=0.0)},
        # ties the step-5 score: the earlier step wins
        {"step": 15, "loss": 1.4, **_line(15, 0.35)},
    ]
    found = read_evaluations(history, vocab_size=1000, select="best")
    assert found["best"]["step"] == 5 and found["best"][DEV_PRIMARY] == 0.35
    assert [c["step"] for c in found["collapsed"]] == [10]
    assert found["final"]["step"] == 15 and found["convergence"]["final"] == 0.35
    assert read_evaluations(history[2:3], 1000, "best")["best"] == {}  # nothing left to select
