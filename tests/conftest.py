"""Shared fixtures: offline settings, the test device, and the tiny models built once per
session."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Local Ray clusters started by tests bind to loopback only (see
# sembridge_ray/distributed/__init__.py).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parent.parent
# Real third-party files (tokenizers, MIRACL topics, WordNet) live beside the checkout; tests that
# need them skip where they are absent. SEMBRIDGE_SHARED_DATA points elsewhere.
SHARED_DATA = Path(os.environ.get("SEMBRIDGE_SHARED_DATA", REPO.parent / "shared" / "data"))

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """stderr without the timestamped progress log lines that may precede an error."""
    return [
        line for line in capsys.readouterr().err.strip().splitlines() if not LOG_LINE.match(line)
    ]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", default=None, help="torch device for the unit suite (also TORCH_DEVICE)"
    )


def pytest_configure(config: pytest.Config) -> None:
    device = config.getoption("--device")
    if device:
        os.environ["TORCH_DEVICE"] = device


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).parent.name in ("ray", "chaos"):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def device() -> str:
    from sembridge_ray.runtime.placement import pick_device

    return pick_device()


@pytest.fixture(scope="session")
def fixtures_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tiny model and tokenizer of ``sembridge_ray.testing``, built once (about 6 s)."""
    from sembridge_ray.testing import build_all

    root = tmp_path_factory.mktemp("fixtures")
    build_all(root)
    return root


@pytest.fixture(scope="session")
def sick_beir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BEIR directory built from the bundled SICK pairs (first 400 pairs of each split): qrels
    ``train`` (SICK train), ``dev`` (SICK trial: ``eval=<it>`` with ``eval_split=dev`` in
    fine-tuning tests) and ``test``."""
    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.resources import sick_dir

    out = tmp_path_factory.mktemp("sick") / "beir"
    return write_sick_beir(sick_dir(), out, limit=400, splits=("train", "dev", "test"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
