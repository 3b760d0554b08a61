"""A run's identity is its resolved config minus the operational keys (``NOT_IDENTITY``), its
inputs and the format version.

For the single jobs every key but the operational ones changes the fingerprint, and the fingerprint
is the sha256 of the canonical JSON of those settings, the inputs and ``FORMAT_VERSION``; for
``reproduce``, a key changes a planned stage's identity or what the demo's assets are built from.
No key may do neither unless it is documented as not shaping a result, and every documented key
must exist."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest

from sembridge_ray.embed_init.methods import METHODS
from sembridge_ray.recipes import JOBS, PRESET_DIR, job_spec, load_preset_file
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce import demo
from sembridge_ray.recipes.reproduce.baselines import BM25Config, FusionConfig
from sembridge_ray.recipes.reproduce.config import ReproduceConfig, parse_variant
from sembridge_ray.recipes.reproduce.grid import XLING_ASSETS, Identities, plan
from sembridge_ray.runtime.config import Config, ConfigError, dotted_keys, field_info
from sembridge_ray.runtime.identity import FORMAT_VERSION, RunIdentity, flatten


def exempt(key: str, not_identity: tuple[str, ...]) -> bool:
    return any(key == e or key.startswith(e + ".") for e in not_identity)


def leaf_types(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> the annotated type of the leaf field."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(leaf_types(tp, f"{prefix}{f.name}."))  # type: ignore[arg-type]
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


def perturbed(value: Any, tp: Any, key: str) -> Any:
    """Another valid value of the same type (the config's checks still hold)."""
    return perturbations(value, tp, key)[0]


def perturbations(value: Any, tp: Any, key: str) -> list[Any]:
    """Other values of the same type, the likeliest to pass the config's checks first."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return [a for a in typing.get_args(tp) if a != value]
    return [_perturbed(value, tp, key)]


def _perturbed(value: Any, tp: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return (
            perturbed(value, inner, key)
            if value is not None
            else {int: 7, float: 0.5, str: "x"}[inner]
        )
    if origin is tuple:
        choices = field_choices.get(key)
        if choices:
            extra = [c for c in choices if c not in value]
            return (*value, extra[0]) if extra else tuple(value[:-1])
        return (
            tuple(value[:-1]) if len(value) > 1 else (*value, "x=y" if "=" in str(value) else "5")
        )
    if tp is bool:
        return not value
    if tp is int:
        return value - 1 if value > 1 else value + 1
    if tp is float:
        return value * 0.5 if value > 0.5 else value + 0.25
    return f"{value}x"


field_choices: dict[str, tuple[Any, ...]] = {}


def set_key(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
        node[part] = dict(node[part])
        node = node[part]
    node[leaf] = list(value) if isinstance(value, tuple) else value
    return out


def _nested_copy(data: Any) -> Any:
    return {k: _nested_copy(v) for k, v in data.items()} if isinstance(data, Mapping) else data


def bases(cls: type[Config]) -> list[Config]:
    """The default config, then configs where a key refused at its default may change (``figures``
    needs ``dry_run``, ``bias_text`` needs ``bias: frequency``, ...)."""
    extra: dict[type, list[dict[str, Any]]] = {
        InitConfig: [{"dry_run": True}, {"bias": "frequency", "bias_text": "t.txt"}],
        ReproduceConfig: [{"dry_run": True}],
    }
    return [cls(), *(cls.from_dict(e) for e in extra.get(cls, []))]


def changed_config(cls: type[Config], key: str, tp: Any) -> tuple[Config, Config] | None:
    """(a base config, the same with ``key`` perturbed to a value its checks accept); None when no
    base accepts another value (``init.grid``, which is gone)."""
    for base in bases(cls):
        data = _nested_copy(base.to_dict())
        try:
            return base, first_valid(cls, data, key, perturbations(flatten(data)[key], tp, key))
        except AssertionError:
            continue
    return None


CONFIGS: dict[str, type[Config]] = {
    **{j: job_spec(j).config for j in JOBS},
    "bm25": BM25Config,
    "fusion": FusionConfig,
}
"""Every config a run's identity is made of: the jobs' and the baselines' (``reproduce``'s stages
are the jobs')."""


@pytest.mark.parametrize("job", [j for j in CONFIGS if j != "reproduce"])
def test_every_key_but_the_operational_ones_moves_the_fingerprint(job: str) -> None:
    """The identity is the resolved config minus its operational section (``NOT_IDENTITY``): every
    other key moves the fingerprint, whether or not these settings read it; an operational one
    changes nothing."""
    cls = CONFIGS[job]
    keys = dotted_keys(cls)
    operational = cls.NOT_IDENTITY
    assert [e for e in operational if not any(k == e or k.startswith(e + ".") for k in keys)] == []
    wrong = []
    for key, tp in leaf_types(cls).items():
        found = changed_config(cls, key, tp)
        if found is None:
            # only an operational key may be unchangeable
            assert exempt(key, operational), key
            continue
        base, changed = found
        moved = changed.identity(job, {}).fingerprint != base.identity(job, {}).fingerprint
        if moved == exempt(key, operational):
            wrong.append(key)
    assert wrong == [], f"{job}: keys whose effect on the identity is not their section's: {wrong}"


def plain_flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """The config as dotted keys, written apart from the code under test."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            out |= plain_flatten(getattr(value, f.name), f"{prefix}{f.name}.")
        return out
    return {prefix[:-1]: list(value) if isinstance(value, tuple) else value}


@pytest.mark.parametrize("job", CONFIGS)
def test_the_fingerprint_is_the_sha256_of_the_canonical_settings_inputs_and_version(
    job: str,
) -> None:
    cls = CONFIGS[job]
    cfg = cls()
    inputs = {"model": "sha256:0123", "data": "hub:dataset:x/y@abc"}
    settings = {k: v for k, v in plain_flatten(cfg).items() if not exempt(k, cls.NOT_IDENTITY)}
    payload = {
        "format_version": FORMAT_VERSION,
        "job": job,
        "settings": settings,
        "inputs": inputs,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    identity = cfg.identity(job, inputs)
    assert identity.settings == settings and identity.format_version == FORMAT_VERSION
    assert identity.fingerprint == hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]
    record = identity.to_dict()
    assert record["format_version"] == FORMAT_VERSION
    assert record["fingerprint"] == identity.fingerprint
    assert RunIdentity.from_dict(json.loads(json.dumps(record))) == identity


RECORDED_KEYS = {
    1: {
        "init": "f733fd77f7bffedd",
        "finetune": "2c86cb9dfd889ee4",
        "evaluate": "890af07e0e52169f",
        "malstm": "96f46bafca898cd8",
        "reproduce": "b5a70c242ced7309",
        "export": "fddb91d14e1b9cf3",
        "bm25": "608464164f388f3d",
        "fusion": "9b259b2cefc266b0",
    }
}
"""Per identity format version: each config's recorded keys (a digest of their sorted names)."""


@pytest.mark.parametrize("job", CONFIGS)
def test_a_change_of_the_recorded_keys_bumps_the_format_version(job: str) -> None:
    """A key added, renamed or dropped (or moved in or out of ``NOT_IDENTITY``) changes what every
    identity records: bump ``FORMAT_VERSION`` and record the new digests here under it, so that
    older outputs are refused, naming both versions, instead of compared key by key."""
    keys = sorted(CONFIGS[job]().identity(job, {}).settings)
    digest = hashlib.sha256(json.dumps(keys, separators=(",", ":")).encode()).hexdigest()[:16]
    assert digest == RECORDED_KEYS.get(FORMAT_VERSION, {}).get(job), (
        f"{job}: the recorded keys changed (digest {digest}): bump FORMAT_VERSION "
        f"(sembridge_ray/runtime/identity.py) to {FORMAT_VERSION + 1} and add its digests to RECORDED_KEYS"
    )


def first_valid(cls: type[Config], data: dict[str, Any], key: str, values: list[Any]) -> Config:
    """The config with ``key`` set to the first of ``values`` its checks accept (a method whose
    recipe fixes a key the base sets otherwise, e.g. sembridge_plus against bridge_space=abtt, is
    refused and the next one tried)."""
    errors = []
    for value in values:
        try:
            return cls.from_dict(set_key(data, key, value))
        except ConfigError as e:
            errors.append(str(e))
    raise AssertionError(f"{key}: no perturbation passes the checks: {errors}")


def stage_fingerprints(cfg: ReproduceConfig, files: dict[str, Path]) -> dict[str, Any]:
    """Everything a reproduction's results depend on: each planned stage's identity and the demo
    assets' record."""
    planned = plan(
        cfg, 0.0, files=files, identify=Identities(compute=lambda kind, name: f"{kind}:{name}")
    )
    found: dict[str, Any] = {
        f"{c}/{s.name}": s.identity.fingerprint for c, s in planned.all_stages()
    }
    if cfg.preset in ("demo", "xling"):
        names = demo.ASSETS if cfg.preset == "demo" else XLING_ASSETS
        found |= {f"assets/{n}": demo.asset_settings(demo.ASSETS[n], cfg.demo) for n in names}
    return found | {f"failed/{c}": e for c, e in planned.failures.items()}


@pytest.mark.parametrize("preset", ["paper", "demo", "quick", "settings", "convergence", "xling"])
def test_every_key_of_the_reproduction_reaches_a_stage_identity_or_is_documented(
    preset: str, tmp_path: Path
) -> None:
    base = load_preset_file(PRESET_DIR / f"reproduce_{preset}.yaml")
    assert isinstance(base, ReproduceConfig)
    base = dataclasses.replace(base, output=str(tmp_path / "root"))
    # 2 models x 1 language keep every key's effect visible at a tenth of the cells
    if base.preset == "paper":
        base = dataclasses.replace(base, models=base.models[:2], languages=base.languages[:1])
    # both sources, so the MiniLM SPLADE's training settings (demo.source_*) are live too
    if base.preset == "xling":
        models = ("splade-tiny", "minilm-splade")
        base = dataclasses.replace(base, models=models, languages=base.languages[:2])
    info = field_info(ReproduceConfig)
    field_choices.clear()
    field_choices.update({k: fi.choices for k, fi in info.items() if fi.choices})
    files = {name: tmp_path / "assets" / asset.path for name, asset in demo.ASSETS.items()}
    documented = ReproduceConfig.NOT_IDENTITY
    keys = dotted_keys(ReproduceConfig)
    assert [e for e in documented if not any(k == e or k.startswith(e + ".") for k in keys)] == []
    before = stage_fingerprints(base, files)
    inert = []
    for key, tp in leaf_types(ReproduceConfig).items():
        section, _, name = key.partition(".")
        if key == "preset" or exempt(key, documented):
            continue
        if section in ("init", "finetune", "evaluate") and exempt(
            name, type(getattr(base, section)).NOT_IDENTITY
        ):
            continue  # the stage job's own documented exemptions (resources, caches, ...)
        if base.preset == "paper" and section == "demo":
            # the miniature's settings do nothing on the hub's assets (DemoSettings says so)
            continue
        if base.preset in ("demo", "xling") and key == "miracl_mirror":
            continue  # only the paper preset's MIRACL cells read it
        if base.preset == "xling" and key in ("demo.test_pairs", "demo.target_vocab"):
            # the cross-lingual miniature builds neither the SICK retrieval set nor the BPE target
            continue
        recipes = [METHODS[parse_variant(m).method].recipe for m in base.methods]
        if section == "init" and any(name.removeprefix("weighting.") in r for r in recipes):
            # a listed method's recipe fixes it, so any other value is refused (the other presets
            # cover it)
            continue
        if base.preset != "xling" and key == "xquad_dir":
            continue  # only the cross-lingual miniature reads XQuAD
        if key == "seed_methods" and base.seeds == 1:
            continue  # which entries run the seeds: with one seed, none more
        data = _nested_copy(base.to_dict())
        try:
            changed = ReproduceConfig.from_dict(
                set_key(data, key, perturbed(flatten(data)[key], tp, key))
            )
        except ValueError as err:
            pytest.fail(f"{key}: the perturbed value is invalid: {err}")
        try:
            after = stage_fingerprints(changed, files)
        except (KeyError, ValueError):
            # the plan itself changed: this key picks the cells' inputs (models, languages, ...)
            continue
        if after == before:
            inert.append(key)
    assert inert == [], (
        f"{preset}: keys that shape no stage and are not in ReproduceConfig.NOT_IDENTITY: {inert}"
    )
