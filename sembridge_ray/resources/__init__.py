"""Bundled data files (see ``resources/data/README.md`` for their sources and licences) and the
bridge vectors of the bundled vocabularies (``bridge_cache/README.md``)."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
SICK_DIR = DATA_DIR / "sick2014"
STS_DIR = DATA_DIR / "sts"
XQUAD_DIR = DATA_DIR / "xquad"
KORQUAD_DIR = DATA_DIR / "korquad"
CMRC2018_DIR = DATA_DIR / "cmrc2018"
ARCD_DIR = DATA_DIR / "arcd"
BRIDGE_CACHE_DIR = Path(__file__).resolve().parent / "bridge_cache"
