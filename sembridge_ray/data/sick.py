"""SICK 2014 relatedness pairs (TSV with a header; ``relatedness_score`` on 1-5)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from sembridge_ray.errors import InputError

SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
_REQUIRED = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score")


@dataclass(frozen=True)
class Pair:
    """A scored sentence pair; ``pair_id`` is SICK's ``pair_ID`` or ``<file>:<line>`` for STS."""

    pair_id: str
    a: str
    b: str
    score: float


def read_sick(path: Path) -> list[Pair]:
    """Read one SICK file; a malformed row is an :class:`InputError` naming ``file:line``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"SICK file not found: {path}")
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or any(col not in rows[0] for col in _REQUIRED):
        raise InputError(f"{path}:1: header must contain {', '.join(_REQUIRED)}")
    header = rows[0]
    index = [header.index(col) for col in _REQUIRED]
    pairs = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise InputError(f"{path}:{lineno}: expected {len(header)} columns, got {len(row)}")
        pid, a, b, score = (row[i] for i in index)
        try:
            value = float(score)
        except ValueError:
            raise InputError(f"{path}:{lineno}: relatedness_score {score!r} is not a number") from None
        pairs.append(Pair(pid, a, b, value))
    if not pairs:
        raise InputError(f"{path}: no pairs")
    return pairs


def read_sick_split(sick_dir: Path, split: str) -> list[Pair]:
    if split not in SICK_FILES:
        raise InputError(f"unknown SICK split {split!r} (known: {', '.join(SICK_FILES)})")
    return read_sick(Path(sick_dir) / SICK_FILES[split])
