"""Every ```bash and ```python block of README.md, cluster/README.md and docs/*.md is checked
against the code, so the docs cannot drift from it: a renamed flag, a removed preset or a broken
Python snippet fails here. No Ray starts and no job does work; the whole file takes about ten
seconds on 2 CPUs.

**What runs.** An HTML comment on the nearest non-blank line before the fence (invisible when
rendered) says how a block is checked:

- no marker: the block runs as written and must succeed. Allowed in shell blocks are only commands
  that do no work: a job command with ``--help``, ``--print-config`` or ``--dry-run``, any Python
  program with ``--help``, and ``sembridge --help`` / ``--version``; anything else fails the test
  with a request to mark the block. A Python block is executed.
- ``<!-- snippet: parse (why) -->``: nothing does work, every command is only parsed by the program
  it names. A job command (``sembridge JOB …``, ``python -m jobs.X …`` for a job's entry point) runs
  with ``--print-config`` appended, which resolves and validates its preset, flags and ``key=value``
  overrides; one that does no work anyway (``--help``, ``--dry-run``, …) runs as written. Any other
  Python program (``python -m pkg.mod``, ``python scripts/x.py``) runs up to its argparse parse and
  stops there. A command after ``--`` (``ray job submit … -- python -m jobs.X``, ``bash
  cluster/local.sh job -- …``) is checked the same way; other programs (``bash``, ``ray``,
  ``kubectl``, ``pip``, ``export``) are not run. In a Python block marked so, the code is compiled
  only.
- ``<!-- snippet: skip (why) -->``: nothing in the block runs (a cluster, an install, network,
  minutes of work).

**How commands run.** In this process, from a temporary working directory (relative outputs land
there): ``sembridge ARGS`` is ``sembridge_ray.cli.main(ARGS)`` (what the console script calls),
``python -m M ARGS`` is ``M.main(ARGS)`` (every ``jobs.*`` entry point has one; else ``runpy``),
``python path.py ARGS`` is ``runpy`` of the checkout's file; one test checks that the installed
``sembridge`` prints what the in-process call prints. Leading ``VAR=value`` assignments are ignored;
``&&``, ``;`` and ``&`` separate commands.

**Placeholders.** In ``parse`` blocks a synopsis reads as one example: ``[optional]`` parts are
kept, ``a|b`` takes ``a``, and a bare ``key=value``, ``...`` or ``…`` is dropped. Upper-case
placeholders in :data:`PLACEHOLDERS` get a value of their type (``--workers N`` -> ``--workers 2``);
any other (``DIR``, ``SPEC``, ``ROOT``) stays a string, which parsing accepts. In Python blocks, the
paths in :data:`PYTHON_PATHS` become a tiny fixture of the same kind (the quick start's fine-tuned
model: a tiny SparseEncoder from ``sembridge_ray.testing``)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sembridge_ray.recipes import JOBS, job_spec

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "cluster" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL, PYTHON = ("bash", "sh", "shell", "console"), ("python", "py")
MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<kind>[a-z-]+)\s*(?:\((?P<why>.+)\))?\s*-->$")
KINDS = ("parse", "skip")

PLACEHOLDERS = {"N": "2", "K": "5", "G": "0", "DOCS": "1000", "PRESET": "smoke"}
"""Upper-case placeholders of synopses that must parse as numbers (or name a preset every such job
has)."""
PYTHON_PATHS = {
    "outputs/quick/cells/minilm-splade__en-bpe__sembridge__a4/sick/finetune/model": "bert-splade"
}
"""Paths in Python snippets -> the ``sembridge_ray.testing`` fixture that stands in for them."""
NO_WORK = ("--help", "-h", "--print-config", "--dry-run", "--version")
"""A command holding one of these does no work: it runs as written, in every mode."""
JOB_ENTRIES = {job_spec(name).entry: name for name in JOBS} | {"demo": "reproduce"}
"""``python -m jobs.<entry>`` -> the job (``jobs.demo`` is ``reproduce --preset demo``)."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    kind: str
    """"run" (no marker), "parse" or "skip"."""
    why: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO).as_posix()}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced bash and python blocks of a Markdown file, with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        lang = fence.group(2).lower()
        if lang in SHELL + PYTHON:
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = MARKER.match(before)
            kind, why = (
                ("run", "") if marker is None else (marker.group("kind"), marker.group("why") or "")
            )
            if marker is None and before.startswith("<!--") and "snippet" in before:
                kind, why = f"malformed marker {before!r}", ""
            code = "\n".join(lines[i + 1 : end])
            found.append(
                Block(path, i + 1, "python" if lang in PYTHON else "bash", code, kind, why)
            )
        i = end + 1
    return found


