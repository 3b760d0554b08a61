"""Progress lines by time, with an ETA, on a fake clock (no sleeps)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from sembridge_ray.runtime.progress import EVERY_S, Progress, duration

log = logging.getLogger("sembridge_ray.test_progress")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=log.name)


def test_a_line_every_ten_seconds_with_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    progress = Progress(log, "encoding documents", 1000, "texts", clock=clock)
    assert EVERY_S == 10.0
    clock.now += 9.9
    progress.add(99)
    assert caplog.messages == []  # not yet ten seconds
    clock.now += 0.1
    progress.add(1)
    assert caplog.messages == ["encoding documents: 100/1,000 texts (10%), 10.0/s, ETA 1 min 30 s"]
    clock.now += 5
    progress.add(100)
    assert len(caplog.messages) == 1  # the throttle is by time, not by count
    clock.now += 5
    progress.add(100)
    assert caplog.messages[-1] == "encoding documents: 300/1,000 texts (30%), 15.0/s, ETA 46.7 s"


def test_the_throttle_is_by_time_even_for_units_larger_than_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One staged file of 5,000 documents: each add is minutes apart, each gets its line."""
    clock = FakeClock()
    progress = Progress(log, "encoding documents", 3, "files", clock=clock)
    for _ in range(2):
        clock.now += 120
        progress.add()
    assert caplog.messages == [
        "encoding documents: 1/3 files (33%), 2 min 00 s each, ETA 4 min 00 s",
        "encoding documents: 2/3 files (67%), 2 min 00 s each, ETA 2 min 00 s",
    ]


def test_a_heartbeat_while_nothing_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    progress = Progress(log, "bridge encoding", 30522, "strings", clock=clock)
    clock.now += 9
    progress.tick()
    assert caplog.messages == []
    clock.now += 1
    progress.tick()
    assert caplog.messages == ["bridge encoding: 0/30,522 strings, started 10.0 s ago"]
    clock.now += 4
    progress.add(1000)  # counted, but the last line is 4 s old
    progress.tick()
    assert len(caplog.messages) == 1
    clock.now += 6
    progress.tick()
    assert (
        caplog.messages[-1] == "bridge encoding: 1,000/30,522 strings (3%), 50.0/s, ETA 9 min 50 s"
    )


def test_finish_says_how_long_and_ends_the_heartbeat(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    progress = Progress(log, "weights", 10, "rows", clock=clock)
    clock.now += 3
    progress.add(10)
    assert caplog.messages == []  # the last unit: no progress line, the finish line says it
    assert progress.finish() == pytest.approx(3.0)
    clock.now += 60
    progress.tick()
    assert caplog.messages == ["weights: 10 rows in 3.0 s"]


def test_no_eta_before_time_has_passed(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    progress = Progress(log, "search", 10, "queries", every_s=0.0, clock=clock)
    progress.add(2)
    assert caplog.messages == ["search: 2/10 queries (20%), ETA ?"]


def test_watch_beats_from_a_thread(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    progress = Progress(log, "bridge encoding", 5, "strings", clock=clock)
    beat = threading.Event()
    original = progress.tick

    def tick() -> None:
        original()
        if caplog.messages:
            beat.set()

    progress.tick = tick  # type: ignore[method-assign]
    clock.now += EVERY_S
    with progress.watch(interval=0.001):
        assert beat.wait(10), "the heartbeat thread never logged"
    assert caplog.messages[0] == "bridge encoding: 0/5 strings, started 10.0 s ago"
    assert not any(t.name.startswith("progress:") for t in threading.enumerate())


@pytest.mark.parametrize(
    ("seconds", "text"), [(12.34, "12.3 s"), (245, "4 min 05 s"), (7800, "2 h 10 min")]
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_encoding_reports_each_batch_so_a_long_file_shows_progress(fixtures_root: Path) -> None:
    """What an evaluate encoder actor counts in its Progress (``SparseEncodeUDF``): every batch as
    it is done."""
    from sentence_transformers import SparseEncoder

    from sembridge_ray.sparse.encode import encode_texts

    model = SparseEncoder(str(fixtures_root / "bert-mlm"), device="cpu").eval()
    texts = [f"text number {i} " * (1 + i % 3) for i in range(10)]
    counts: list[int] = []
    encode_texts(model, texts, 4, "document", done=counts.append)
    assert counts == [4, 4, 2]
