"""Every job under the output contract, without Ray: values checked when configs are built, reruns
with other settings refused (and --overwrite honoured), failed reruns leaving a finished output
byte-identical, errors of the input or environment as one line and exit 2, readable and reproducible
artefacts (the init job in-process)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs import evaluate, finetune, init_embeddings
from sembridge_ray.cli import run_job, user_error
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig, OptimConfig
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.recipes.malstm.config import MalstmConfig
from sembridge_ray.recipes.reproduce.config import ReproduceConfig
from sembridge_ray.runtime.config import ConfigError
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import RunIdentity
from sembridge_ray.runtime.outputs import SUCCESS, claim_output, is_complete
from sembridge_ray.runtime.placement import ResourceConfig
from tests.conftest import REPO, error_lines
from tests.unit.test_outputs import snapshot


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: InitConfig().with_settings(alpha=0.5), "alpha=0.5: must be >= 1"),
        (lambda: InitConfig().with_settings(temperature=0.0), "temperature=0.0: must be > 0"),
        (lambda: InitConfig(match=("exact", "phonetic")), "unknown rule 'phonetic'"),
        (lambda: InitConfig(method="magic"), "method='magic': must be one of"),  # type: ignore[arg-type]
        (lambda: ResourceConfig(workers=0), "workers=0: must be >= 1"),
        (lambda: FinetuneConfig(optim=OptimConfig(lr=-1.0)), "lr=-1.0: must be > 0"),
        (lambda: FinetuneConfig.from_dict({"optim": {"lr": "-1"}}), "optim.lr=-1.0: must be > 0"),
        (lambda: FinetuneConfig(max_doc_length=0), "max_doc_length=0: must be >= 1"),
        (lambda: EvaluateConfig(top_k=0), "top_k=0: must be >= 1"),
        (lambda: EvaluateConfig(run_tag="two words"), "must be one word"),
        (lambda: MalstmConfig(restarts=0), "restarts=0: must be >= 1"),
        (
            lambda: MalstmConfig.from_dict({"train": {"rho": "1.5"}}),
            "train.rho=1.5: must be in (0, 1)",
        ),
        (lambda: ReproduceConfig(methods=("sembridge", "nope")), "unknown method 'nope'"),
        (lambda: ReproduceConfig(alphas=("0.5",)), "'0.5' is not a number >= 1"),
        (
            lambda: FinetuneConfig.from_dict({"optim": {"lr": "inf"}}),
            "optim.lr=inf: must be a finite number",
        ),
        (lambda: FinetuneConfig.from_dict({"optim": {"lr": "10"}}), "optim.lr=10.0: must be <= 1"),
        (lambda: InitConfig.from_dict({"alpha": "inf"}), "alpha=inf: must be a finite number"),
        (
            lambda: InitConfig.from_dict({"temperature": "inf"}),
            "temperature=inf: must be a finite number",
        ),
        (
            lambda: InitConfig.from_dict({"wechsel_temperature": "nan"}),
            "wechsel_temperature=nan: must be a finite",
        ),
        (lambda: ReproduceConfig(alphas=("4", "inf")), "'inf' is not a finite number"),
        (
            lambda: ReproduceConfig.from_dict({"init": {"method": "focus"}}),
            "init.method='focus': is set per cell",
        ),
        (  # the embedding-only warm-up's learning rate is bounded as lr alone is
            lambda: OptimConfig(lr=1.0, embedding_warmup_steps=5, embedding_warmup_lr_scale=1e6),
            "embedding_warmup_lr_scale=1000000.0: with lr 1 the warm-up's learning rate is 1e",
        ),
    ],
)
def test_configs_reject_out_of_range_values_when_built(build, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        build()


def test_bad_alpha_fails_in_the_driver_before_any_heavy_import(tmp_path: Path) -> None:
    """Refused while the config is read: neither Ray nor transformers or sentence-transformers is
    imported (what makes such a refusal take a second, not minutes: a property, where a wall-clock
    bound would fail on a loaded machine)."""
    heavy = ("ray", "transformers", "sentence_transformers")
    code = (
        "import sys, jobs.init_embeddings as job; rc = job.main(sys.argv[1:]); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules)); sys.exit(rc)"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--model",
            "m",
            "--target-tokenizer",
            "t",
            "--output",
            str(tmp_path / "out"),
            "--alpha",
            "0.5",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout.strip() == "[]"
    assert proc.stderr.strip().splitlines() == [
        "error: alpha=0.5: must be >= 1 (1 = softmax over the softmax_top_k nearest, 2 = sparsemax, 4 = the paper)"
    ]
    assert not (tmp_path / "out").exists()


class RayTaskErrorLike(InputError):
    """What Ray raises for a worker's exception: an instance of the cause's class too, whose text is
    a traceback."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::UDF() (pid=1, ip=127.0.0.1)\n  File ...\nTraceback ...")
        self.cause = cause