ALL = [b for path in DOCS for b in blocks(path)]


# ---- shell
# ----------------------------------------------------------------------------------------------------


def commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, split at ``&&``,
    ``;``, ``&``."""
    out: list[list[str]] = [[]]
    for line in code.replace("\\\n", "").splitlines():
        for token in [*shlex.split(line, comments=True), ";"]:
            if token in ("&&", ";", "&", "||"):
                out.append([])
            else:
                out[-1].append(token)
    return [argv for argv in out if argv]


def synopsis(argv: list[str]) -> list[str]:
    """A usage synopsis as one example (see the module docstring)."""
    out = []
    for token in argv:
        token = token.strip("[]")
        if not token or token in ("...", "…") or re.fullmatch(r"key(\.sub)?=value", token):
            continue
        if "|" in token and "://" not in token:
            token = token.split("|")[0]
        out.append(PLACEHOLDERS.get(token, token))
    return out


class Parsed(Exception):
    """Raised in place of running a program once its argparse parse succeeded."""


@contextlib.contextmanager
def stop_after_parsing() -> Iterator[None]:
    originals = {
        name: getattr(argparse.ArgumentParser, name)
        for name in ("parse_args", "parse_intermixed_args")
    }

    def stopper(name: str) -> Callable[..., object]:
        def parse(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> object:
            originals[name](self, *args, **kwargs)
            raise Parsed

        return parse

    for name in originals:
        setattr(argparse.ArgumentParser, name, stopper(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)


@dataclass(frozen=True)
class Program:
    """How to call one command line in this process."""

    call: Callable[[list[str]], object]
    args: list[str]
    job: bool
    """A job's command line (``--print-config`` parses it completely)."""


def program(argv: list[str]) -> Program | None:
    """The Python program a command runs, or None for any other (bash, ray, kubectl, pip, ...)."""
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        argv = argv[1:]  # VAR=value prefixes
    if not argv:
        return None
    if argv[0] == "sembridge":
        from sembridge_ray import cli

        return Program(cli.main, argv[1:], job=len(argv) > 1 and argv[1] in JOBS)
    if argv[0] not in ("python", "python3") or len(argv) < 2:
        return None
    if argv[1] == "-m":
        module, args = argv[2], argv[3:]
        main = getattr(importlib.import_module(module), "main", None)
        if callable(main):
            return Program(main, args, job=module.startswith("jobs.") and module[5:] in JOB_ENTRIES)
        return Program(
            as_main(lambda: runpy.run_module(module, run_name="__main__"), module), args, job=False
        )
    script = str(REPO / argv[1])
    return Program(
        as_main(lambda: runpy.run_path(script, run_name="__main__"), script), argv[2:], job=False
    )


def as_main(run: Callable[[], object], name: str) -> Callable[[list[str]], object]:
    """``run`` (a module or script run as ``__main__``) as a function of its arguments, given in
    ``sys.argv``."""

    def call(args: list[str]) -> object:
        saved = sys.argv
        sys.argv = [name, *args]
        try:
            return run()
        finally:
            sys.argv = saved

    return call


def call(prog: Program, args: list[str], parse_only: bool) -> tuple[int, str]:
    """Run ``prog`` on ``args``: (exit code, what it printed). ``parse_only``: stop after the
    argparse parse."""
    out = io.StringIO()
    code: object = 0
    stop = stop_after_parsing() if parse_only else contextlib.nullcontext()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), stop:
        try:
            code = prog.call(args)
        except Parsed:
            code = 0
        except SystemExit as end:
            code = end.code
    if code is None:
        code = 0
    return (code if isinstance(code, int) else 1), out.getvalue()


def check_command(argv: list[str], kind: str) -> None:
    """Run or parse one command of a block of ``kind`` ("run" or "parse"); AssertionError if it
    fails."""
    shown = shlex.join(argv)
    if kind == "parse":
        argv = synopsis(argv)
    prog = program(argv)
    if prog is None:
        if kind == "run":
            raise AssertionError(
                f"{shown}: not a command the test runs; mark the block parse or skip"
            )
        if "--" in argv:
            check_command(argv[argv.index("--") + 1 :], kind)
        return
    no_work = any(flag in prog.args for flag in NO_WORK)
    if kind == "run" and not no_work:
        raise AssertionError(f"{shown}: does work; mark the block `parse (why)` or `skip (why)`")
    if no_work:
        code, printed = call(prog, prog.args, parse_only=not prog.job and "--help" not in prog.args)
    elif prog.job:
        code, printed = call(prog, [*prog.args, "--print-config"], parse_only=False)
    else:
        code, printed = call(prog, prog.args, parse_only=True)
    assert code == 0, f"{shown}: exit code {code}\n{printed[-3000:]}"


