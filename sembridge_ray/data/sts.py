"""SemEval STS 2012-2016 pairs (``score<TAB>s1<TAB>s2``, 0-5, no header; unscored lines are
dropped)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sembridge_ray.data.sick import Pair
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.text import nonblank_lines


def read_sts(path: Path) -> list[Pair]:
    """Read one STS file; a wrong column count or a non-numeric score is an error naming
    ``file:line``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"STS file not found: {path}")
    pairs, name = [], f"{path.parent.name}/{path.name}"
    for lineno, line in nonblank_lines(path):
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != 3:
            raise InputError(
                f"{path}:{lineno}: expected 3 tab-separated columns, got {len(fields)}"
            )
        score, a, b = fields
        if not score.strip():
            continue  # pairs the organisers did not score
        try:
            value = float(score)
        except ValueError:
            raise InputError(f"{path}:{lineno}: score {score!r} is not a number") from None
        pairs.append(Pair(pair_id=f"{name}:{lineno}", a=a, b=b, score=value))
    return pairs


def sts_files(sts_dir: Path, years: Sequence[int]) -> list[Path]:
    """The scored ``*.tsv`` files of the given years, in a stable order."""
    files = []
    for year in years:
        year_dir = Path(sts_dir) / str(year)
        if not year_dir.is_dir():
            raise InputError(f"STS year directory not found: {year_dir}")
        files.extend(sorted(year_dir.glob("*.tsv")))
    return files


def read_sts_sentences(path: Path) -> list[str]:
    """Both sentences of every line of one STS file, scored or not (unlabeled text for word
    vectors)."""
    rows = [line.rstrip("\r\n").split("\t") for _, line in nonblank_lines(path)]
    return [s for fields in rows if len(fields) == 3 for s in fields[1:]]
