"""The command line of every job: ``sembridge <job> [--preset NAME] [flags] [key.sub=value ...]``.

Values layer as dataclass defaults < preset < ``key.sub=value`` overrides and named flags (sugar for
overrides: ``--alpha 3`` is ``alpha=3``; both go through the same coercion). ``--help`` explains
every flag from the config field's docstring, lists the allowed values, and shows the defaults of
the preset that will run. ``--print-config`` prints the resolved config as YAML and exits; that
file, given back with ``--config``, gives the same config.

Bad input and environment errors never show a traceback: :func:`run_job` prints one line naming them
and returns exit code 2, also when a Ray worker raised them. A traceback and exit 1 mean a bug.

Exit codes, the same for every job (docs/operations.md, "Exit codes"):

- 0: done (or skipped: the output was already complete with the same settings);
- 1: a bug (with its traceback);
- 2: bad input or environment (one line ``error: ...`` naming the file, line, path or value);
- 3: a grid (``reproduce``) finished, but some cells failed: one line ``error: cell ...`` each;
  the other cells' results are written, and a rerun retries the failed cells;
- 130: interrupted (Ctrl-C, SIGINT);
- 143: terminated (SIGTERM: preemption, ``kill``, ``docker stop``), after one line ``error:
  terminated (SIGTERM)``, with the output's lock released and a Ray cluster the job started shut
  down.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import difflib
import logging
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml

from sembridge_ray import __version__
from sembridge_ray.recipes import JOBS, PRESET_DIR, Flag, JobSpec, job_spec, presets
from sembridge_ray.runtime.config import (
    Config,
    ConfigError,
    FieldInfo,
    apply_overrides,
    canonical,
    canonical_key,
    field_info,
    load_preset,
    merge,
    suggestion,
)
from sembridge_ray.runtime.errors import Terminated, terminating, user_error
from sembridge_ray.runtime.logs import setup_logging

C = TypeVar("C", bound=Config)
log = logging.getLogger(__name__)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
EXIT_DONE, EXIT_BUG, EXIT_INPUT, EXIT_FAILED_CELLS = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 128 + signal.SIGINT, 128 + signal.SIGTERM


def resolve_preset(name: str, job: str) -> Path:
    """A YAML path as given, else ``sembridge_ray/presets/<job>_<name>.yaml``."""
    for candidate in (Path(name), PRESET_DIR / f"{job}_{name}.yaml"):
        if candidate.is_file():
            return candidate
    known = presets(job)
    raise ConfigError(
        f"preset {name!r} not found for {job or 'this job'} (known: {', '.join(known) or 'none'}; or give a YAML file)"
    )


def _preset_values(cls: type[Config], preset: str | None, job: str) -> Mapping[str, object]:
    """What ``preset`` (a name or a YAML file; None: none) sets, its keys as ``cls`` nests them."""
    return canonical(cls, load_preset(resolve_preset(preset, job))) if preset else {}


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())


def _show(value: object) -> str:
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value) or "(none)"
    return "(none)" if value is None or value == "" else str(value)


def _metavar(flag: Flag, fi: FieldInfo) -> str:
    """``{a,b}`` for choices (the empty choice, "none", is the default's to show), ``NAME``
    otherwise; ``X[,X...]`` for a list key."""
    shown = [str(c) for c in fi.choices if c != ""]
    one = "{" + ",".join(shown) + "}" if shown else flag.name.lstrip("-").upper().replace("-", "_")
    return f"{one}[,...]" if fi.type_name.startswith("tuple") else one


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one ``error:`` line (exit 2, through :func:`run_job`), with a "did
    you mean" for a mistyped flag."""

    def error(self, message: str) -> NoReturn:
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:
            flag = next((a for a in unknown.split() if a.startswith("-")), unknown.split()[0])
            name = flag.split("=", 1)[0]
            known = [o for o in self._option_string_actions if o.startswith("--")]
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else f" (see {self.prog} --help)"
            raise ConfigError(f"unknown flag {name}{hint}")
        raise ConfigError(f"{self.prog}: {message}")


def build_parser(
    cls: type[Config],
    flags: Sequence[Flag],
    values: Mapping[str, object],
    *,
    job: str,
    preset: str | None,
    prog: str,
    description: str,
) -> argparse.ArgumentParser:
    """The job's parser: flag help from the config's docstrings, choices, and the defaults in
    ``values``. A boolean key's flag is ``--x/--no-x``; a list key's takes comma-separated values; a
    required flag the preset leaves empty is listed under "required flags"."""
    info = field_info(cls, values)
    parser = _Parser(
        prog=prog,
        description=description,
        epilog=_epilog(cls, info, preset),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # a prefix must not silently pick a flag (--model vs --models)
    )
    required = parser.add_argument_group("required flags (unless the preset sets them)")
    optional = parser.add_argument_group("flags")
    optional.add_argument(
        "--preset",
        "--config",
        dest="preset",
        metavar="NAME|YAML",
        help=f"preset to start from: {', '.join(presets(job)) or 'none'}, or a YAML file "
        f"(e.g. the output of --print-config); default: {preset or 'none'}",
    )
    for flag in flags:
        fi = info[canonical_key(cls, flag.key)]
        group = required if flag.required and fi.default in ("", None, ()) else optional
        _add_flag(parser, group, flag, fi)
    optional.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    optional.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="INFO",
        help="this job's log level (default: INFO)",
    )
    optional.add_argument("--version", action="version", version=version_line())
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="any config key (see below)"
    )
    return parser


