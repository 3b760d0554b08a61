"""Log lines a person can watch: one line per finished stage (counts and time), and, for long steps, a progress line
at most every :data:`EVERY_S` seconds with the rate and an ETA. Plain logging, no terminal tricks, so the lines read
the same in a terminal, in ``ray job logs`` and in a file.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

EVERY_S = 15.0


def duration(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 2 h 10 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Counts work done out of ``total`` and logs ``what: done/total unit (pct), rate, ETA`` now and then."""

    def __init__(self, log: logging.Logger, what: str, total: int, unit: str = "", every_s: float = EVERY_S) -> None:
        self.log, self.what, self.total, self.unit, self.every_s = log, what, total, unit, every_s
        self.done = 0
        self.start = self.last = time.monotonic()

    def add(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        pct = 100 * self.done / self.total if self.total else 100.0
        eta = duration(left) if left == left else "?"  # nan until the first unit is done
        return f"{self.what}: {self.done:,}/{self.total:,} {self.unit} ({pct:.0f}%), {rate:,.1f}/s, ETA {eta}"

    def finish(self) -> float:
        elapsed = time.monotonic() - self.start
        self.log.info("%s: %s %s in %s", self.what, f"{self.done:,}", self.unit, duration(elapsed))
        return elapsed


@contextlib.contextmanager
def stage(log: logging.Logger, what: str) -> Iterator[dict[str, str]]:
    """Log ``what: <details> (<time>)`` when the block ends; the block may put details in the yielded dict."""
    start = time.monotonic()
    details: dict[str, str] = {}
    yield details
    extra = ", ".join(f"{k} {v}" for k, v in details.items())
    log.info("%s%s (%s)", what, f": {extra}" if extra else "", duration(time.monotonic() - start))
