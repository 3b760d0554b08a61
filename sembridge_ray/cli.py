"""Command-line glue shared by every job: ``--config PRESET``, named flags, ``key.sub=value`` overrides.

Named flags are sugar for overrides: ``--alpha 3`` is ``alpha=3``, and both go through the same coercion.
Bad input never shows a traceback: :func:`run_job` prints one line naming it and returns exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sembridge_ray.config import Config, ConfigError, apply_overrides, field_docs, load_preset, merge
from sembridge_ray.errors import ENVIRONMENT_ERRNOS, InputError, environment_errno

C = TypeVar("C", bound=Config)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Flag:
    """A named flag mapped onto a config key; ``const`` makes it a switch (``--dry-run`` -> ``dry_run=true``)."""

    name: str
    key: str
    const: str | None = None
    help: str = ""


def resolve_preset(name: str, preset_dir: Path, prefix: str = "") -> Path:
    """A path as given, else ``<preset_dir>/<prefix><name>.yaml``, else ``<preset_dir>/<name>.yaml``."""
    for candidate in (Path(name), preset_dir / f"{prefix}{name}.yaml", preset_dir / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in preset_dir.glob(f"{prefix}*.yaml"))
    raise ConfigError(f"config preset {name!r} not found (known: {', '.join(known) or 'none'})")


def parse_config(
    cls: type[C],
    argv: Sequence[str] | None,
    *,
    flags: Sequence[Flag] = (),
    preset_dir: Path,
    prefix: str = "",
    default_preset: str | None = None,
    description: str = "",
) -> C:
    """Parse a job's command line into its frozen config."""
    epilog = "config keys (override with key=value):\n" + "\n".join(
        f"  {k:<32} {v}" for k, v in field_docs(cls).items()
    )
    parser = argparse.ArgumentParser(
        description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=default_preset, help=f"preset name under {preset_dir} or a path")
    for flag in flags:
        if flag.const is None:
            parser.add_argument(flag.name, dest=flag.key, default=None, help=flag.help or f"sets {flag.key}")
        else:
            parser.add_argument(flag.name, dest=flag.key, action="store_const", const=flag.const, default=None,
                                help=flag.help or f"sets {flag.key}={flag.const}")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_intermixed_args(argv)  # key=value overrides may sit between flags
    data = cls().to_dict()
    if args.config:
        data = merge(data, load_preset(resolve_preset(args.config, preset_dir, prefix)))
    named = [f"{f.key}={getattr(args, f.key)}" for f in flags if getattr(args, f.key) is not None]
    return cls.from_dict(apply_overrides(data, [*args.overrides, *named]))


def flag_value(argv: Sequence[str], name: str, default: str) -> str:
    """The value of ``name VALUE`` or ``name=VALUE`` in ``argv`` (e.g. ``--preset`` also picking a preset file)."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return default


def _causes(err: BaseException) -> list[BaseException]:
    """What an exception wraps: its explicit ``__cause__``, a Ray task error's ``cause``, a Ray Train failure's
    per-worker errors, an exception group's members (not the implicit ``__context__``: an error raised while
    handling another is a new failure)."""
    found = [getattr(err, "cause", None), err.__cause__]
    failures = getattr(err, "worker_failures", None)
    if isinstance(failures, dict):
        found.extend(failures.values())
    found.extend(getattr(err, "exceptions", None) or ())
    return [e for e in found if isinstance(e, BaseException)]


def find_user_error(err: BaseException) -> BaseException | None:
    """The error caused by the user's input or environment, wherever it sits in the chain of causes (Ray wraps
    what its workers raise); None when it is a bug."""
    stack, seen = [err], set()
    while stack:
        current = stack.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        wrapped = _causes(current)
        if getattr(current, "cause", None) is not None:  # a Ray wrapper: also an instance of what it wraps
            stack = wrapped + stack
            continue
        if isinstance(current, InputError) or environment_errno(current) is not None:
            return current
        stack.extend(wrapped)
    return None


def user_error(err: BaseException) -> str | None:
    """The one-line message of :func:`find_user_error`'s error (None for a bug)."""
    found = find_user_error(err)
    if found is None or isinstance(found, InputError):
        return None if found is None else str(found)
    code = environment_errno(found)
    where = getattr(found, "filename", None) or ""
    text = found.strerror if isinstance(found, OSError) and found.strerror else str(found)
    return f"{where + ': ' if where else ''}{text.strip().splitlines()[0]} ({ENVIRONMENT_ERRNOS[code or 0]})"


def run_job(main: Callable[[], int]) -> int:
    """Run a job's body. Bad input and environment errors (disk full, read-only, permission) become one line on
    stderr and exit code 2, also when a Ray worker raised them; a traceback and exit 1 are left for bugs."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        message = user_error(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
