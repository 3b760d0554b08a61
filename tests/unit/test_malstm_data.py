from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from jobs import malstm as job
from sembridge_ray.data.sick import Pair
from sembridge_ray.resources import sick_dir, sts_dir
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese.data import (
    encode_pairs,
    leak_guard,
    normalise,
    read_sts_pool,
    split_validation,
    tokenize,
    tokenize_pairs,
    vocabulary,
)

HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"


def test_tokenize_splits_whitespace_and_punctuation_and_keeps_case() -> None:
    assert tokenize("A man, isn't  playing.") == ["A", "man", ",", "isn", "'", "t", "playing", "."]
    assert (
        normalise("A man is Playing a guitar.")
        == normalise("a man  is playing a guitar")
        == "a man is playing a guitar"
    )


def test_leak_guard_drops_test_pairs_in_either_order_after_normalising() -> None:
    test = [
        Pair(pair_id="1", a="A man is playing a guitar", b="A woman is slicing an onion", score=3.0)
    ]
    pool = [
        Pair(
            pair_id="s:1",
            a="a woman is slicing an onion.",
            b="A man is  playing a guitar .",
            score=4.0,
        ),  # swapped
        Pair(
            pair_id="s:2",
            a="A man is playing a guitar.",
            b="A woman is slicing an onion",
            score=4.0,
        ),  # same order
        Pair(
            pair_id="s:3",
            a="A man is playing a guitar.",
            b="A woman is slicing a tomato",
            score=2.0,
        ),
    ]  # not the pair
    kept, removed = leak_guard(pool, test)
    assert removed == 2 and [p.pair_id for p in kept] == ["s:3"]


def test_validation_split_is_seeded_disjoint_and_sized() -> None:
    pairs = [Pair(pair_id=str(i), a="a", b="b", score=1.0) for i in range(100)]
    train, val = split_validation(pairs, 0.3, np.random.default_rng(0))
    again = split_validation(pairs, 0.3, np.random.default_rng(0))
    assert (len(train), len(val)) == (70, 30) and (train, val) == again
    assert {p.pair_id for p in train}.isdisjoint({p.pair_id for p in val})
    with pytest.raises(InputError, match="empty split"):
        split_validation(pairs[:1], 0.3, np.random.default_rng(0))


def test_sts_pool_maps_scores_onto_one_to_five() -> None:
    pool = read_sts_pool(sts_dir(), [2012, 2013])
    assert len(pool) == 5342
    assert min(p.score for p in pool) >= 1.0 and max(p.score for p in pool) <= 5.0
    assert pool[0].score == pytest.approx(1 + 0.8 * 4.4)  # MSRpar.test.tsv:1 scores 4.400


def test_encoded_pairs_are_padded_id_arrays() -> None:
    pairs = tokenize_pairs([Pair(pair_id="1", a="A man", b="A man is here", score=2.0)])
    vocab = vocabulary(pairs)
    enc = encode_pairs(pairs, vocab)
    assert enc.ids_a.tolist() == [[1, 2]] and enc.ids_b.tolist() == [[1, 2, 3, 4]]
    assert enc.len_a.tolist() == [2] and enc.len_b.tolist() == [4] and enc.score.tolist() == [2.0]


def _sick_copy(tmp_path: Path, train_extra: str = "", trial: str | None = None) -> Path:
    d = tmp_path / "sick"
    d.mkdir()
    for name in ("SICK_train.txt", "SICK_test_annotated.txt"):
        (d / name).write_bytes(
            (sick_dir() / name).read_bytes() + train_extra.encode() * (name == "SICK_train.txt")
        )
    (d / "SICK_trial.txt").write_text(
        trial if trial is not None else (sick_dir() / "SICK_trial.txt").read_text()
    )
    return d


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("99999\tonly\tthree\n", r"SICK_train.txt:4502: expected 5 columns"),
        ("99999\ta\tb\tfour\tNEUTRAL\n", r"SICK_train.txt:4502: relatedness_score 'four'"),
    ],
)
def test_malformed_sick_row_fails_the_job_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, message: str
) -> None:
    out = tmp_path / "out"
    code = job.main(
        ["--preset", "smoke", "--output", str(out), "--sick", str(_sick_copy(tmp_path, extra))]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert re.search(message, err)
    assert not (out / "_SUCCESS").exists()


def test_malformed_sts_row_fails_the_job_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sts = tmp_path / "sts" / "2012"
    sts.mkdir(parents=True)
    (sts / "x.test.tsv").write_text("4.0\ta\tb\nfive\tc\td\n")
    code = job.main(
        [
            "--preset",
            "smoke",
            "--output",
            str(tmp_path / "o"),
            "--sts",
            str(tmp_path / "sts"),
            "--sts-years",
            "2012",
        ]
    )
    assert code == 2 and "x.test.tsv:2: score 'five'" in capsys.readouterr().err


def test_missing_vectors_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "GoogleNews-vectors-negative300.bin"
    code = job.main(["--output", str(tmp_path / "o"), "--vectors", f"word2vec:{missing}"])
    assert code == 2 and f"word2vec vectors file not found: {missing}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_empty_split_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sick = _sick_copy(tmp_path, trial=HEADER)
    (sick / "SICK_train.txt").write_text(HEADER)
    code = job.main(["--preset", "smoke", "--output", str(tmp_path / "o"), "--sick", str(sick)])
    err = capsys.readouterr().err
    assert code == 2 and "SICK_train.txt: no pairs" in err
