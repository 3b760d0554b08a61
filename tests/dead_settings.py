"""The dead-setting check's machinery, shared by ``tests/unit/test_dead_settings.py`` (init,
fine-tuning, MaLSTM, in-process) and ``tests/ray/test_dead_settings.py`` (evaluate, and
fine-tuning's worker count, on Ray).

For a job, every config key is either exempt (named with the reason: it selects what the job does
rather than what it computes, or another test shows it), or checked against the job's output on tiny
fixtures:

- a key the run reads (in the first :attr:`Harness.variants` where it does: not in its job's
  ``NOT_IDENTITY`` nor in the config's ``unread()``) is perturbed, and the output must change;
- a key the identity leaves out (its job's ``NOT_IDENTITY``) is perturbed on the default settings,
  and the output must not change (bit for bit, or within float rounding for the keys of
  :attr:`Harness.rounding`, which change how the work is cut); nor may a key the default settings
  declare unread (``unread()``, what the ``does nothing`` warning names), though the identity,
  which records every other key, moves.

An output is what the job computed: its files, parsed where they carry wall-clock times or paths,
which are left out (:func:`files_of`)."""

from __future__ import annotations

import json
import re
import shutil
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sembridge_ray.runtime.config import Config, ConfigError, dotted_keys
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import flatten
from tests.unit.test_identity_coverage import leaf_types, perturbations, set_key

Output = dict[str, Any]
TIMES = (
    "seconds",
    "timings",
    "examples_per_s",
    "dev_seconds",
    "finished_at",
    "started",
    "started_at",
)
"""Keys holding wall-clock figures, wherever they sit in a JSON artefact: no setting decides
them."""


