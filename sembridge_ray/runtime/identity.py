"""A run's identity: everything that shapes its result, and the fingerprint a rerun is compared by.

An identity is one function of a run, :func:`run_identity`, and has three parts:

- **settings**: the resolved config, flattened to dotted keys, minus its operational section (the
  keys that change nothing the run computes: its output path, ``overwrite``, workers, checkpoint and
  report cadence, cache directories, and the paths of inputs, which enter as **inputs**; each config
  lists them in ``NOT_IDENTITY``). Every other key is recorded, whether or not these settings read
  it: two runs that differ only in a key their method leaves unused are two runs;
- **inputs**: one identity string per input (model, tokenizer, bridge, dataset, …), so the same path
  with new content is a new run and a moved or copied input is the same one:

  | input                                  | identity                                                             |
  |----------------------------------------|----------------------------------------------------------------------|
  | a finished output of this project      | ``run:<job>:<fingerprint>`` of the run that wrote it (manifest verified) |
  | any other local file or directory      | ``sha256:…`` over relative names and contents: files up to 64 MiB are |
  |                                        | hashed whole, larger ones by size plus their first and last MiB      |
  | a hub id                               | ``hub:<type>:<id>@<commit>``: the commit the hub (or, offline, the   |
  |                                        | local HF cache) resolves ``main`` to                                 |

- **format version**: :data:`FORMAT_VERSION`, bumped whenever what is recorded changes (a key
  added, renamed or dropped, a value's spelling). An output recorded in another format is never
  compared key by key: a rerun is refused, naming both versions, and ``--overwrite`` replaces it.

The fingerprint is the sha256 of the canonical JSON (:func:`canonical_json`) of
``{"format_version", "job", "settings", "inputs"}``.

The sampled digest of large files keeps a rerun's check cheap on multi-GB corpora and weights; it
cannot see an edit that keeps a file's size and leaves its first and last MiB alone. A project
output is identified by its run, whose manifest holds full sha256 checksums.

**Inputs cannot change under a run.** A job identifies its inputs when it starts, and its workers
load them later: an ``--overwrite`` of an input's output (or an edit of a plain directory) in
between would make a result whose ``identity.json`` names other inputs than the ones it was computed
from. :func:`require_unchanged` identifies the local inputs again after they were loaded, and before
anything computed from them is marked complete or cached; a change fails the run with
:class:`InputChanged`, and nothing of it is kept as finished."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from sembridge_ray.json_types import JSONValue
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.manifest import output_fingerprint

WHOLE_FILE_LIMIT = 64 << 20
SAMPLE = 1 << 20
RepoType = Literal["model", "dataset"]
FORMAT_VERSION = 1
"""The format of the identities this version records (``identity.json``'s ``format_version``);
bump it whenever the recorded settings change. Identities written before it have none."""


class IdentityRecord(TypedDict):
    """``identity.json``: what :meth:`RunIdentity.to_dict` writes (``fingerprint`` is derived, so
    reading ignores it; identities written before format versions have no ``format_version``)."""

    job: str
    format_version: NotRequired[int]
    fingerprint: NotRequired[str]
    settings: Mapping[str, object]
    inputs: NotRequired[dict[str, str]]


def canonical_json(value: object) -> str:
    """The one JSON spelling of ``value`` a fingerprint hashes: keys sorted, no spaces, UTF-8
    text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True, kw_only=True)
