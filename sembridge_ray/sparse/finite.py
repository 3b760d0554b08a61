"""Refusing numbers that cannot be right: a diverged loss, a model whose weights hold NaN or
infinity.

A job whose training diverged, or whose model came out non-finite, must not mark its output
complete; the error is an :class:`~sembridge_ray.runtime.errors.InputError` (one line, exit 2, never
retried) because what a user changes to fix it is an input: the learning rate, the training data,
the source model."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sembridge_ray.runtime.errors import InputError


class NonFiniteError(InputError):
    """A loss or weights with NaN or infinite values; the message names the step or the model, and
    the tensor."""


def nonfinite(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors of ``tensors`` (a state dict) that hold a NaN or an
    infinity."""
    return [
        name
        for name, t in tensors.items()
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]


def require_finite(tensors: Mapping[str, torch.Tensor], what: str, hint: str = "") -> None:
    """Raise :class:`NonFiniteError` when a tensor of ``tensors`` is not finite: ``what`` says whose
    they are."""
    if bad := nonfinite(tensors):
        raise NonFiniteError(
            f"{what}: NaN or infinite values in {len(bad)} weight tensor(s) (first: {bad[0]})"
            + (f"; {hint}" if hint else "")
        )