# ---- python
# ---------------------------------------------------------------------------------------------------


def run_python(block: Block, fixtures: Path) -> None:
    code = block.code
    for path, fixture in PYTHON_PATHS.items():
        if path in code:
            from sembridge_ray.testing import build_fixture

            code = code.replace(path, build_fixture(fixture, fixtures).as_posix())
    compiled = compile(code, block.name, "exec")
    if block.kind == "parse":
        return
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compiled, {"__name__": "__snippet__"})


# ---- the tests
# ------------------------------------------------------------------------------------------------


def test_the_docs_have_snippets_and_every_marker_is_known() -> None:
    assert {b.path for b in ALL} >= {REPO / "README.md", REPO / "cluster" / "README.md"}
    bad = [f"{b.name}: {b.kind}" for b in ALL if b.kind not in ("run", *KINDS)]
    assert bad == [], "unknown snippet markers (see this test's docstring)"
    unexplained = [b.name for b in ALL if b.kind in KINDS and not b.why.strip()]
    assert unexplained == [], "a parse or skip marker says why: <!-- snippet: skip (why) -->"


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.kind in ("run", "parse")], ids=lambda b: b.name
)
def test_snippet(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    if block.lang == "python":
        run_python(block, tmp_path / "fixtures")
        return
    cmds = commands(block.code)
    assert cmds, f"{block.name}: an empty shell block"
    for argv in cmds:
        check_command(argv, block.kind)


def test_in_process_commands_are_what_the_shell_runs(tmp_path: Path) -> None:
    """The snippets call the console script's function in this process; once, the installed
    ``sembridge`` of this environment, run as a shell would, prints the same."""
    exe = Path(sys.executable).with_name("sembridge")
    if not exe.is_file():
        pytest.skip("no sembridge console script beside this Python (the package is not installed)")
    shell = subprocess.run(
        [str(exe), "init", "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    prog = program(["sembridge", "init", "--help"])
    assert prog is not None
    code, printed = call(prog, prog.args, parse_only=False)
    assert (shell.returncode, shell.stdout) == (code, printed) == (0, printed)


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        # a misspelt flag
        ("sembridge init --source-modle SRC --target-tokenizer TGT --output OUT", "parse"),
        (
            "python -m jobs.finetune --model DIR --train SPEC --output DIR --workers N --bogus 1",
            "parse",
        ),
        ("sembridge reproduce --preset no-such-preset --output ROOT --dry-run", "run"),
        ("python -m jobs.bench_peers --retrieval --no-such-flag", "parse"),  # an argparse program
        # an unknown key
        ("ray job submit --working-dir . -- python -m jobs.malstm --output o alpha=3", "parse"),
        ("sembridge evaluate --preset smoke --output /tmp/eval", "run"),  # does work, unmarked
        ("bash cluster/local.sh quick", "run"),  # not a Python program, unmarked
    ],
)
def test_a_broken_snippet_fails(
    command: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError):
        for argv in commands(command):
            check_command(argv, kind)


def test_markers_and_synopses_read_as_documented(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n<!-- snippet: skip (needs a GPU) -->\n```bash\nbash x\n```\n\n```python\nprint(1)\n```\n"
        "<!-- snippet: parse -->\n\n```sh\nsembridge init --help\n```\n```yaml\na: 1\n```\n",
        encoding="utf-8",
    )
    found = [(b.lang, b.kind, b.why, b.line) for b in blocks(doc)]
    assert found == [
        ("bash", "skip", "needs a GPU", 3),
        ("python", "run", "", 7),
        ("bash", "parse", "", 12),
    ]
    example = [
        "--bias",
        "remap|index|zero]",
        "[--workers",
        "N]",
        "[key=value",
        "...]",
        "--url",
        "http://a|b",
    ]
    assert synopsis(example) == ["--bias", "remap", "--workers", "2", "--url", "http://a|b"]
    assert commands("a b \\\n  c # note\nd && e &\n") == [["a", "b", "c"], ["d"], ["e"]]