class TrainingFailedLike(RuntimeError):
    def __init__(self, failures: dict[int, BaseException]) -> None:
        super().__init__("Training failed")
        self.worker_failures = failures


def test_user_errors_are_found_inside_ray_wrappers_and_bugs_are_not() -> None:
    bad_model = InputError("cannot load bridge model 'x': not a directory")
    assert user_error(RayTaskErrorLike(bad_model)) == str(bad_model)
    wrapped = RuntimeError("map_batches failed")
    wrapped.__cause__ = RayTaskErrorLike(
        OSError(errno.ENOSPC, "No space left on device", "/out/cache/x.parquet")
    )
    assert user_error(wrapped) == "/out/cache/x.parquet: No space left on device (disk full)"
    rust = RuntimeError(
        "Error while serializing: IoError(Os { code: 30, kind: ReadOnlyFilesystem, message: "
        '"Read-only file system" }) (os error 30)'
    )
    assert (user_error(TrainingFailedLike({1: rust})) or "").endswith("(read-only file system)")
    assert (
        user_error(PermissionError(errno.EACCES, "Permission denied", "/shared/out"))
        == "/shared/out: Permission denied (permission denied)"
    )
    assert (
        user_error(KeyError("step")) is None
        and user_error(FileNotFoundError(errno.ENOENT, "gone")) is None
    )
    bug = RuntimeError("bug while handling")
    bug.__context__ = InputError("an earlier, handled problem")
    assert user_error(bug) is None


# ---- the init job in-process: the whole contract on real (tiny) models ----


@pytest.fixture()
def init_cfg(fixtures_root: Path, tmp_path: Path) -> InitConfig:
    return InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-wordpiece"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(tmp_path / "init"),
        cache_dir=str(tmp_path / "cache"),
        samples=3,
    )


def test_init_rerun_with_other_settings_is_refused_and_overwrite_redoes(
    init_cfg: InitConfig,
) -> None:
    out = Path(initialise(init_cfg).output)
    before = snapshot(out)
    changed = init_cfg.with_settings(method="focus", alpha=2.0)
    with pytest.raises(InputError) as err:
        initialise(changed)
    # the identity records alpha, which focus does not read, all the same
    assert "weighting.alpha: 4.0 → 2.0" in str(err.value) and "method: sembridge → focus" in str(
        err.value
    )
    assert snapshot(out) == before
    assert initialise(init_cfg).skipped
    redone = initialise(replace(changed, overwrite=True))
    assert not redone.skipped and redone.report["method"] == "focus" and is_complete(out)


