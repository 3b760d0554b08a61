"""One vocabulary of flags: a config key that means the same thing has the same flag in every job,
every job has the flags its work calls for, and docs/cli.md is the table the configs generate."""

from __future__ import annotations

import pytest

from sembridge_ray import __version__, cli
from sembridge_ray.recipes import JOBS, job_spec
from sembridge_ray.runtime.config import ConfigError, canonical_key, dotted_keys, field_info
from tests.conftest import REPO

STAGE_SECTIONS = ("init.", "finetune.", "evaluate.")
"""``reproduce`` sets its stages' keys (``--workers`` is every stage's ``resources.workers``)."""
SYNONYMS = {
    # the input encoder (init calls it the source; reproduce's list)
    "--model": {"model", "source_model", "models"},
    # init writes it into the model it makes
    "--max-query-length": {"max_query_length", "query_length"},
    "--max-doc-length": {"max_doc_length", "document_length"},
}
"""Flags whose key is spelled differently in some configs, for the same thing."""


def concept(key: str) -> str:
    for section in STAGE_SECTIONS:
        key = key.removeprefix(section)
    for flag, keys in SYNONYMS.items():
        if key in keys:
            return flag
    return key


def test_one_key_one_flag_across_jobs() -> None:
    names: dict[str, set[str]] = {}
    keys: dict[str, set[str]] = {}
    for job in JOBS:
        for flag in job_spec(job).flags:
            for key in flag.keys:
                names.setdefault(concept(key), set()).add(flag.name)
            keys.setdefault(flag.name, set()).update(concept(k) for k in flag.keys)
    assert {k: v for k, v in names.items() if len(v) > 1} == {}  # a key spelled by two flags
    assert {f: v for f, v in keys.items() if len(v) > 1} == {}  # a flag meaning two keys


@pytest.mark.parametrize("job", JOBS)
def test_every_job_has_the_flags_its_work_calls_for(job: str) -> None:
    spec = job_spec(job)
    config_keys = {concept(k) for k in dotted_keys(spec.config)}
    flags = {f.name for f in spec.flags}
    expected = {
        "--model": "--model" in config_keys,
        "--workers": "resources.workers" in config_keys,
        # malstm's restarts are one-CPU Ray tasks (num_gpus=0): it places no GPU work
        "--gpus-per-worker": "resources.gpus_per_worker" in config_keys and job != "malstm",
        "--max-query-length": "--max-query-length" in config_keys,
        "--max-doc-length": "--max-doc-length" in config_keys,
        "--trust-remote-code": "trust_remote_code" in config_keys,
        "--restarts": "restarts" in config_keys,
    }
    assert {f for f, needed in expected.items() if needed} <= flags
    info = field_info(spec.config)
    # every key a flag sets exists (alpha: weighting.alpha), with the first key's type
    for flag in spec.flags:
        types = {info[canonical_key(spec.config, k)].type_name for k in flag.keys}
        assert types == {info[canonical_key(spec.config, flag.key)].type_name}, flag.name


def test_models_and_restarts_keep_their_old_spellings(caplog: pytest.LogCaptureFixture) -> None:
    init = job_spec("init")
    cfg, _ = cli.parse_config(
        init.config, ["--source-model", "m", "--output", "o"], flags=init.flags, job="init"
    )
    assert cfg.source_model == "m" and "flag --source-model is now --model" in caplog.text
    malstm = job_spec("malstm")
    cfg, _ = cli.parse_config(malstm.config, ["--seeds", "3"], flags=malstm.flags, job="malstm")
    assert cfg.restarts == 3 and cfg.identity("malstm", {}).settings["restarts"] == 3


def test_booleans_are_pairs_lists_are_lists_and_required_flags_say_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = job_spec("malstm")
    cfg, _ = cli.parse_config(
        spec.config, ["--no-augment", "--pretrain"], flags=spec.flags, job="malstm"
    )
    assert (cfg.augment.enabled, cfg.pretrain.enabled) == (False, True)
    with pytest.raises(SystemExit):
        cli.run("reproduce", ["--help"])
    text = capsys.readouterr().out
    assert "--overwrite, --no-overwrite" in text and "--dry-run, --no-dry-run" in text
    assert (
        "--languages LANGUAGES[,...]" in text
        and "--datasets {webfaq,miracl,sick,xquad}[,...]" in text
    )
    required = text.split("required flags")[1].split("\nflags:")[0]
    assert "--output OUTPUT" in required and "--methods" not in required
    # an empty choice ("" = none) is the default's to show, never a choice of its own
    for job in JOBS:
        with pytest.raises(SystemExit):
            cli.run(job, ["--help"])
        usage = capsys.readouterr().out.split("\n\n")[0]
        assert "{," not in usage and ",}" not in usage, job


def test_a_mistyped_flag_gets_a_suggestion_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"unknown flag --modle; did you mean --model\?"):
        cli.parse_config(
            job_spec("init").config, ["--modle", "x"], flags=job_spec("init").flags, job="init"
        )
    assert cli.run("finetune", ["--lamda-q", "1"]) == 2
    assert (
        capsys.readouterr().err.strip() == "error: unknown flag --lamda-q; did you mean --lambda-q?"
    )
    assert cli.main(["evalute"]) == 2 and "did you mean evaluate?" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"sembridge {__version__} ")
    with pytest.raises(SystemExit) as exit_:
        cli.run("evaluate", ["--version"])
    assert exit_.value.code == 0 and __version__ in capsys.readouterr().out


def test_docs_cli_md_is_generated_from_the_configs() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert text == cli.flags_markdown(), (
        "stale: python -m sembridge_ray.cli --flags-markdown > docs/cli.md"
    )
    for job in JOBS:
        assert all(f"`{flag.name}`" in text for flag in job_spec(job).flags)
