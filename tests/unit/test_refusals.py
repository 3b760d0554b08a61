"""What cannot be right is refused with one line and exit 2, before any work and with nothing
written: settings that would erase the bridge, a frequency bias that would be constant, a
development set that is a test set, inputs that cannot be read or are pickles, and a second writer
of one new export (issue 33, points 10-12). No Ray starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import evaluate, finetune, init_embeddings
from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.embed_init.bridge import bridge_dimension
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.runtime.atomic import atomic_new_path
from tests.conftest import error_lines


def _init(fixtures_root: Path, out: Path, *extra: str) -> int:
    """The tiny BERT to the cased WordPiece target (characters it has never seen are its [UNK], a
    special)."""
    argv = [
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--target-tokenizer",
        str(fixtures_root / "tok-wordpiece"),
    ]
    argv += [
        "--bridge-model",
        str(fixtures_root / "bridge"),
        "--output",
        str(out),
        f"cache_dir={out.parent / 'c'}",
    ]
    return init_embeddings.main([*argv, *extra])


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    said = error_lines(capsys)
    assert len(said) == 1 and said[0].startswith("error: "), said
    return said[0]


def test_bridge_components_at_the_bridges_dimension_are_refused(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """abtt removing as many principal directions as the bridge has dimensions maps every token to
    one point."""
    dim = bridge_dimension(str(fixtures_root / "bridge"))
    assert dim == 32  # the tiny bridge's pooling says so, read without loading its weights
    out = tmp_path / "out"
    assert _init(fixtures_root, out, "--bridge-space", "abtt", f"bridge_components={dim}") == 2
    assert "bridge_components=32: must be below the bridge's dimension 32" in _one_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("\n   \n", "holds no text"),
        ("ああああ いいい\n", "none of them occurs among the"),
        (
            b"a man is playing\n\xff\xfe guitar\n",
            "--bias-text {path}:2: not UTF-8 text (byte 0xff at column 1)",
        ),
    ],
    ids=["empty", "no-target-token", "not-utf8"],
)
def test_a_frequency_bias_text_that_cannot_give_a_bias_is_refused(
    fixtures_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str | bytes,
    said: str,
) -> None:
    path = tmp_path / "text.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    out = tmp_path / "out"
    assert _init(fixtures_root, out, "--bias", "frequency", "--bias-text", str(path)) == 2
    assert said.format(path=path) in _one_error(capsys)
    assert not out.exists()


def test_miracls_dev_split_is_refused_as_a_development_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The evaluate job scores MIRACL's dev judgements as its test: choosing a recipe on them is
    choosing on test."""
    with pytest.raises(ValueError, match="it is what evaluate scores as its test"):
        FinetuneConfig(eval="miracl:ar", eval_split="dev")
    # its training judgements may be held out for that
    FinetuneConfig(eval="miracl:ar", eval_split="train")
    argv = ["--model", "m", "--train", "t", "--output", str(tmp_path / "o"), "--eval", "miracl:ko"]
    assert finetune.main(argv) == 2
    assert "eval_split='dev': of miracl:ko: it is what evaluate scores as its test" in _one_error(
        capsys
    )


def _pickled(fixtures_root: Path, root: Path) -> Path:
    """The tiny sparse encoder with its weights as a pickle (``pytorch_model.bin``) instead of
    safetensors."""
    import torch
    from safetensors.torch import load_file

    model = root / "pickled"
    shutil.copytree(fixtures_root / "bert-mlm", model)
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    return model


def test_pickled_weights_are_refused_before_anything_is_claimed(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sick_beir: Path
) -> None:
    model = _pickled(fixtures_root, tmp_path)
    argv = ["--model", str(model), "--dataset", str(sick_beir), "--output", str(tmp_path / "eval")]
    assert evaluate.main(argv) == 2
    assert (
        "weights are pickle files only (pytorch_model.bin); this project loads safetensors only"
        in _one_error(capsys)
    )
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({QUERY: ["a", "b"], POSITIVE: ["c", "d"]}), pairs)
    assert (
        finetune.main(
            ["--model", str(model), "--train", str(pairs), "--output", str(tmp_path / "ft")]
        )
        == 2
    )
    assert "pickle files only" in _one_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.parquet", "pickled"]


