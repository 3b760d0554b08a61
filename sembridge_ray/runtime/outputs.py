"""The output contract every job and every stage of ``jobs.reproduce`` follows.

- **Atomic artefacts.** Files and directories are written to a temporary sibling, then renamed.
- **A run's identity.** ``identity.json``, written when a run starts, holds its
  :class:`~sembridge_ray.runtime.identity.RunIdentity` (the settings and inputs that shape the result, and
  their fingerprint).
- **A manifest, last.** ``_SUCCESS`` lists the sha256 of every artefact and the run's fingerprint; a
  directory is complete only when every listed file is present with the same checksum.
- **Reruns.** :func:`claim_output` decides: same fingerprint and a verifying manifest -> skip; an
  unfinished run with the same fingerprint -> resume; other settings -> refuse, naming the keys that
  differ (old → new), and leave the directory untouched, unless ``overwrite``; an identity recorded
  in another format (:data:`~sembridge_ray.runtime.identity.FORMAT_VERSION`) -> refuse, naming both
  versions, unless ``overwrite``. Paths are not part of the identity, so a finished output that was
  moved or copied still skips.
- **Atomic overwrite.** ``overwrite`` builds the new run in ``<output>.overwrite-staging`` (same
  parent, so the same filesystem; its own lock and identity) while the old output stays complete,
  verifiable and readable. Only after the new run's ``_SUCCESS`` do two renames swap it in (old ->
  ``<output>.overwrite-previous``, staged -> output, then the old copy is removed); a crash between
  them is completed by the next claim (:func:`settle`). So a crash at any moment leaves the old
  complete output or the new one. The same ``overwrite`` command after a crash resumes the staged
  run; a plain rerun of the old settings still skips on the old output (and says a staging is
  there).
- **One writer.** The claim holds the directory's lock (:mod:`sembridge_ray.runtime.locks`) while the run
  writes (with ``overwrite``, the output's and the staging directory's).
- **Readable artefacts.** The manifest step gives every artefact the permissions the umask allows
  (0644 / 0755 under the usual 022), whatever the library that wrote it chose (safetensors,
  tempfile: 0600).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sembridge_ray.runtime.atomic import (
    atomic_path,
    atomic_write_json,
    atomic_write_text,
    remove,
    sha256_file,
)
from sembridge_ray.runtime.errors import InputError, environment_errno
from sembridge_ray.runtime.identity import RunIdentity
from sembridge_ray.runtime.locks import LOCK, OutputLock, check_unlocked
from sembridge_ray.runtime.manifest import (
    IDENTITY,
    SUCCESS,
    Manifest,
    is_complete,
    output_fingerprint,
    read_manifest,
    write_success,
)

log = logging.getLogger(__name__)
# what callers take from here: the claim, and the file and manifest helpers it builds on
__all__ = [
    "IDENTITY",
    "LOCK",
    "SUCCESS",
    "Claim",
    "atomic_path",
    "atomic_write_json",
    "atomic_write_text",
    "claim_output",
    "is_complete",
    "output_fingerprint",
    "sha256_file",
    "write_success",
]


def read_identity(out_dir: Path) -> RunIdentity | None:
    try:
        return RunIdentity.from_dict(
            json.loads((Path(out_dir) / IDENTITY).read_text(encoding="utf-8"))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---- claiming an output for a run
# ---------------------------------------------------------------------------


class SettingsChanged(InputError):
    """The output holds a run with another identity."""


def staging_dir(out_dir: Path) -> Path:
    """``<output>.overwrite-staging``: where ``--overwrite`` builds the new run, beside the old."""
    return Path(out_dir).with_name(Path(out_dir).name + ".overwrite-staging")


def previous_dir(out_dir: Path) -> Path:
    """``<output>.overwrite-previous``: the old output between the two renames of the swap."""
    return Path(out_dir).with_name(Path(out_dir).name + ".overwrite-previous")


def check_output_path(out_dir: Path) -> None:
    """Fail, naming the path, when ``out_dir`` cannot be an output directory here (read-only;
    creates nothing)."""
    out_dir = Path(out_dir)
    if out_dir.is_symlink() and not out_dir.exists():
        raise InputError(
            f"output {out_dir} is a dangling symbolic link (to {os.readlink(out_dir)})"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"output {out_dir} exists and is not a directory")
    existing = out_dir
    while not existing.exists():
        if existing.is_symlink():
            raise InputError(
                f"output {out_dir}: {existing} is a dangling symbolic link (to {os.readlink(existing)})"
            )
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"output {out_dir}: {existing} is a file, not a directory")
    # /proc and /sys take no new directories whatever their mode says (root sees them writable)
    pseudo = existing.resolve().parts[1:2] in (("proc",), ("sys",))
    if not os.access(existing, os.W_OK | os.X_OK) or pseudo:
        readonly = os.statvfs(existing).f_flag & os.ST_RDONLY
        raise InputError(
            f"output {out_dir}: {existing} is not writable "
            f"({'read-only file system' if readonly else 'permission denied'})"
        )


def require_apart(out_dir: Path, inputs: Mapping[str, str], what: str = "output") -> None:
    """InputError naming the output when it is, lies inside, or holds a local input the run reads
    (name -> path): writing there would change the input (an output inside a model makes it another
    model, and the run fails saying so at every rerun) or remove it (an unfinished run's leftovers
    are cleared, ``--overwrite`` replaces the directory). Hub ids, dataset specs: not checked."""
    out = Path(out_dir).expanduser().resolve()
    for name, spec in inputs.items():
        path = Path(spec).expanduser()
        if not spec or not path.exists():
            continue
        path = path.resolve()
        if out.is_relative_to(path):
            raise InputError(
                f"{what} {out_dir} is inside the {name} {spec} this run reads (writing there would "
                f"change the {name}): choose one outside it"
            )
        if path.is_relative_to(out):
            raise InputError(
                f"{what} {out_dir} holds the {name} {spec} this run reads (the run clears or "
                f"replaces its {what}): choose another"
            )


def followed(out_dir: Path, say: bool = True) -> Path:
    """``out_dir`` itself, or where it points when it is a symbolic link to a directory: the run,
    its staging directory and an ``--overwrite`` swap all happen at the target (beside it, on its
    filesystem), and the link keeps pointing at the output; replacing the link with a local
    directory would leave the old run complete at the target."""
    out_dir = Path(out_dir)
    if out_dir.is_symlink() and out_dir.is_dir():
        target = out_dir.resolve()
        if say:
            log.info("output %s is a link to %s: the run writes there", out_dir, target)
        return target
    return out_dir


def _entries(out_dir: Path) -> set[str]:
    """The names in ``out_dir`` but its lock."""
    if not out_dir.is_dir():
        return set()
    return {p.name for p in out_dir.iterdir() if not p.name.startswith(LOCK)}


def _foreign(out_dir: Path) -> bool:
    """A non-empty directory with none of this project's files: never written into or cleared."""
    names = _entries(out_dir)
    return bool(names) and not names & {IDENTITY, SUCCESS, "config.yaml"}


