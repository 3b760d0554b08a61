"""The types of JSON (and of YAML read as strings): what configs flatten to, what identities and
manifests record.

Defined once so that settings which really are JSON say so, instead of ``dict[str, Any]``. A record
of known shape gets its own ``TypedDict`` beside its writer; these are for values whose shape is
open (a config's nested settings, a preset, a value passed through)."""

from __future__ import annotations

from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]
"""A JSON object, e.g. ``Config.to_dict()``: sections are nested objects, tuples become lists."""
