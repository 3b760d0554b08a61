"""Typed, frozen job configs. Values layer as dataclass defaults < YAML preset < ``key.sub=value``
overrides.

Every value, from YAML or the command line, goes through :func:`coerce` with the field's annotation,
so ``no`` stays the string "no" in a ``str`` field and ``3e-5`` becomes a float in a ``float``
field. Unknown keys raise :class:`ConfigError` naming the key. Workers receive ``cfg.to_dict()`` and
rebuild it with ``from_dict``."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import itertools
import logging
import math
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar, cast

import yaml

from sembridge_ray.json_types import JSONObject, JSONValue
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import RunIdentity, flatten, run_identity, without

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)
T = TypeVar("T", bound="DataclassInstance")
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"null", "none", "~", ""}


class ConfigError(InputError):
    """A bad preset, override or value; the message names the offending key."""


def coerce(value: object, tp: object, key: str = "") -> object:
    """Convert a YAML/CLI value (usually a string) to the annotated type ``tp`` (a type or a typing
    form: a union, a ``Literal``, ``tuple[X, ...]``, a config dataclass)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.strip().lower() in _NONE)
        if is_none and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: cannot be None")
    if origin is Literal:
        for option in args:
            try:
                if coerce(value, type(option), key) == option:
                    return option
            except ConfigError:
                continue
        raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
    if origin is tuple:
        # anything else YAML or a caller hands a tuple field is a sequence
        items = (
            [v for v in value.split(",") if v.strip()]
            if isinstance(value, str)
            else list(cast(Iterable[object], value))
        )
        item_tp = args[0] if args else str
        return tuple(coerce(v.strip() if isinstance(v, str) else v, item_tp, key) for v in items)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return _build(tp, value, prefix=f"{key}.")
    return _scalar(value, tp, key)


def _scalar(value: object, tp: object, key: str) -> object:
    if value is None:
        raise ConfigError(f"{key}: a value is required")
    text = str(value).strip()
    try:
        if tp is bool:
            if isinstance(value, bool) or text.lower() in _TRUE | _FALSE:
                return value if isinstance(value, bool) else text.lower() in _TRUE
            raise ValueError(text)
        if tp is int:
            return int(text)  # a bool's text is no int
        if tp is float:
            return float(text)
        if tp is str:
            return text if isinstance(value, str) else str(value)
    except ValueError:
        raise ConfigError(
            f"{key}: {value!r} is not a valid {getattr(tp, '__name__', tp)}"
        ) from None
    raise ConfigError(f"{key}: unsupported field type {tp!r}")


def _build(cls: type[T], data: Mapping[str, object], prefix: str = "") -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    aliases: dict[str, str] = getattr(cls, "ALIASES", {})
    upgrade = getattr(cls, "upgrade", None)
    data = canonical(cls, data, prefix)
    data = upgrade(data) if upgrade is not None else data
    for old, new in aliases.items():
        if old in data:
            log.warning(
                "config key %s%s is now %s%s (the old name goes in the next release)",
                prefix,
                old,
                prefix,
                new,
            )
            data[new] = data.pop(old)
    for name in data:
        if name not in names:
            raise ConfigError(f"unknown config key {prefix}{name!s}{suggestion(name, cls, prefix)}")
    shorthands = getattr(cls, "SHORTHANDS", ())

    def value(name: str) -> object:
        given, tp = data[name], hints[name]
        if name in shorthands and isinstance(given, Mapping) and isinstance(tp, type):
            # its keys named as they may be given: without the section
            return _build(tp, given, prefix)
        return coerce(given, tp, f"{prefix}{name}")

    try:
        return cls(**{name: value(name) for name in data})
    except ConfigError as err:  # a nested config's own check names its key without the section
        if prefix and not str(err).startswith(prefix):
            raise ConfigError(f"{prefix}{err}") from None
        raise


def _shorthand(cls: type, name: str) -> str | None:
    """The section of ``SHORTHANDS`` holding ``name`` (given without the section), or None."""
    if name in {f.name for f in dataclasses.fields(cls)}:
        return None
    shorthands: tuple[str, ...] = getattr(cls, "SHORTHANDS", ())
    for section in shorthands:
        tp = typing.get_type_hints(cls)[section]
        if name in {f.name for f in dataclasses.fields(tp)} or name in getattr(tp, "ALIASES", {}):
            return section
    return None