def _epilog(cls: type[Config], info: Mapping[str, FieldInfo], preset: str | None) -> str:
    """The ``--help`` epilog: every config key with its default, type, choices and first doc
    paragraph."""
    source = f"preset {preset!r}" if preset else "the built-in defaults"
    keys = [f"config keys (key=value; defaults of {source}):"]
    keys += [f"  (the keys of {s}.* may also be given without {s}.)" for s in cls.SHORTHANDS]
    for key, fi in info.items():
        line = f"  {key} = {_show(fi.default)}   [{fi.type_name}]"
        if fi.choices:
            line += f" one of: {', '.join(map(str, fi.choices))}"
        keys.append(line)
        keys += textwrap.wrap(  # nothing for a key without a doc
            _first_paragraph(fi.doc), 110, initial_indent=" " * 6, subsequent_indent=" " * 6
        )
    return "\n".join(keys)


def _add_flag(
    parser: argparse.ArgumentParser, group: argparse._ArgumentGroup, flag: Flag, fi: FieldInfo
) -> None:
    """Add ``flag`` to ``group``, shown with its help, and its older spellings to ``parser``,
    accepted but hidden."""
    text = _first_paragraph(fi.doc) or f"sets {flag.key}"
    shown = f"{text} (key {', '.join(flag.keys)}; default: {_show(fi.default)})"
    targets: list[tuple[str, argparse._ActionsContainer, str]] = [(flag.name, group, shown)]
    # older spellings: accepted, not shown
    targets += [(alias, parser, argparse.SUPPRESS) for alias in flag.aliases]
    how: dict[str, Any] = (
        {"action": argparse.BooleanOptionalAction}
        if fi.type_name == "bool"
        else {"metavar": _metavar(flag, fi)}
    )
    for name, target, help_text in targets:
        target.add_argument(name, dest=flag.key, default=None, help=help_text, **how)


def version_line() -> str:
    return f"sembridge {__version__} (sembridge-ray; python {sys.version.split()[0]})"


def _warn_deprecated(flags: Sequence[Flag], argv: Sequence[str]) -> None:
    for flag in flags:
        for alias in flag.aliases:
            negated = "--no-" + alias[2:]
            if any(a in (alias, negated) or a.startswith(alias + "=") for a in argv):
                log.warning(
                    "flag %s is now %s (the old spelling goes in the next release)",
                    alias,
                    flag.name,
                )