def conflict(out_dir: Path, new: RunIdentity) -> str | None:
    """What keeps ``out_dir`` from taking a run of ``new`` without ``overwrite``, in a few words
    (the settings that differ, old → new); None when nothing does: it is absent, empty, or holds a
    run with the same identity."""
    out_dir = Path(out_dir)
    settle(out_dir)
    if not _entries(out_dir):
        return None
    if _foreign(out_dir):
        return "not empty, and not written by sembridge_ray"
    old = read_identity(out_dir)
    if old is None:
        return "no recorded identity: an older version wrote it"
    if change := new.format_change(old):
        return change
    if not (changes := new.differences(old)):
        return None
    return "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")


def refusal(out_dir: Path, new: RunIdentity) -> str | None:
    """The one-line error for :func:`conflict`, or None."""
    if (detail := conflict(out_dir, new)) is None:
        return None
    if _foreign(Path(out_dir)):
        return f"output {out_dir} is {detail}; choose an empty or new directory"
    hint = "rerun with --overwrite to replace it, or choose another output"
    staged = read_identity(staging_dir(out_dir))
    if staged is not None and staged.fingerprint == new.fingerprint:
        hint = f"an interrupted --overwrite with these settings is staged in {staging_dir(out_dir)}; rerun with "
        hint += "--overwrite to finish it"
    other = "with other settings"
    if (old := read_identity(out_dir)) and new.format_change(old):  # not comparable with these
        other = "that this version cannot compare"
    run = "an unfinished"
    if read_manifest(out_dir) is not None:  # one that verifies, or one that no longer does
        run = "a finished" if is_complete(out_dir) else "a damaged"
    return f"output {out_dir} holds {run} run {other} ({detail}); {hint}"


