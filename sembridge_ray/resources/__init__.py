"""Where the bundled files are. The package keeps only the small files its code reads (the model card
template, Ray Data's logging config); the data sets, target tokenizers, thesaurus and shipped bridge
vectors (24 MB, and 48 MB once the vectors are built) are a distribution of their own,
``sembridge-ray-assets`` (package ``sembridge_ray_assets``, the checkout's ``assets/`` folder), so
that a wheel of ``sembridge_ray`` stays small. Their sources and licences: ``assets/README.md``.

:func:`asset` finds them; without the distribution every use is one line naming the asset and how to
install it (an :class:`~sembridge_ray.runtime.errors.InputError`, exit 2)."""

from __future__ import annotations

import contextlib
import importlib.resources
from pathlib import Path

from sembridge_ray.runtime.errors import InputError

PACKAGE = "sembridge_ray_assets"
CHECKOUT_ASSETS = Path(__file__).resolve().parents[2] / "assets" / PACKAGE
"""Where a checkout keeps the package: found there too when it is not installed (a checkout run
with another checkout's environment, or the copy of the working directory that ``ray job submit
--working-dir .`` gives a cluster's workers)."""
INSTALL = "pip install -e ./assets in the checkout (bash cluster/local.sh setup does)"


def assets_root() -> Path | None:
    """The ``sembridge_ray_assets`` package's folder: installed, else beside this package in a
    checkout; None when neither is there."""
    with contextlib.suppress(ModuleNotFoundError):
        root = importlib.resources.files(PACKAGE)
        if isinstance(root, Path):
            return root
    return CHECKOUT_ASSETS if (CHECKOUT_ASSETS / "__init__.py").is_file() else None


def asset(name: str) -> Path:
    """The bundled file or folder ``name`` (``data/sick2014``, ``tokenizers/ko``, ...)."""
    root = assets_root()
    if root is None:
        raise InputError(
            f"the bundled {name} is not here: it ships in the sembridge-ray-assets distribution, "
            f"which is not installed; install it with {INSTALL}"
        )
    return root / name


def sick_dir() -> Path:
    """SICK 2014 (train, trial, test annotated)."""
    return asset("data/sick2014")


def sts_dir() -> Path:
    """STS 2012–2016 in SentEval's layout."""
    return asset("data/sts")


def bridge_cache_dir() -> Path | None:
    """The shipped bridge vectors' folder, or None without the assets (they are optional: an init
    then encodes its strings itself)."""
    root = assets_root()
    return None if root is None else root / "bridge_cache"