def parse_config(
    cls: type[C],
    argv: Sequence[str] | None,
    *,
    flags: Sequence[Flag] = (),
    job: str = "",
    default_preset: str | None = None,
    prog: str | None = None,
    description: str = "",
) -> tuple[C, argparse.Namespace]:
    """A job's command line -> (its frozen config, the parsed options: ``print_config``,
    ``log_level``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--preset", "--config", dest="preset", default=default_preset)
    preset = first.parse_known_args(argv)[0].preset
    # Only what the preset and the command line say: a value given there is explicit, even at its
    # default (a method's recipe refuses a conflicting explicit value, and fills in only what nobody
    # set).
    data = _preset_values(cls, preset, job)
    parser = build_parser(
        cls,
        flags,
        merge(cls().to_dict(), data),
        job=job,
        preset=preset,
        prog=prog or f"python -m jobs.{job}",
        description=description,
    )
    args = parser.parse_intermixed_args(argv)  # key=value overrides may sit between flags
    _warn_deprecated(flags, argv)
    given = _given(cls, args, flags)
    cfg = cls.from_dict(apply_overrides(data, [f"{k}={v}" for k, v in given.items()]))
    warn_inapplicable(cfg, given, flags)
    return cfg, args


def _given(cls: type[Config], args: argparse.Namespace, flags: Sequence[Flag]) -> dict[str, str]:
    """What the command line sets, canonical key -> raw value: the ``key=value`` overrides, then the
    named flags (a key set both ways to different values is a :class:`ConfigError`)."""
    given: dict[str, str] = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(
                f"argument {item!r} is not a flag nor a key=value override{suggestion(key, cls)}"
            )
        # a section's key may come without it (alpha=4)
        given[canonical_key(cls, key.strip())] = value
    for flag in flags:
        raw = getattr(args, flag.key)
        if raw is None:
            continue
        value = str(raw).lower() if isinstance(raw, bool) else raw
        for key in (canonical_key(cls, k) for k in flag.keys):
            if key in given and given[key] != value:
                raise ConfigError(f"{key} is set twice: {flag.name} {value} and {key}={given[key]}")
            given[key] = value
    return given


def warn_inapplicable(cfg: Config, given: Mapping[str, str], flags: Sequence[Flag] = ()) -> None:
    """One warning line per setting given on the command line that this run does not read
    (:meth:`Config.unread`: WECHSEL's temperature with method sembridge, ``eval_every`` without
    ``--eval``); the run goes on, since the setting changes nothing."""
    unused = cfg.inapplicable(set(given))
    names = {canonical_key(type(cfg), k): f.name for f in flags for k in f.keys}
    for key in unused:
        section, _, short = key.partition(".")
        # alpha, as it may be given
        shown = names.get(key, short if section in cfg.SHORTHANDS else key)
        log.warning("%s does nothing in this run (%s)", shown, unused[key])


def flags_markdown() -> str:
    """``docs/cli.md``: every job's flags, generated from the configs
    (``tests/unit/test_cli_vocabulary.py`` fails when the file is stale: regenerate it with ``python
    -m sembridge_ray.cli --flags-markdown > docs/cli.md``)."""
    lines = [
        "# Command-line flags",
        "",
        "Generated from the job configs by `python -m sembridge_ray.cli --flags-markdown`; do not edit by hand.",
        "",
        "Every job is `sembridge <job>` (or `python -m jobs.<module>` from a checkout). A flag is sugar for a config",
        "key: `--alpha 3` is `alpha=3`, and any key can be set as `key.sub=value`. One flag means one thing in every",
        "job. Boolean flags come in pairs (`--overwrite` / `--no-overwrite`); list flags take comma-separated values.",
        "`sembridge <job> --help` explains every key; `sembridge --version` prints the version. The init job's",
        "`weighting.*` keys (α, the candidates, the position-aware rule, SemBridge+'s options) may also be given",
        "without `weighting.`: `alpha=3` is `weighting.alpha=3`, in presets and the grid's `init` section too.",
        "",
        "## Flags shared by several jobs",
        "",
        "| flag | jobs |",
        "|---|---|",
    ]
    uses: dict[str, list[str]] = {}
    for job in JOBS:
        for flag in job_spec(job).flags:
            uses.setdefault(flag.name, []).append(job)
    lines += [
        f"| `{name}` | {', '.join(jobs)} |" for name, jobs in sorted(uses.items()) if len(jobs) > 1
    ]
    for job in JOBS:
        lines += _job_flags_markdown(job_spec(job))
    return "\n".join(lines) + "\n"


def _job_flags_markdown(spec: JobSpec[Any, Any]) -> list[str]:
    """One job's section of ``docs/cli.md``: its summary and the table of its flags."""
    # the values its flags default to: its default preset's, else the dataclass defaults
    values = _preset_values(spec.config, spec.default_preset, spec.name)
    info = field_info(spec.config, merge(spec.config().to_dict(), values))
    lines = [
        "",
        f"## `sembridge {spec.name}` (`python -m jobs.{spec.entry}`)",
        "",
        spec.summary[:1].upper() + spec.summary[1:] + ".",
        "",
    ]
    preset = f" (preset `{spec.default_preset}`)" if spec.default_preset else ""
    lines += [f"| flag | key | type | default{preset} | meaning |", "|---|---|---|---|---|"]
    lines += [_flag_row(flag, info[canonical_key(spec.config, flag.key)]) for flag in spec.flags]
    return lines