@dataclass(kw_only=True)
class Claim:
    """An output directory held by this run.

    ``path`` is where the run writes: the output itself, or its staging directory when
    ``--overwrite`` replaces another run (then :meth:`finish` swaps it into ``output`` once
    complete). ``done``: already complete with the same identity (skip it; read it at ``output``);
    ``resumed``: an unfinished run with the same identity was there (keep its partial work)."""

    path: Path
    identity: RunIdentity
    output: Path
    done: bool = False
    resumed: bool = False
    _swap: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def staged(self) -> bool:
        return self.path != self.output

    def finish(self, exclude: tuple[str, ...] = (), **extra: object) -> Manifest:
        """Mark the run complete: publish the artefacts, write the manifest, last; a staged run then
        replaces the old output (two renames, see :func:`swap_into_place`)."""
        manifest = write_success(self.path, exclude=exclude, **extra)
        if self._swap is not None:
            self._swap()
        return manifest

    def restart(self, keep: tuple[str, ...] = ()) -> None:
        """Build the run again in :attr:`path`: what an unfinished run of the same identity left
        there (a crash, or a result the job refused to mark complete) goes, all but the lock, the
        identity and ``keep``."""
        _clear(self.path, (IDENTITY, *keep))


def _clear(directory: Path, keep: tuple[str, ...] = ()) -> None:
    """Everything in ``directory`` but its lock and ``keep``."""
    for name in _entries(directory) - set(keep):
        remove(directory / name)


def is_done(out_dir: Path, identity: RunIdentity) -> bool:
    """Complete, verified, and written by a run with this identity."""
    settle(out_dir)
    old = read_identity(out_dir)
    return old is not None and old.fingerprint == identity.fingerprint and is_complete(out_dir)


def preflight(out_dir: Path, identity: RunIdentity, overwrite: bool = False) -> bool:
    """The checking half of :func:`claim_output`: True when ``out_dir`` is complete with this
    identity (skip); raises :class:`InputError` when the run may not write there (path, live lock,
    other settings). It writes nothing, except that it first completes a swap an ``--overwrite`` was
    killed in the middle of (:func:`settle`)."""
    check_output_path(out_dir)
    out_dir = followed(out_dir)
    check_unlocked(out_dir)
    if out_dir.is_dir() and is_done(out_dir, identity):
        log.info(
            "%s is complete with the same settings (run %s); skipping",
            out_dir,
            identity.fingerprint,
        )
        _note_staging(out_dir, identity)
        return True
    reason = refusal(out_dir, identity)
    if reason and (not overwrite or _foreign(out_dir)):
        raise SettingsChanged(reason)
    return False


def _note_staging(out_dir: Path, identity: RunIdentity) -> None:
    """One warning about a staged ``--overwrite`` this run does not finish (never silently kept)."""
    stage = staging_dir(out_dir)
    staged = read_identity(stage)
    if stage.is_dir() and (staged is None or staged.fingerprint != identity.fingerprint):
        log.warning(
            "%s holds an interrupted --overwrite of %s with other settings (run %s): rerun that command with "
            "--overwrite to finish it, or remove the directory",
            stage,
            out_dir,
            staged.fingerprint if staged else "unknown",
        )


def settle(out_dir: Path) -> None:
    """Complete the swap of an ``--overwrite`` that died between its two renames, so ``out_dir``
    holds exactly one complete run: the new one when the old output is already set aside (the staged
    run is complete by then), and the leftover old copy is removed once the new one is in place. A
    live swap (its locks) is left alone."""
    out_dir = Path(out_dir)
    previous, stage = previous_dir(out_dir), staging_dir(out_dir)
    if not previous.is_dir():
        return
    check_unlocked(previous)
    check_unlocked(stage)
    with contextlib.suppress(FileNotFoundError):  # another process may settle it at the same time
        if not out_dir.exists() and stage.is_dir() and is_complete(stage):
            os.rename(stage, out_dir)
            _sync_dir(out_dir.parent)
            log.warning(
                "%s: finished the swap of an interrupted --overwrite (the new run is in place)",
                out_dir,
            )
        elif not out_dir.exists():
            # never happens by the swap's order; kept so no state loses the output
            os.rename(previous, out_dir)
            _sync_dir(out_dir.parent)
            log.warning(
                "%s: restored the old output set aside by an interrupted --overwrite", out_dir
            )
            return
        remove(previous)