class RunIdentity:
    """What shapes one run's result: ``settings`` (dotted key -> value) and ``inputs`` (name ->
    identity), recorded in format ``format_version``."""

    job: str
    settings: Mapping[str, object]
    """A config's are JSON values (:func:`run_identity`); anything else is fingerprinted as its
    str."""
    inputs: dict[str, str] = field(default_factory=dict)
    format_version: int | None = FORMAT_VERSION
    """None: recorded before identities had a format version."""

    @property
    def fingerprint(self) -> str:
        payload = {k: getattr(self, k) for k in ("format_version", "job", "settings", "inputs")}
        return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()[:24]

    def to_dict(self) -> IdentityRecord:
        record: IdentityRecord = {
            "job": self.job,
            "fingerprint": self.fingerprint,
            "settings": self.settings,
            "inputs": self.inputs,
        }
        if self.format_version is not None:
            record["format_version"] = self.format_version
        return record

    @classmethod
    def from_dict(cls, data: IdentityRecord) -> RunIdentity:
        version = data.get("format_version")
        return cls(
            job=str(data["job"]),
            settings=dict(data["settings"]),
            inputs=dict(data.get("inputs", {})),
            format_version=version if isinstance(version, int) else None,
        )

    def format_change(self, old: RunIdentity) -> str | None:
        """When ``old`` was recorded in another format than this identity: both versions, in a
        few words (its settings cannot be compared key by key); else None."""
        if old.format_version == self.format_version:
            return None
        was = (
            "no format version"
            if old.format_version is None
            else f"format version {old.format_version}"
        )
        return f"its identity.json has {was}, this version records format version {self.format_version}"

    def differences(self, old: RunIdentity) -> list[str]:
        """``key: old → new`` for every setting and input that differs from ``old`` (settings
        first)."""
        out = []
        for prefix, new_map, old_map in (
            ("", self.settings, old.settings),
            ("inputs.", self.inputs, old.inputs),
        ):
            for key in sorted(set(new_map) | set(old_map)):
                was, now = old_map.get(key, _MISSING), new_map.get(key, _MISSING)
                if now != was:
                    out.append(f"{prefix}{key}: {_show(was)} → {_show(now)}")
        if self.job != old.job:
            out.insert(0, f"job: {old.job} → {self.job}")
        return out


def run_identity(
    job: str,
    config: Mapping[str, JSONValue],
    operational: tuple[str, ...],
    inputs: Mapping[str, str],
) -> RunIdentity:
    """A run's identity: its resolved ``config`` (a config's ``to_dict()``) flattened to dotted
    keys, minus every key in (or in a section of) ``operational``, with its ``inputs`` (name ->
    identity) and :data:`FORMAT_VERSION`."""
    return RunIdentity(job=job, settings=without(flatten(config), operational), inputs=dict(inputs))


_MISSING = object()


def _show(value: object) -> str:
    if value is _MISSING:
        return "(unset)"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def flatten(data: Mapping[str, JSONValue], prefix: str = "") -> dict[str, JSONValue]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, JSONValue] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def without(settings: Mapping[str, JSONValue], excluded: tuple[str, ...]) -> dict[str, JSONValue]:
    """``settings`` minus every key equal to, or inside the section of, an ``excluded`` dotted
    key."""
    return {
        k: v
        for k, v in settings.items()
        if not any(k == e or k.startswith(e + ".") for e in excluded)
    }


# ---- input identities
# ---------------------------------------------------------------------------------------


def path_identity(path: Path) -> str:
    """A local file or directory: the fingerprint of the run that wrote it, else a digest of its
    contents."""
    path = Path(path).expanduser()
    run = output_fingerprint(path)
    if run is not None:
        return run
    root = path.resolve()
    files = (
        [root]
        if root.is_file()
        else sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
    )
    listing = tuple(
        (str(f.relative_to(root)) if f != root else f.name, f.stat().st_size, f.stat().st_mtime_ns)
        for f in files
    )
    return _content_digest(str(root), listing)


@lru_cache(maxsize=256)
def _content_digest(root: str, listing: tuple[tuple[str, int, int], ...]) -> str:
    """Cached per (names, sizes, mtimes): a grid asks for the same large inputs many times."""
    base = Path(root)
    digest = hashlib.sha256()
    for rel, _size, _mtime in listing:
        item = base if base.is_file() else base / rel
        digest.update(f"{rel}\0{file_digest(item)}\n".encode())
    return "sha256:" + digest.hexdigest()[:32]


