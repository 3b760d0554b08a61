"""sembridge_ray: SemBridge vocabulary transfer for sparse retrievers, and the MaLSTM reproduction,
on Ray.

Importing the package never imports Ray (Ray lives only in ``sembridge_ray.distributed``, the
Ray executor, and the checkout's ``jobs``), and it loads torch only when ``bridge_weights`` is first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the lazy attribute below is, for type checkers
    from sembridge_ray.embed_init.weighting import bridge_weights

__version__ = "0.1.0"
__all__ = ["bridge_weights"]


def __getattr__(name: str) -> object:
    if name == "bridge_weights":
        from sembridge_ray.embed_init.weighting import bridge_weights

        return bridge_weights
    raise AttributeError(f"module 'sembridge_ray' has no attribute {name!r}")