def _flag_row(flag: Flag, fi: FieldInfo) -> str:
    """A flag's row in ``docs/cli.md``: its spellings, keys, type or choices, default and
    meaning."""
    name = f"`{flag.name}` / `--no-{flag.name[2:]}`" if fi.type_name == "bool" else f"`{flag.name}`"
    if flag.required:
        name += " (required)"
    if flag.aliases:
        name += " (formerly " + ", ".join(f"`{a}`" for a in flag.aliases) + ")"
    listed = fi.type_name.startswith("tuple")
    kind = "list" if listed else fi.type_name
    if fi.choices:
        kind = ("list of " if listed else "") + " \\| ".join(
            f"`{c}`" for c in fi.choices if c != ""
        )
    keys = ", ".join(f"`{k}`" for k in flag.keys)
    meaning = _first_paragraph(fi.doc).replace("|", "\\|")
    default = _show(fi.default).replace("|", "\\|")
    return f"| {name} | {keys} | {kind} | `{default}` | {meaning} |"


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)


# ---- running a job
# ------------------------------------------------------------------------------------------


def _raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler: stop the job where the main thread is. Further SIGTERMs are ignored
    while it unwinds (releasing its lock, shutting Ray down), so they cannot interrupt that."""
    # what the body raises next may not be the Terminated itself (ray.get makes a fresh one)
    terminating.set()
    signal.signal(signal.SIGTERM, _ignore_signal)
    raise Terminated(signum)


def _exit_when_terminated() -> None:
    """The last thing at exit (registered before any other handler, so it runs after all of them): a
    terminated job, its lock released, its Ray cluster shut down and its stderr flushed by then,
    ends at once with 143. The interpreter's own finalization (torch's and Ray's native threads and
    objects) would take seconds more, which a preemption's grace period does not give."""
    if terminating.is_set():
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(EXIT_TERMINATED)


atexit.register(_exit_when_terminated)