def _sync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable (a crash after the rename must not undo it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def swap_into_place(stage: Path, out_dir: Path, locks: tuple[OutputLock, OutputLock]) -> None:
    """Replace ``out_dir`` by the complete staged run: ``out_dir`` -> ``<out>.overwrite-previous``,
    the stage -> ``out_dir``, then the previous copy is removed. A crash between the renames is
    completed by :func:`settle`; ``locks`` (the output's, the stage's) move with their directories,
    so the swap is never seen unlocked."""
    out_lock, stage_lock = locks
    previous = previous_dir(out_dir)
    remove(previous)
    os.rename(out_dir, previous)
    out_lock.moved_to(previous)
    os.rename(stage, out_dir)
    stage_lock.moved_to(out_dir)
    _sync_dir(out_dir.parent)
    remove(previous)
    log.info("%s now holds the new run (--overwrite; the old output is removed)", out_dir)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[tuple[OutputLock, bool]]:
    """Hold ``directory``'s lock (creating the directory): (the lock, whether it was created). A run
    that fails before writing anything but its identity into a directory it created removes the
    directory again."""
    try:
        directory.mkdir(parents=True)
        created = True
    except FileExistsError:
        created = False
    lock = OutputLock(directory)
    try:
        lock.acquire()
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                directory.rmdir()  # only while still empty: another run may hold it now
        raise
    failed = True
    try:
        yield lock, created
        failed = False
    finally:
        empty = (
            failed
            and created
            and lock.path.parent == directory
            and _entries(directory) <= {IDENTITY}
        )
        if empty:
            (directory / IDENTITY).unlink(missing_ok=True)
        lock.release()
        if empty:
            with contextlib.suppress(OSError):
                directory.rmdir()


@contextlib.contextmanager
def _environment_errors(out_dir: Path) -> Iterator[None]:
    """An environment errno raised without a path (e.g. safetensors' "(os error 28)") becomes an
    OSError naming ``out_dir``, so the command line can print it as one line."""
    try:
        yield
    except Exception as err:
        code = environment_errno(err) if not hasattr(err, "cause") else None
        if code is not None and not getattr(err, "filename", None):
            raise OSError(code, f"writing {out_dir}: {os.strerror(code)}") from err
        raise


@contextlib.contextmanager
def claim_output(out_dir: Path, identity: RunIdentity, overwrite: bool = False) -> Iterator[Claim]:
    """Hold ``out_dir`` for a run of ``identity`` (see the module docstring for the rules).

    Everything that can refuse (path, lock, identity) is checked before anything is written; a
    refusal is an :class:`InputError` and leaves the directory as it was. A symbolic link to a
    directory is followed (:func:`followed`)."""
    if preflight(out_dir, identity, overwrite):
        yield Claim(path=Path(out_dir), identity=identity, output=Path(out_dir), done=True)
        return
    out_dir = followed(out_dir, say=False)  # preflight said so
    with _environment_errors(out_dir), _locked(out_dir) as (out_lock, created):
        if is_done(out_dir, identity):
            log.info("%s was completed by another run with the same settings; skipping", out_dir)
            yield Claim(path=out_dir, identity=identity, output=out_dir, done=True)
            return
        reason = refusal(out_dir, identity)
        if reason is None:
            _note_staging(out_dir, identity)
            resumed = not created and read_identity(out_dir) is not None
            yield _record(out_dir, identity, out_dir, resumed)
            return
        if not overwrite:
            raise SettingsChanged(reason)
        stage = staging_dir(out_dir)
        with _locked(stage) as (stage_lock, stage_created):
            claim = _stage(stage, out_dir, identity, stage_created, reason)
            swap = functools.partial(swap_into_place, stage, out_dir, (out_lock, stage_lock))
            if claim.done:  # the staged run finished before a crash kept it from the swap
                swap()
                yield Claim(path=out_dir, identity=identity, output=out_dir, done=True)
                return
            claim._swap = swap
            yield claim


def _stage(stage: Path, out_dir: Path, identity: RunIdentity, created: bool, reason: str) -> Claim:
    """Under the stage's lock: the staged run of ``identity`` (resumed, or started after clearing a
    staged run of other settings)."""
    if is_done(stage, identity):
        log.info("%s: the staged --overwrite run is complete; swapping it in", out_dir)
        return Claim(path=stage, identity=identity, output=out_dir, done=True)
    old = read_identity(stage)
    if _entries(stage) and (old is None or old.fingerprint != identity.fingerprint):
        log.warning("%s: clearing a staged --overwrite with other settings", stage)
        _clear(stage)
        created = True
    resumed = not created and old is not None
    log.warning(
        "%s; --overwrite: %s the new run in %s, which replaces the output only once complete",
        reason.split(" (", 1)[0],
        "resuming" if resumed else "staging",
        stage,
    )
    return _record(stage, identity, out_dir, resumed)


def _record(path: Path, identity: RunIdentity, out_dir: Path, resumed: bool) -> Claim:
    """Record the run's identity in ``path``; a partial output must never look complete."""
    (path / SUCCESS).unlink(missing_ok=True)
    atomic_write_json(path / IDENTITY, identity.to_dict())
    return Claim(path=path, identity=identity, output=out_dir, resumed=resumed)