def test_of_two_writers_of_one_new_directory_the_second_fails_and_the_first_is_kept(
    tmp_path: Path,
) -> None:
    """Two exports into one new output both once reported success, the later silently replacing the
    earlier."""
    out = tmp_path / "model"
    with pytest.raises(FileExistsError) as err, atomic_new_path(out) as late:
        late.mkdir()
        (late / "weights").write_text("late")
        with atomic_new_path(out) as early:  # another writer, which finishes first
            early.mkdir()
            (early / "weights").write_text("early")
        assert (out / "weights").read_text() == "early"
    assert err.value.filename == str(out)
    assert (out / "weights").read_text() == "early" and [p.name for p in tmp_path.iterdir()] == [
        "model"
    ]


def test_an_error_while_writing_a_new_directory_names_it_not_its_temporary(tmp_path: Path) -> None:
    out = tmp_path / "model"
    with pytest.raises(OSError) as err, atomic_new_path(out) as tmp:
        # no such directory: an OSError naming the temporary
        (tmp / "missing" / "file").write_text("x")
    assert err.value.filename == str(out) and ".tmp-" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kept", [[], ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]], ids=["empty", "specials-only"]
)
def test_a_target_tokenizer_without_a_vocabulary_is_refused(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kept: list[str]
) -> None:
    """Its added special tokens make it load as a "5-token" tokenizer; the model made for it was
    marked complete and failed at every encoding (issue 42, point 2)."""
    import json

    from transformers import AutoTokenizer

    tok = tmp_path / "tok"
    shutil.copytree(fixtures_root / "tok-wordpiece", tok)
    spec = json.loads((tok / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"] = {t: i for i, t in enumerate(kept)}
    (tok / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    assert len(AutoTokenizer.from_pretrained(str(tok))) == 5  # it loads
    out = tmp_path / "out"
    argv = ["--model", str(fixtures_root / "bert-mlm"), "--target-tokenizer", str(tok)]
    argv += ["--bridge-model", str(fixtures_root / "bridge"), "--output", str(out)]
    assert init_embeddings.main([*argv, f"cache_dir={tmp_path / 'c'}"]) == 2
    line = _one_error(capsys)
    assert f"target tokenizer {str(tok)!r}" in line and "special" in line, line
    assert not out.exists()


def test_an_evaluation_written_inside_the_model_it_scores_is_refused(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sick_beir: Path
) -> None:
    """Its run files would change the model's identity, and the evaluation would then fail saying
    the model changed, at every rerun (issue 42, point 9, as for the export)."""
    from sembridge_ray.runtime.identity import path_identity

    model = tmp_path / "model"
    shutil.copytree(fixtures_root / "bert-mlm", model)
    before = path_identity(model)
    argv = ["--model", str(model), "--dataset", str(sick_beir), "--output", str(model / "eval")]
    assert evaluate.main(argv) == 2
    assert f"output {model / 'eval'} is inside the model {model}" in _one_error(capsys)
    assert not (model / "eval").exists() and path_identity(model) == before


def test_a_tokenizer_json_that_is_not_a_tokenizer_is_named(
    fixtures_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said ``cannot load tokenizer ...: 'added_tokens'`` (issue 42, point 11)."""
    tok = tmp_path / "tok"
    shutil.copytree(fixtures_root / "tok-wordpiece", tok)
    (tok / "tokenizer.json").write_text('{"vocab_size": 5, "model_type": "bert"}\n')
    out = tmp_path / "out"
    argv = ["--model", str(fixtures_root / "bert-mlm"), "--target-tokenizer", str(tok)]
    argv += ["--bridge-model", str(fixtures_root / "bridge"), "--output", str(out)]
    assert init_embeddings.main([*argv, f"cache_dir={tmp_path / 'c'}"]) == 2
    line = _one_error(capsys)
    assert f"cannot load tokenizer {str(tok)!r}: tokenizer.json is not a tokenizer file" in line
    assert "(the tokenizers library: " in line and not out.exists()
