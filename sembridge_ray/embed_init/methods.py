"""The one registry of initialisation methods: what each needs, so the rest of the code asks instead of listing.

| method      | bridge | α   | rule for a bridged target token (see ``baselines.py``)                           |
|-------------|--------|-----|------------------------------------------------------------------------------------|
| sembridge   | yes    | yes | α-entmax over the cosines to every source token (α=4; 1 = softmax over the nearest) |
| focus       | yes    | no  | sparsemax over the overlapping tokens only                                         |
| wechsel     | yes    | no  | softmax(cos / 0.1) over the 10 nearest source tokens                              |
| mean        | no     | no  | the mean source row                                                                |
| random      | no     | no  | N(mean, std) per dimension of the source rows, seeded                              |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MethodName = Literal["sembridge", "focus", "wechsel", "mean", "random"]


@dataclass(frozen=True, kw_only=True)
class InitMethod:
    name: MethodName
    uses_bridge: bool
    """Embeds token strings with the bridge model and weights source rows by similarity."""
    has_alpha: bool
    """Takes the entmax α (the grid's ``--alphas`` axis)."""
    settings: tuple[str, ...] = ()
    """InitConfig keys that only this method reads."""


METHODS: dict[str, InitMethod] = {
    m.name: m
    for m in (
        InitMethod(
            name="sembridge", uses_bridge=True, has_alpha=True, settings=("alpha", "temperature", "softmax_top_k")
        ),
        InitMethod(name="focus", uses_bridge=True, has_alpha=False),
        InitMethod(
            name="wechsel", uses_bridge=True, has_alpha=False, settings=("wechsel_top_k", "wechsel_temperature")
        ),
        InitMethod(name="mean", uses_bridge=False, has_alpha=False),
        InitMethod(name="random", uses_bridge=False, has_alpha=False),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
# Keys that matter only when a method embeds strings with the bridge.
BRIDGE_SETTINGS = ("exclude_special_sources", "bridge_batch_size", "rows_batch_size")


def method(name: str) -> InitMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown init method {name!r} (known: {', '.join(METHODS)})") from None


def unused_settings(name: str) -> tuple[str, ...]:
    """InitConfig keys that cannot change what method ``name`` computes (left out of its run identity)."""
    own = method(name)
    others = {key for m in METHODS.values() if m.name != name for key in m.settings} - set(own.settings)
    return tuple(sorted(others | (set() if own.uses_bridge else set(BRIDGE_SETTINGS))))


POSITION_AWARE = "+pa"
"""Suffix of a bridge method in ``methods`` that runs it with ``position_aware=true`` (e.g. ``sembridge+pa``)."""


def split_variant(name: str) -> tuple[str, bool]:
    """``sembridge+pa`` -> (``sembridge``, True); ``focus`` -> (``focus``, False)."""
    base = name.removesuffix(POSITION_AWARE)
    return base, base != name


def parse_alpha(text: str) -> float:
    """``4`` -> 4.0; ``softmax`` -> 1.0 (softmax over the nearest source tokens)."""
    return 1.0 if str(text).strip().lower() == "softmax" else float(text)