def canonical_key(cls: type, key: str) -> str:
    """The dotted ``key`` as ``cls`` nests it: a section's key given without the section gets it
    (``alpha`` -> ``weighting.alpha``), in nested configs too (``init.alpha`` ->
    ``init.weighting.alpha``)."""
    head, dot, rest = key.partition(".")
    section = _shorthand(cls, head)
    if section is not None:
        return f"{section}.{key}"
    tp = typing.get_type_hints(cls).get(head)  # a field's type (a class's ClassVars are no type)
    return (
        f"{head}.{canonical_key(tp, rest)}"
        if dot and isinstance(tp, type) and dataclasses.is_dataclass(tp)
        else key
    )


def canonical(cls: type, data: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Raw ``data`` (a preset, overrides) with every section's shorthand keys moved into their
    section, in nested configs too; a key given both ways with two values is refused (neither could
    be said to win)."""
    out = dict(data)
    hints = typing.get_type_hints(cls)
    for name, section in [(k, s) for k in out if (s := _shorthand(cls, k)) is not None]:
        nested = out.get(section)
        inner = dict(nested) if isinstance(nested, Mapping) else {}
        if nested is not None and not isinstance(nested, Mapping):
            continue  # a built config, or not a mapping: _build says what is wrong
        value = out.pop(name)
        if name in inner and _differ(
            value, inner[name], typing.get_type_hints(hints[section]).get(name)
        ):
            raise ConfigError(
                f"{prefix}{name} is given twice: {value!r} and {prefix}{section}.{name}={inner[name]!r}"
            )
        out[section] = {**inner, name: value}
    for name, value in out.items():
        tp = hints.get(name)
        if isinstance(value, Mapping) and isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out[name] = canonical(tp, value, f"{prefix}{name}.")
    return out


def _differ(a: object, b: object, tp: object) -> bool:
    try:
        return tp is None or coerce(a, tp) != coerce(b, tp)
    except ConfigError:
        return True


def require(ok: bool, key: str, value: object, rule: str) -> None:
    """Raise :class:`ConfigError` ``key=value: rule`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {rule}")


def require_at_least(cfg: object, minimum: int, keys: str) -> None:
    """:func:`require` each of ``keys`` (field names, whitespace-separated) to be >= ``minimum``, in
    order."""
    for key in keys.split():
        require(getattr(cfg, key) >= minimum, key, getattr(cfg, key), f"must be >= {minimum}")


@cache
def read_with(key: str, rule: str) -> dict[str, object]:
    """A field's metadata: setting the field while ``key`` is unset is refused (``rule`` says
    why), before :meth:`Config.check`."""
    return {"read_with": (key, rule)}


def suggestion(name: str, cls: type, prefix: str = "") -> str:
    """ "; did you mean X?" for an unknown key: a key of the same name in a section, else the
    closest key."""
    keys = [prefix + k for k in dotted_keys(cls)]
    same = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    close = same or difflib.get_close_matches(prefix + name, keys, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class Config:
    """Mixin for frozen dataclass configs: validation when built, ``to_dict``/``from_dict``,
    overrides, identity.

    A config checks itself when it is constructed (``__post_init__``): ``Literal`` fields against
    their choices, then the class's own :meth:`check` for ranges. ``NOT_IDENTITY`` is its
    operational section: the dotted keys that change nothing a run computes (paths of inputs, which
    enter the identity by content, the output, ``overwrite``, workers, caches, checkpoint and report
    cadence); every other key is part of the run's identity
    (:func:`~sembridge_ray.runtime.identity.run_identity`)."""

    # every subclass is a dataclass
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ()
    ALIASES: ClassVar[dict[str, str]] = {}
    """Old key -> new key, accepted with a warning for one release."""
    SHORTHANDS: ClassVar[tuple[str, ...]] = ()
    """Sections whose keys are also accepted without the section's name, for good (``alpha`` for
    ``weighting.alpha``: the flat keys a section's settings had before it was composed)."""

    @classmethod
    def upgrade(cls, data: dict[str, object]) -> dict[str, object]:
        """Rewrite older spellings in raw ``data`` (a preset, overrides; before coercion) that a
        plain key rename cannot express."""
        return data

    def __post_init__(self) -> None:
        hints, fields = typing.get_type_hints(type(self)), dataclasses.fields(self)
        for f in fields:
            if typing.get_origin(hints[f.name]) is Literal:
                value, choices = getattr(self, f.name), typing.get_args(hints[f.name])
                require(value in choices, f.name, value, f"must be one of {list(choices)}")
        for f in fields:  # inf and nan pass every range check
            if hints[f.name] in (float, float | None):
                value = getattr(self, f.name)
                ok = value is None or (isinstance(value, int | float) and math.isfinite(value))
                require(ok, f.name, value, "must be a finite number")
        for f in fields:
            if "read_with" in f.metadata:  # a key read only with another (read_with)
                key, rule = f.metadata["read_with"]
                value = getattr(self, f.name)
                shown = ",".join(value) if isinstance(value, tuple) else value
                require(bool(getattr(self, key)) or not value, f.name, shown, rule)
        self.check()

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the first value out of range (subclasses)."""

    def unread(self) -> set[str]:
        """The dotted keys these settings leave unused (subclasses): what :meth:`inapplicable` warns
        about. It decides nothing of the run's identity, which records them all."""
        return set()

    def inapplicable(self, given: set[str]) -> dict[str, str]:
        """Of the dotted keys in ``given`` (set explicitly), those this run does not read, with why:
        keys that shape results in general but that these settings leave unused (:meth:`unread`;
        and that are not at their default, which asks for nothing)."""
        unread = self.unread()
        defaults = flatten(type(self)().to_dict())
        values = without(flatten(self.to_dict()), self.NOT_IDENTITY)
        return {
            key: self.why_unused(key)
            for key in sorted(given)
            if key in values and key in unread and values[key] != defaults.get(key)
        }

    def why_unused(self, key: str) -> str:
        """A few words on why ``key`` does nothing with these settings (subclasses say more)."""
        return "the other settings leave it unused"

    def identity(self, job: str, inputs: dict[str, str]) -> RunIdentity:
        """The run's identity: :func:`~sembridge_ray.runtime.identity.run_identity` of these settings."""
        return run_identity(job, self.to_dict(), self.NOT_IDENTITY, inputs)

    def to_dict(self) -> JSONObject:
        """The config as a JSON object (sections nested, tuples as lists): what workers receive and
        YAML holds."""
        # the fields are JSON scalars, tuples of them and nested configs (all that coerce accepts)
        return cast(JSONObject, _plain(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Self:
        return _build(cls, data)

    def with_overrides(self, overrides: Sequence[str]) -> Self:
        """A copy with ``key.sub=value`` overrides applied (types coerced, unknown keys rejected; a
        section's keys also without it, ``alpha=2``)."""
        parts = (item.partition("=") for item in overrides)
        keyed = [f"{canonical_key(type(self), k.strip())}={v}" if sep else k for k, sep, v in parts]
        return type(self).from_dict(apply_overrides(self.to_dict(), keyed))

    def with_settings(self, **changes: Any) -> Self:
        """A copy with typed ``changes``, as :func:`dataclasses.replace` makes it (and checked so),
        a section's keys also given without it (``alpha=2`` for ``weighting.alpha``, see
        ``SHORTHANDS``)."""
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            section = _shorthand(type(self), key)
            if section is None:
                top[key] = value
            else:
                nested.setdefault(section, {})[key] = value
        for section, values in nested.items():
            top[section] = dataclasses.replace(top.get(section, getattr(self, section)), **values)
        return dataclasses.replace(self, **top)  # a dataclass (Config's subclasses are)


C = TypeVar("C", bound=Config)


def _plain(value: object) -> object:
    """A copy with every tuple a list and every mapping a dict, recursively (what YAML and JSON
    write)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def apply_overrides(data: Mapping[str, object], overrides: Sequence[str]) -> dict[str, object]:
    """Set ``a.b=value`` entries in a nested dict (a copy); values stay strings until coerced."""
    out = cast(dict[str, object], _plain(data))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        *parents, leaf = key.strip().split(".")
        node: dict[str, object] = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"unknown config key {key}: {part} is not a section")
            node = child
        node[leaf] = value
    return out


def load_preset(path: Path) -> dict[str, JSONValue]:
    """Read a YAML preset with every scalar kept as a string (no YAML 1.1 ``no`` -> False
    surprises). A file that is not UTF-8 or not YAML is a :class:`ConfigError` naming the file, line
    and column."""
    from sembridge_ray.text import text_lines

    if not path.is_file():
        raise ConfigError(f"config preset not found: {path}")
    try:
        text = "".join(line for _, line in text_lines(path))
    except InputError as err:  # not UTF-8: the message names the line
        raise ConfigError(f"config preset {err}") from None
    try:
        data = yaml.load(text, Loader=yaml.BaseLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_problem(path, text, err)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config preset {path} must hold a mapping")
    return data


def _yaml_problem(path: Path, text: str, err: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: ``file:line:column: what``. PyYAML's marks count from 0;
    its reader's errors (a control character) give an offset into ``text`` instead."""
    mark = getattr(err, "problem_mark", None)
    line, column = (mark.line, mark.column) if mark is not None else (None, None)
    if mark is None and isinstance(getattr(err, "position", None), int):
        before = text[: err.position]  # type: ignore[attr-defined]
        line, column = before.count("\n"), len(before) - (before.rfind("\n") + 1)
    where = str(path) if line is None or column is None else f"{path}:{line + 1}:{column + 1}"
    problem = getattr(err, "problem", None) or str(err).strip().splitlines()[0]
    context = getattr(err, "context", None)
    return f"config preset {where}: not valid YAML: {problem}" + (
        f" ({context})" if context else ""
    )


def merge(base: Mapping[str, object], delta: Mapping[str, object]) -> dict[str, object]:
    """Deep-merge ``delta`` into ``base`` (presets list only their deltas)."""
    out = dict(base)
    for key, value in delta.items():
        old = out.get(key)
        out[key] = (
            merge(old, value) if isinstance(value, Mapping) and isinstance(old, Mapping) else value
        )
    return out


def write_config(cfg: Config, path: Path) -> None:
    """Write the resolved config as YAML (safe_dump quotes strings that YAML would misread)."""
    from sembridge_ray.runtime.outputs import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))


def read_config(cls: type[C], path: Path) -> C:
    return cls.from_dict(load_preset(path))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FieldInfo:
    """What ``--help`` says about one config key."""

    type_name: str
    default: object
    doc: str
    choices: tuple[object, ...] = ()


@cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in the class body (PEP 257 attribute
    docstrings)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for pair in itertools.pairwise(body):
        match pair:  # an annotated name, then a string
            case ast.AnnAssign(target=ast.Name(id=name)), ast.Expr(ast.Constant(str(doc))):
                docs[name] = inspect.cleandoc(doc)
    return docs


def field_info(cls: type, values: Mapping[str, object] | None = None) -> dict[str, FieldInfo]:
    """Dotted key -> its type, default (from ``values`` when given: a preset's effective values),
    docstring and choices, recursing into nested configs."""
    out: dict[str, FieldInfo] = {}
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested = (values or {}).get(f.name)
            inner = field_info(tp, nested if isinstance(nested, Mapping) else None)  # type: ignore[arg-type]
            out.update({f"{f.name}.{k}": v for k, v in inner.items()})
            continue
        if values is not None and f.name in values:
            default = values[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        # a Literal's choices, or metadata={"choices": ...} (for tuples of names)
        literal = typing.get_origin(tp) is Literal
        choices = typing.get_args(tp) if literal else tuple(f.metadata.get("choices", ()))
        out[f.name] = FieldInfo(
            type_name=name, default=default, doc=docs.get(f.name, ""), choices=choices
        )
    return out


def dotted_keys(cls: type) -> list[str]:
    return list(field_info(cls))
