from __future__ import annotations

from pathlib import Path

import pytest

from sembridge_ray.data.sick import read_sick, read_sick_split
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.errors import InputError
from sembridge_ray.resources import SICK_DIR, STS_DIR


def test_bundled_sick_has_the_paper_split_sizes() -> None:
    sizes = {split: len(read_sick_split(SICK_DIR, split)) for split in ("train", "trial", "test")}
    assert sizes == {"train": 4500, "trial": 500, "test": 4927}
    first = read_sick_split(SICK_DIR, "train")[0]
    assert (first.pair_id, first.score) == ("1", 4.5)


def test_bundled_sts_2012_2013_pool_has_5342_scored_pairs() -> None:
    assert sum(len(read_sts(f)) for f in sts_files(STS_DIR, [2012, 2013])) == 5342


def test_unscored_sts_lines_are_dropped() -> None:
    assert len(read_sts(STS_DIR / "2015" / "belief.test.tsv")) == 375


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\tonly two\t3.0\n", ":2: expected 5 columns"),
        ("1\ta\tb\tfour\tNEUTRAL\n", ":2: relatedness_score 'four'"),
    ],
)
def test_malformed_sick_row_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "SICK_train.txt"
    path.write_text("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + line)
    with pytest.raises(InputError, match=f"SICK_train.txt{message}"):
        read_sick(path)


def test_malformed_sts_row_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    path.write_text("4.0\ta\tb\nabc\tc\td\n")
    with pytest.raises(InputError, match=r"x.tsv:2: score 'abc'"):
        read_sts(path)
