"""Convergence of a fine-tuning run, read from its development curve (dev nDCG@10 at each evaluation
step).

- ``final``: the score at the last evaluation (the end of training);
- ``steps_to_95``: the first evaluated step whose score reaches 95% of ``final`` (a run that starts
  above it reaches it at step 0); None for a curve without evaluations;
- ``auc``: the area under the curve over the evaluated span (trapezoids, divided by the steps from
  the first evaluation, step 0, to the last), i.e. the mean score across training: a run that
  converges faster has the larger area at the same final score.

A collapsed model is one whose mean active dimensions of queries or documents are below one (empty
vectors) or at least :data:`DENSE_SHARE` of the vocabulary (no sparsity left): its score says
nothing about retrieval with a sparse index, so it is never selected as the best checkpoint (the
failure of sentence-transformers issue 3431)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TypedDict

DEV_PRIMARY = "dev_nDCG@10"
DEV_DIMS_Q, DEV_DIMS_D = "dev_active_dims_q", "dev_active_dims_d"
DENSE_SHARE = 0.9


class Evaluations(TypedDict):
    """What a run's metrics lines say about its evaluations (:func:`read_evaluations`)."""

    final: dict[str, float]
    """The last line with a loss."""
    best: dict[str, object]
    collapsed: list[dict[str, object]]
    convergence: Convergence
    eval_seconds: float


class Convergence(TypedDict):
    final: float
    steps_to_95: int | None
    auc: float
    evaluations: int


def dev_curve(
    history: Sequence[Mapping[str, float]], key: str = DEV_PRIMARY
) -> list[tuple[int, float]]:
    """(step, score) of every metrics line that holds ``key``, in step order (one per step: the last
    wins)."""
    points = {int(line["step"]): float(line[key]) for line in history if key in line}
    return sorted(points.items())


def convergence(curve: Sequence[tuple[int, float]], share: float = 0.95) -> Convergence:
    """The figures of a dev curve (see the module docstring)."""
    if not curve:
        return {"final": float("nan"), "steps_to_95": None, "auc": float("nan"), "evaluations": 0}
    (first, _), (last, final) = curve[0], curve[-1]
    reached = next(step for step, score in curve if score >= share * final)
    trapezoids = sum((b - a) * (sa + sb) / 2 for (a, sa), (b, sb) in itertools.pairwise(curve))
    auc = trapezoids / (last - first) if last != first else final
    return {"final": final, "steps_to_95": reached, "auc": auc, "evaluations": len(curve)}


QUERY_DIMS_BAND = (5.0, 300.0)
"""The mean active dimensions of a healthy SPLADE's queries. Below 5, a question of 10-20 words keeps
fewer terms than it has content words: the sparsest efficient SPLADE models of Lassance & Clinchant
(SIGIR 2022) still fire on about 5-10 per query. Above 300, about 1% of a 30,522-token vocabulary,
the vectors are no longer what sentence-transformers describes as a SPLADE's ("typically >99%
zeros"; its SPLADE models keep queries to a few tens of terms). The bundled ``splade-tiny`` fires on
23 per XQuAD question."""


def query_collapse(dims_q: float) -> str | None:
    """Why a model whose queries have ``dims_q`` mean active dimensions is collapsed (outside
    :data:`QUERY_DIMS_BAND`), or None."""
    low, high = QUERY_DIMS_BAND
    if dims_q < low:
        return f"queries fire on {dims_q:.1f} terms (< {low:g})"
    if dims_q > high:
        return f"queries fire on {dims_q:.0f} terms (> {high:g})"
    return None


def collapse(dims_q: float, dims_d: float, vocab_size: int) -> str | None:
    """Why a model with these mean active dimensions is collapsed, or None when it is not."""
    for role, dims in (("query", dims_q), ("document", dims_d)):
        if dims < 1:
            return f"{role} vectors are empty (mean active dimensions {dims:.2f})"
        if dims >= DENSE_SHARE * vocab_size:
            return f"{role} vectors are dense ({dims:.0f} of {vocab_size} dimensions active)"
    return None


def read_evaluations(
    history: Sequence[Mapping[str, float]], vocab_size: int, select: str = "last"
) -> Evaluations:
    """The convergence figures, the collapsed steps and the best step (the highest dev nDCG@10 of a
    step that did not collapse; the earliest on a tie) of a run's metrics lines."""
    final = next((m for m in reversed(history) if "loss" in m), history[-1] if history else {})
    evaluated = [m for m in history if DEV_PRIMARY in m]
    collapsed = [
        {"step": int(m["step"]), "reason": why}
        for m in evaluated
        if (why := collapse(m[DEV_DIMS_Q], m[DEV_DIMS_D], vocab_size)) is not None
    ]
    gone = {c["step"] for c in collapsed}
    candidates = [m for m in evaluated if int(m["step"]) not in gone]
    best: dict[str, object] = {}
    if candidates:
        top = max(candidates, key=lambda m: (m[DEV_PRIMARY], -m["step"]))
        if select == "best":
            reason = f"the highest dev nDCG@10 of {len(evaluated)} evaluations" + (
                f", {len(collapsed)} collapsed ones excluded" if collapsed else ""
            )
        else:
            reason = "select=last publishes the last step; this is the evaluated step a select=best run would publish"
        best = {
            "step": int(top["step"]),
            DEV_PRIMARY: top[DEV_PRIMARY],
            "reason": reason,
            "last_step": int(evaluated[-1]["step"]),
        }
    return {
        "final": dict(final),
        "best": best,
        "collapsed": collapsed,
        "convergence": convergence(dev_curve(history)),
        "eval_seconds": round(sum(m.get("dev_seconds", 0.0) for m in history), 2),
    }
