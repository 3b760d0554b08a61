from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sembridge_ray.data.sick import read_sick, read_sick_split, write_sick_beir
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.resources import sick_dir, sts_dir
from sembridge_ray.runtime.errors import InputError


def test_bundled_sick_has_the_paper_split_sizes() -> None:
    sizes = {split: len(read_sick_split(sick_dir(), split)) for split in ("train", "trial", "test")}
    assert sizes == {"train": 4500, "trial": 500, "test": 4927}
    first = read_sick_split(sick_dir(), "train")[0]
    assert (first.pair_id, first.score) == ("1", 4.5)


def test_bundled_sts_2012_2013_pool_has_5342_scored_pairs() -> None:
    assert sum(len(read_sts(f)) for f in sts_files(sts_dir(), [2012, 2013])) == 5342


def test_unscored_sts_lines_are_dropped() -> None:
    assert len(read_sts(sts_dir() / "2015" / "belief.test.tsv")) == 375


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\tonly two\t3.0\n", ":2: expected 5 columns"),
        ("1\ta\tb\tfour\tNEUTRAL\n", ":2: relatedness_score 'four'"),
    ],
)
def test_malformed_sick_row_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "SICK_train.txt"
    path.write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + line
    )
    with pytest.raises(InputError, match=f"SICK_train.txt{message}"):
        read_sick(path)


def test_malformed_sts_row_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    path.write_text("4.0\ta\tb\nabc\tc\td\n")
    with pytest.raises(InputError, match=r"x.tsv:2: score 'abc'"):
        read_sts(path)


def _judgements(root: Path, split: str) -> set[tuple[str, str, int]]:
    """(query text, document text, grade) of one qrels split of a BEIR directory, read back through
    its ids."""
    texts = {}
    for name in ("queries.jsonl", "corpus.jsonl"):
        for line in (root / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts[row["_id"]] = row["text"]
    rows = (root / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return {(texts[q], texts[d], int(g)) for q, d, g in (r.split("\t") for r in rows)}


def test_sick_beir_dev_is_the_trial_file_and_train_holds_no_trial_pair(tmp_path: Path) -> None:
    root = write_sick_beir(sick_dir(), tmp_path / "beir", splits=("train", "dev", "test"))
    # the oracle: SICK_trial.txt read with the csv module, graded by hand (>= 4.5: 2, >= 4.0: 1)
    with (sick_dir() / "SICK_trial.txt").open(encoding="utf-8", newline="") as fh:
        trial = [r for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    want = {
        (r["sentence_A"], r["sentence_B"], 2 if float(r["relatedness_score"]) >= 4.5 else 1)
        for r in trial
        if float(r["relatedness_score"]) >= 4.0
    }
    assert len(want) == 202 and _judgements(root, "dev") == want
    train = _judgements(root, "train")
    pairs = read_sick_split(sick_dir(), "train")
    # not train + trial
    assert train == {(p.a, p.b, 2 if p.score >= 4.5 else 1) for p in pairs if p.score >= 4.0}
    assert not {(a, b) for a, b, _ in train} & {(a, b) for a, b, _ in want}
    with pytest.raises(InputError, match="unknown SICK BEIR split 'trial'"):
        write_sick_beir(sick_dir(), tmp_path / "bad", splits=("trial",))
