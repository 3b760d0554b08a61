"""The registry of export targets: ``--target`` name -> the object that implements
:class:`~sembridge_ray.export.base.ExportTarget`. Each target's facts (the package it needs, its
tolerance, its server schemes) are declared beside its code, in its module; this file only lists
them, in the order ``--target``'s help and errors name them.

A target's tolerance is what its parity (:mod:`sembridge_ray.export.parity`) must reach on the
evaluation queries, or the export fails (exit 2); ``docs/export.md`` gives the measurement behind
each number.

Adding a target: a module with its ``TARGET`` (or ``TARGETS``) and one line below; its name in
:data:`sembridge_ray.recipes.export.config.TargetName` too (the contract that validates ``--target`` imports
no target), and in ``tests/unit/test_export_registry.py``, which checks the three agree with
``docs/export.md``."""

from __future__ import annotations

from sembridge_ray.export import doc_only, lucene, milvus, onnx, pisa, qdrant, seismic
from sembridge_ray.export.base import ExportTarget
from sembridge_ray.runtime.errors import InputError

MODEL_DIRECTORY = "sentence-transformers"
"""The default ``--target``: a fine-tuning checkpoint written as a SparseEncoder directory (the
checkpoint export of the fine-tuning job), which checks no parity and so is not registered here."""

TARGETS: dict[str, ExportTarget] = {
    t.name: t
    for t in (
        qdrant.TARGET,
        milvus.TARGET,
        seismic.TARGET,
        pisa.TARGET,
        *lucene.TARGETS,
        *onnx.TARGETS,
        doc_only.TARGET,
    )
}


def target(name: str) -> ExportTarget:
    """The target called ``name``; InputError listing the known ones otherwise."""
    if name not in TARGETS:
        known = ", ".join((MODEL_DIRECTORY, *TARGETS))
        raise InputError(f"--target {name!r}: unknown (known: {known})")
    return TARGETS[name]
