"""``--push-to-hub``: checked in the driver before any work (one line, exit 2, in seconds, before
Ray), with the ``--scores`` outputs its card is to show; a rerun of a finished output publishes it
without recomputing, recording what went where (the hub is offline here: the upload itself is
replaced by a recorder). ``tests/unit/test_model_card.py`` checks the card that is pushed."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from jobs import finetune, init_embeddings
from sembridge_ray.model_card import CARD
from sembridge_ray.publish import PUSHED
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.sparse import model as sparse_model
from tests.conftest import error_lines


def init_args(fixtures_root: Path, out: Path, repo: str) -> list[str]:
    return [
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--target-tokenizer",
        str(fixtures_root / "tok-wordpiece"),
        "--bridge-model",
        str(fixtures_root / "bridge"),
        "--output",
        str(out),
        "--push-to-hub",
        repo,
    ]


def ft_args(fixtures_root: Path, out: Path) -> list[str]:
    return ["--model", str(fixtures_root / "bert-mlm"), "--train", "sick", "--output", str(out)]


@pytest.mark.parametrize(
    ("repo", "offline", "token", "message"),
    [
        ("not a repo id!!", True, "x", "is not a hub repository id"),
        ("org/model", True, "x", "HF_HUB_OFFLINE is set"),
        ("org/model", False, None, "no Hugging Face token"),
    ],
)
def test_a_push_that_cannot_happen_is_refused_first(
    fixtures_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    repo: str,
    offline: bool,
    token: str | None,
    message: str,
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    ft = ft_args(fixtures_root, tmp_path / "ft")
    for main, argv in (
        (init_embeddings.main, init_args(fixtures_root, tmp_path / "init", repo)),
        (finetune.main, ft),
    ):
        if main is finetune.main:
            argv = [*argv, "--push-to-hub", repo]
        assert main(argv) == 2
        err = error_lines(capsys)
        assert len(err) == 1 and message in err[0] and repr(repo) in err[0], err
    ray = sys.modules.get("ray")
    assert not (tmp_path / "init").exists() and not (tmp_path / "ft").exists()
    assert ray is None or not ray.is_initialized()


def test_a_finished_output_is_pushed_by_a_rerun_without_recomputing(
    fixtures_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-wordpiece"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(tmp_path / "init"),
        cache_dir=str(tmp_path / "cache"),
        samples=0,
    )
    first = initialise(cfg)
    assert not first.skipped and first.pushed == ""
    pushed: list[tuple[set[str], str]] = []

    def push(directory: Path, repo: str) -> str:
        pushed.append(({p.name for p in Path(directory).iterdir()}, repo))
        return f"https://hub/{repo}"

    monkeypatch.setattr(sparse_model, "push_model", push)
    monkeypatch.setattr("sembridge_ray.recipes.init.run.check_push", lambda repo: None)
    stamp = (Path(first.output) / "_SUCCESS").stat().st_mtime_ns
    again = initialise(replace(cfg, push_to_hub="org/model"))
    assert again.skipped and again.pushed == "https://hub/org/model"
    # the model's files, its card among them
    assert pushed == [({p.name for p in Path(first.model).iterdir()}, "org/model")]
    assert CARD in pushed[0][0]
    # nothing recomputed or rewritten
    assert (Path(first.output) / "_SUCCESS").stat().st_mtime_ns == stamp
    record = json.loads((Path(first.output) / PUSHED).read_text())
    assert [(r["repo_id"], r["url"], r["scores"]) for r in record] == [
        ("org/model", "https://hub/org/model", [])
    ]
    # the record is beside the manifest, not in it: the output still verifies
    assert initialise(cfg).skipped


def test_scores_that_are_not_a_finished_evaluation_are_refused_before_any_work(
    fixtures_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--scores`` names outputs whose scores the pushed card shows: one that is not a finished
    evaluate or export output is one line (exit 2) before any work; without ``--push-to-hub`` the
    key is refused as unused."""
    monkeypatch.setattr("sembridge_ray.recipes.init.run.check_push", lambda repo: None)
    half = tmp_path / "eval"
    half.mkdir()
    (half / "metrics.json").write_text("{}")
    argv = [*init_args(fixtures_root, tmp_path / "init", "org/model"), "--scores", str(half)]
    assert init_embeddings.main(argv) == 2
    err = error_lines(capsys)
    assert err == [f"error: --scores {str(half)!r} is not a finished evaluate or export output"]
    assert not (tmp_path / "init").exists()

    ft = ft_args(fixtures_root, tmp_path / "ft")
    assert finetune.main([*ft, "--scores", str(half)]) == 2
    (line,) = error_lines(capsys)
    assert "scores" in line and "is read only with push_to_hub" in line
    assert not (tmp_path / "ft").exists()


def test_scores_of_another_model_are_refused_before_the_run(
    fixtures_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An evaluation names the model it scored by identity; the model an init run writes is named
    by the run's identity before anything is computed, so scores of another model are one line
    (exit 2) before any output exists. A model this run writes is refused nothing."""
    from sembridge_ray.runtime.identity import RunIdentity
    from sembridge_ray.runtime.manifest import IDENTITY, write_success

    def evaluation_of(model: str, out: Path) -> Path:
        out.mkdir()
        (out / "metrics.json").write_text(json.dumps({"dataset": "sick", "split": "test"}))
        identity = RunIdentity(job="evaluate", settings={}, inputs={"model": model})
        (out / IDENTITY).write_text(json.dumps(identity.to_dict()))
        write_success(out)
        return out

    monkeypatch.setattr("sembridge_ray.recipes.init.run.check_push", lambda repo: None)
    other = evaluation_of("run:init:0123456789abcdef01234567/model", tmp_path / "other")
    argv = [*init_args(fixtures_root, tmp_path / "init", "org/model"), "--scores", str(other)]
    assert init_embeddings.main(argv) == 2
    (line,) = error_lines(capsys)
    assert line.startswith(f"error: --scores {str(other)!r} scored another model (run:init:0123")
    assert not (tmp_path / "init").exists()