@dataclass(kw_only=True)
class Harness:
    """How to check one job: its config, the variants that make its conditional keys live, how to
    run it."""

    job: str
    cls: type[Config]
    base: dict[str, Any]
    """The default settings of the check (tiny fixtures): overrides of the dataclass defaults."""
    run: Callable[[Config, Path], Output]
    """Runs the config into a fresh directory; returns its output."""
    variants: list[dict[str, Any]] = field(default_factory=list)
    """Further overrides of ``base`` under which conditional keys are read (another method, eval
    set, ...)."""
    exempt: dict[str, str] = field(default_factory=dict)
    """Key (or section) -> why this check does not perturb it."""
    rounding: tuple[str, ...] = ()
    """Keys that change only how work is cut: their output is compared within float rounding."""
    values: dict[str, Any] = field(default_factory=dict)
    """Key -> the perturbed value to use (where the generic perturbation would be inert or
    invalid)."""
    where: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Key -> the overrides of ``base`` under which it is perturbed to show its effect (a stopping
    rule needs a run that stops early); default: the first variant that reads it."""
    copies: dict[str, Callable[[Path, Path], Path]] = field(default_factory=dict)
    """Input path keys -> (the input, a fresh directory) -> a copy elsewhere with the same content
    and name."""
    inputs: Callable[[Config], dict[str, str]] = lambda cfg: {}
    """The job's identities of the config's inputs (by content), as the job records them."""

    def identity(self, cfg: Config) -> str:
        return cfg.identity(self.job, self.inputs(cfg)).fingerprint

    def config(self, overrides: Mapping[str, Any]) -> Config:
        data: dict[str, Any] = {}
        for key, value in {**flatten(self.base), **flatten(dict(overrides))}.items():
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return self.cls.from_dict(data)


def reads(cfg: Config, key: str) -> bool:
    """Whether a run of ``cfg`` reads ``key``: not operational, and not declared unread."""
    return not exempt(key, cfg.NOT_IDENTITY) and key not in cfg.unread()


def exempt(key: str, names: Mapping[str, str] | tuple[str, ...]) -> bool:
    return any(key == e or key.startswith(e + ".") for e in names)


def perturbed(h: Harness, cfg: Config, key: str) -> Config:
    """``cfg`` with ``key`` set to another value its checks accept."""
    data = cfg.to_dict()
    given = [h.values[key]] if key in h.values else None
    candidates = given or perturbations(flatten(data)[key], leaf_types(h.cls)[key], key)
    errors = []
    for value in candidates:
        try:
            return h.cls.from_dict(set_key(dict(data), key, value))
        except ConfigError as err:
            errors.append(str(err))
    raise AssertionError(f"{h.job}: {key}: no perturbation passes the checks: {errors}")


@dataclass
class Runs:
    """Outputs of the configs run so far (the same config is run once)."""

    h: Harness
    root: Path
    done: dict[str, Output] = field(default_factory=dict)

    def __call__(self, cfg: Config) -> Output:
        key = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
        if key not in self.done:
            self.done[key] = self.h.run(cfg, self.root / f"run-{len(self.done)}")
        return self.done[key]


def check(h: Harness, root: Path) -> list[str]:
    """Every key of ``h``'s job checked (see the module docstring); the problems found, one line
    each.

    A key is perturbed where it shows (its :attr:`Harness.where`, else the first variant that
    reads it) and there the output must change; and it is perturbed on the default settings, where
    the output must not change when the identity does not (an operational key), nor when the
    settings declare the key unread."""
    runs = Runs(h, root)
    default = h.config({})
    variants = [default, *(h.config(v) for v in h.variants)]
    problems = []
    for key in dotted_keys(h.cls):
        if exempt(key, h.exempt):
            continue
        live = (
            h.config(h.where[key])
            if key in h.where
            else next((v for v in variants if reads(v, key)), default)
        )
        for base in dict.fromkeys([default, live]):  # each once
            changed = _with_copied_inputs(h, base, key, root)
            try:
                moved = h.identity(changed) != h.identity(base)
                if base is not live:
                    runs(changed)
            # refused by the job on the default settings (select=best needs --eval)
            except InputError:
                if base is live:
                    raise
                continue
            if moved and base is live and same(runs(base), runs(changed)):
                problems.append(f"{h.job}: {key} changes the run's identity but not its output")
            elif not moved and not same(runs(base), runs(changed), rounding=key in h.rounding):
                problems.append(f"{h.job}: {key} changes the output but not the run's identity")
            elif (
                moved
                and base is not live
                and not reads(base, key)
                and not same(runs(base), runs(changed), rounding=key in h.rounding)
            ):
                problems.append(f"{h.job}: {key} changes the output where it is declared unread")
    return problems


def _with_copied_inputs(h: Harness, cfg: Config, key: str, root: Path) -> Config:
    """``cfg`` with ``key`` perturbed; an input path is replaced by a copy of the same content
    elsewhere."""
    if key not in h.copies:
        return perturbed(h, cfg, key)
    original = Path(str(flatten(cfg.to_dict())[key]))
    copy = h.copies[key](original, root / "copies" / key)
    return h.cls.from_dict(set_key(cfg.to_dict(), key, str(copy)))


def copy_input(original: Path, where: Path) -> Path:
    """A copy of a file or directory under ``where``, with the same name (what a card shows of a
    path)."""
    target = where / original.name
    if not target.exists():
        where.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if original.is_dir() else shutil.copy2)(original, target)
    return target


def files_of(root: Path, skip: tuple[str, ...] = ()) -> Output:
    """Every file under ``root`` as an output: JSON without wall-clock keys or absolute paths,
    safetensors as arrays, TSV and text as text, anything else as bytes; ``skip``: relative paths or
    names left out."""
    out: Output = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if (
            rel in skip
            or path.name in skip
            or any(part.startswith((".tmp-", ".lock")) for part in Path(rel).parts)
        ):
            continue
        if path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            out[rel] = load_file(str(path))
        elif path.suffix == ".json":
            out[rel] = _without_times(json.loads(path.read_text(encoding="utf-8")), root)
        elif path.suffix == ".jsonl":
            out[rel] = [
                _without_times(json.loads(x), root)
                for x in path.read_text(encoding="utf-8").splitlines()
            ]
        elif path.suffix in (".md", ".tsv", ".trec", ".txt", ".yaml"):
            text = path.read_text(encoding="utf-8").replace(str(root), "<root>")
            # a report's wall-clock lines
            out[rel] = re.sub(r"\bseconds: [0-9.]+", "seconds: #", text)
        elif path.suffix in (".png",):
            # a figure is drawn from the tables compared above; its bytes carry the renderer's
            # metadata
            continue
        else:
            out[rel] = path.read_bytes()
    return out


def _without_times(value: Any, root: Path) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v, root) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_without_times(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(str(root), "<root>")
    return value


def same(a: Any, b: Any, rounding: bool = False) -> bool:
    """Equal outputs: bit for bit, or with ``rounding`` floats within 1e-5 (relative) and texts
    where every number agrees to that."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rounding) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rounding) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if rounding and np.issubdtype(a.dtype, np.floating):
            return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))
        return bool(np.array_equal(a, b))
    if rounding and isinstance(a, float) and isinstance(b, float):
        return bool(np.isclose(a, b, rtol=1e-5, atol=1e-6))
    if rounding and isinstance(a, str) and isinstance(b, str) and a != b:
        return _numbers_close(a, b)
    return bool(a == b) if not isinstance(a, np.ndarray) else False


def _numbers_close(a: str, b: str) -> bool:
    number = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
    if number.sub("#", a) != number.sub("#", b):
        return False
    x = [float(v) for v in number.findall(a)]
    y = [float(v) for v in number.findall(b)]
    return len(x) == len(y) and bool(np.allclose(x, y, rtol=1e-4, atol=1e-5))


def every_key_is_covered(h: Harness) -> list[str]:
    """Keys neither exempt nor read by any variant nor in NOT_IDENTITY would escape the check: none
    may. Nor may the harness name a key the config does not have (``alpha`` for ``weighting.alpha``:
    its value would go unused)."""
    variants = [h.config({}), *(h.config(v) for v in h.variants)]
    keys = dotted_keys(h.cls)
    named = [*h.rounding, *h.values, *h.where, *h.copies]  # (exempt: a list shared by the jobs)
    return [
        k
        for k in keys
        if not exempt(k, h.exempt)
        and not any(reads(v, k) for v in variants)
        and not exempt(k, h.cls.NOT_IDENTITY)
        and k not in _unused_by_default(h)
    ] + [
        f"{k} (no such key)"
        for k in named
        if not any(x == k or x.startswith(k + ".") for x in keys)
    ]


def _unused_by_default(h: Harness) -> set[str]:
    cfg = h.config({})
    return {k for k in dotted_keys(h.cls) if not reads(cfg, k)}


def literal_values(cls: type, key: str) -> tuple[Any, ...]:
    return typing.get_args(leaf_types(cls)[key])