def _ignore_signal(signum: int, frame: object) -> None:
    """A Python-level no-op rather than SIG_IGN, which the processes Ray starts meanwhile would
    inherit."""


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (Python's default would
    end the process at once, leaving the lock and Ray's processes behind). The previous handler is
    restored after, unless a SIGTERM came: the process is then on its way out, and further SIGTERMs
    stay ignored so that what runs at exit (the Ray cluster's shutdown, see ``distributed.cluster``)
    completes."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread; the caller's handler stays
        return
    terminating.clear()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is not _ignore_signal:
            signal.signal(signal.SIGTERM, previous)


def run_job(main: Callable[[], int], level: str = "INFO") -> int:
    """Run a job's body. Bad input and environment errors (disk full, read-only, permission) become
    one line on stderr and exit code 2, also when a Ray worker raised them; a traceback and exit 1
    are left for bugs. SIGTERM and Ctrl-C unwind the body and end it with one line and exit code 143
    or 130 (see the module docstring)."""
    setup_logging(level)
    try:
        with terminate_on_sigterm():
            return main()
    except BaseException as err:
        code, message = _ending(err)
        if code is None:
            raise
        print(message, file=sys.stderr)
        return code


def _ending(err: BaseException) -> tuple[int | None, str]:
    """How a job whose body raised ``err`` ends: (exit code, the line for stderr), or (None, "") for
    a bug (and for a SystemExit of the body's own, e.g. ``--help``), whose traceback or exit stays
    as it is."""
    # ray.init installs sys.exit(SIGTERM) as the handler while it starts (distributed.cluster puts
    # run_job's back)
    if terminating.is_set() or (isinstance(err, SystemExit) and err.code == signal.SIGTERM):
        return EXIT_TERMINATED, "error: terminated (SIGTERM)"
    if isinstance(err, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    message = user_error(err) if isinstance(err, Exception) else None
    return (None, "") if message is None else (EXIT_INPUT, f"error: {message}")


def failed_cells(failures: Mapping[str, str]) -> list[str]:
    """One line per failed cell of a grid: its name and the first line of its error."""
    return [
        f"error: cell {cell} failed: {(error.strip().splitlines() or ['(no message)'])[0]}"
        for cell, error in sorted(failures.items())
    ]


def _level(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith("--log-level="):
            return arg.split("=", 1)[1].upper()
        if arg == "--log-level" and i + 1 < len(argv):
            return argv[i + 1].upper()
    return "INFO"


def run(job: str, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse, run and report one job; the exit code (see the module docstring: 0 done, 2 bad input
    or environment, 3 a grid with failed cells, listed on stderr, one line each)."""
    spec = job_spec(job)
    args = list(sys.argv[1:] if argv is None else argv)
    level = _level(args)

    def body() -> int:
        cfg, options = parse_config(
            spec.config,
            args,
            flags=spec.flags,
            job=spec.name,
            default_preset=spec.default_preset,
            prog=prog or f"python -m jobs.{spec.entry}",
            description=spec.description,
        )
        if options.print_config:
            print(dump_config(cfg), end="")
            return 0
        result = spec.run(cfg)
        sys.stderr.flush()  # the log lines so far come out before the report
        print(spec.report(result), flush=True)
        if failures := getattr(result, "failures", None):
            print("\n".join(failed_cells(failures)), file=sys.stderr)
            return EXIT_FAILED_CELLS
        return EXIT_DONE if getattr(result, "ok", True) else EXIT_BUG

    return run_job(body, level if level in LOG_LEVELS else "INFO")


def main(argv: Sequence[str] | None = None) -> int:
    """``sembridge <job> [args]``: every job behind one command (the console script)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:
        print(version_line())
        return 0
    if args[:1] == ["--flags-markdown"]:  # regenerates docs/cli.md
        print(flags_markdown(), end="")
        return 0
    if not args or args[0] in ("-h", "--help") or args[0] not in JOBS:
        lines = [
            "usage: sembridge <job> [--preset NAME] [flags] [key=value ...]   (sembridge <job> --help)",
            "       sembridge --version",
            "",
            "jobs:",
        ]
        lines += [f"  {name:<10} {job_spec(name).summary}" for name in JOBS]
        print("\n".join(lines), file=sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr)
        if args and args[0] not in ("-h", "--help"):
            close = difflib.get_close_matches(args[0], JOBS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            print(f"error: unknown job {args[0]!r}{hint}", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return run(args[0], args[1:], prog=f"sembridge {args[0]}")


if __name__ == "__main__":
    raise SystemExit(main())