def test_a_failed_rerun_leaves_the_finished_output_byte_identical(
    init_cfg: InitConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = Path(initialise(init_cfg).output)
    before = snapshot(out)
    bad_inputs: list[dict[str, Any]] = [
        {"target_tokenizer": str(tmp_path / "missing-tokenizer")},
        {"bridge_model": str(tmp_path)},
        {"source_model": "/nonexistent/model"},
    ]
    for bad in bad_inputs:
        with pytest.raises(InputError):
            initialise(replace(init_cfg, **bad))
        assert snapshot(out) == before
    # the evaluation job's driver, on a finished output, with a model that does not exist
    code = evaluate.main(["--model", "/nonexistent", "--dataset", "sick", "--output", str(out)])
    assert code == 2 and "'/nonexistent' not found" in capsys.readouterr().err
    assert snapshot(out) == before


def test_a_bad_bridge_model_is_one_line_from_the_driver(
    init_cfg: InitConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    args = [
        "--model",
        init_cfg.source_model,
        "--target-tokenizer",
        init_cfg.target_tokenizer,
        "--output",
        init_cfg.output,
    ]
    for bridge, reason in (
        (str(not_a_model), "is not a model directory"),
        ("no-org/no-such-bridge", "not found"),
    ):
        assert init_embeddings.main([*args, "--bridge-model", bridge]) == 2
        # progress log lines (timestamped) may precede it; the error itself is one line
        err = error_lines(capsys)
        assert len(err) == 1 and bridge in err[0] and reason in err[0]
    assert not Path(init_cfg.output).exists()


def test_output_path_that_is_a_file_is_one_line(
    init_cfg: InitConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    args = [
        "--model",
        init_cfg.source_model,
        "--target-tokenizer",
        init_cfg.target_tokenizer,
        "--bridge-model",
        init_cfg.bridge_model,
    ]
    assert init_embeddings.main([*args, "--output", str(tmp_path / "a-file")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: output {tmp_path / 'a-file'} exists and is not a directory"
    )
    assert (
        finetune.main(
            [
                "--model",
                init_cfg.source_model,
                "--train",
                str(tmp_path / "a-file"),
                "--output",
                str(tmp_path / "a-file" / "sub"),
            ]
        )
        == 2
    )
    assert "is a file, not a directory" in capsys.readouterr().err


def run_init_job(cfg: InitConfig) -> int:
    """The init job's body in-process (no Ray), with the job's own error handling."""
    return run_job(lambda: 0 if initialise(cfg) else 1)


def test_read_only_and_full_filesystems_are_one_line(
    init_cfg: InitConfig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_access = os.access
    parent = Path(init_cfg.output).parent
    monkeypatch.setattr(
        os, "access", lambda p, m: False if str(p) == str(parent) else real_access(p, m)
    )
    assert run_init_job(init_cfg) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: output {init_cfg.output}: {parent} is not writable (permission denied)"
    )
    monkeypatch.undo()

    import sembridge_ray.recipes.init.run as init_job

    weights = Path(init_cfg.output) / "model" / "model.safetensors"

    def disk_full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(weights))

    monkeypatch.setattr(init_job, "write_target_model", disk_full)
    assert run_init_job(init_cfg) == 2
    assert error_lines(capsys) == [f"error: {weights}: No space left on device (disk full)"]
    assert not (Path(init_cfg.output) / SUCCESS).exists()


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.parametrize(
    ("options", "expected"),
    [("ro,size=1m", "(read-only file system)"), ("size=96k", "(disk full)")],
)
def test_real_read_only_and_full_filesystems(
    init_cfg: InitConfig,
    tmp_path: Path,
    options: str,
    expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mount = tmp_path / "mnt"
    if not _mount_tmpfs(mount, options):
        pytest.skip(
            "cannot mount a tmpfs here (needs root); the injected-error test covers the message"
        )
    try:
        out = mount / "init"
        assert run_init_job(replace(init_cfg, output=str(out))) == 2
        # progress log lines (timestamped) may precede it; the error itself is one line
        err = error_lines(capsys)
        assert len(err) == 1 and err[0].endswith(expected) and str(mount) in err[0], err
        assert not (out / SUCCESS).exists()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_model_weights_are_readable_by_others(init_cfg: InitConfig) -> None:
    old = os.umask(0o022)
    try:
        out = Path(initialise(init_cfg).output)
    finally:
        os.umask(old)
    for path in out.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644), path


def test_two_runs_give_byte_identical_artefacts(init_cfg: InitConfig, tmp_path: Path) -> None:
    a = snapshot(Path(initialise(init_cfg).output))
    b = snapshot(
        Path(
            initialise(
                replace(
                    init_cfg, output=str(tmp_path / "again"), cache_dir=str(tmp_path / "cache2")
                )
            ).output
        )
    )
    reports = [json.loads(x.pop("init_report.json")) for x in (a, b)]
    # they name their own output and cache
    configs = [yaml.safe_load(x.pop("config.yaml")) for x in (a, b)]
    a.pop(SUCCESS), b.pop(SUCCESS)  # holds a finish time
    assert a == b
    assert [{k: v for k, v in c.items() if k not in ("output", "cache_dir")} for c in configs] == [
        {k: v for k, v in configs[0].items() if k not in ("output", "cache_dir")}
    ] * 2
    for report in reports:
        report.pop("timings")
    assert reports[0] == reports[1]


def test_a_run_identity_differs_only_in_what_shapes_the_result() -> None:
    cfg = InitConfig(source_model="a", target_tokenizer="b", output="o")
    same = replace(
        cfg,
        output="elsewhere",
        source_model="moved/copy",
        cache_dir="/tmp/c",
        overwrite=True,
        resources=ResourceConfig(workers=7),
    )
    inputs = {
        "source_model": "sha256:1",
        "target_tokenizer": "sha256:2",
        "bridge_model": "sha256:3",
    }
    assert cfg.identity("init", inputs) == same.identity("init", inputs)
    mean = replace(cfg, method="mean")
    # mean has no α: the maths does not see it, the identity records it all the same
    assert mean.with_settings(alpha=2.0).rule == mean.rule
    assert mean.with_settings(alpha=2.0).identity("init", inputs) != mean.identity("init", inputs)
    assert (
        RunIdentity(job="init", settings={"a": 1}).fingerprint
        != RunIdentity(job="init", settings={"a": 2}).fingerprint
    )


def test_claim_is_the_only_way_in(tmp_path: Path) -> None:
    """A job that skips never takes the lock or writes; one that refuses never creates the
    directory."""
    ident = RunIdentity(job="t", settings={"x": 1})
    with claim_output(tmp_path / "o", ident) as claim:
        claim.finish()
    stamp = (tmp_path / "o" / SUCCESS).stat().st_mtime_ns
    with claim_output(tmp_path / "o", ident) as claim:
        assert claim.done and not (tmp_path / "o" / ".lock").exists()
    assert (tmp_path / "o" / SUCCESS).stat().st_mtime_ns == stamp
