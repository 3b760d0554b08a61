"""Bundled data files (see ``resources/data/README.md`` for their sources and licences)."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
SICK_DIR = DATA_DIR / "sick2014"
STS_DIR = DATA_DIR / "sts"