def file_digest(path: Path, full: bool = False) -> str:
    """sha256 of the whole file up to :data:`WHOLE_FILE_LIMIT` (or ``full``); else size + first and
    last MiB."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        if full or size <= WHOLE_FILE_LIMIT:
            while block := fh.read(1 << 22):
                digest.update(block)
            return digest.hexdigest()
        digest.update(fh.read(SAMPLE))
        fh.seek(size - SAMPLE)
        digest.update(fh.read(SAMPLE))
    return f"{size}:{digest.hexdigest()}"


def hub_identity(repo: str, repo_type: RepoType = "model") -> str:
    """``hub:<type>:<id>@<commit>``; an id the hub (or, offline, the local cache) does not know is
    an InputError."""
    return f"hub:{repo_type}:{repo}@{hub_revision(repo, repo_type)}"


@lru_cache(maxsize=64)
def hub_revision(repo: str, repo_type: RepoType = "model") -> str:
    from huggingface_hub import HfApi, constants, snapshot_download

    try:
        if constants.HF_HUB_OFFLINE:
            return Path(snapshot_download(repo, repo_type=repo_type, local_files_only=True)).name
        sha = HfApi().repo_info(repo, repo_type=repo_type).sha
        if sha is None:
            raise ValueError("no commit")
        return sha
    except Exception as err:  # the hub client raises many types; all mean "cannot have this repo"
        where = (
            "offline and not in the local Hugging Face cache" if constants.HF_HUB_OFFLINE else "hub"
        )
        raise InputError(
            f"{repo_type} {repo!r} not found (not a local path; {where}: {type(err).__name__})"
        ) from None


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` that is not a path on this machine."""
    return spec.count("/") == 1 and not spec.startswith(("/", ".", "~")) and not Path(spec).exists()


def model_identity(spec: str, what: str = "model") -> str:
    """A model, tokenizer or bridge given as a local directory or a hub id (bundled names are
    resolved to their directories at the job's boundary, before this); anything else names
    itself."""
    path = Path(spec).expanduser()
    if path.exists():
        return path_identity(path)
    if looks_like_hub_id(spec):
        return hub_identity(spec, "model")
    raise InputError(f"{what} {spec!r} not found (neither a local path nor a hub id org/name)")


class InputChanged(InputError):
    """An input was replaced or edited while a run was reading it."""


def require_unchanged(recorded: Mapping[str, str], paths: Mapping[str, str]) -> None:
    """Raise :class:`InputChanged` for the first input of ``paths`` (name -> local path) whose
    identity is no longer the one ``recorded`` (name -> identity, as the run recorded it when it
    started). Inputs that are not local files or directories (hub ids) are not checked; a project
    output is checked by its manifest (every file's sha256), any other path by its content
    digest."""
    for name, spec in paths.items():
        was = recorded.get(name, "")
        if not was.startswith(("run:", "sha256:")):
            continue
        path = Path(spec).expanduser()
        now = path_identity(path) if path.exists() else "(gone)"
        if now != was:
            raise InputChanged(
                f"input {name} {spec} changed while this run was reading it (it was {was}, it is now {now}: "
                "replaced by an --overwrite, or edited); nothing of this run is marked complete: run it again"
            )


Pin = Callable[[], None]
"""Raises :class:`InputChanged` when an input a run read is no longer the one its identity names."""


def pin(recorded: Mapping[str, str], paths: Mapping[str, str]) -> Pin:
    """:func:`require_unchanged` bound to a run's inputs: what every reader of a model or a dataset
    calls after reading it and before it caches (under the inputs' identities) or marks complete
    anything computed from it. The encodings shared between jobs take one as a required argument
    (:func:`sembridge_ray.retrieval.encode.encode_corpus`), so no job can fill that cache
    unpinned."""
    return functools.partial(require_unchanged, dict(recorded), dict(paths))
