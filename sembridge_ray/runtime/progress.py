"""Log lines a person can watch: one line per finished stage (counts and time), and, for long steps,
a progress line at least every :data:`EVERY_S` seconds with the rate and an ETA. Plain logging, no
terminal tricks, so the lines read the same in a terminal, in ``ray job logs`` and in a file.

The throttle is by time, never by unit of work: a step made of a few large units (a staged file of
5,000 documents) still says how far it is, through :meth:`Progress.watch` (a heartbeat while nothing
is counted) or a worker's own :class:`Progress` over the units it handles."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

EVERY_S = 10.0
"""The most seconds between two progress lines of a running step."""

Clock = Callable[[], float]


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
    """Counts work done out of ``total`` and logs ``what: done/total unit (pct), rate, ETA`` at most
    every ``every_s`` seconds while it runs (``every_s`` 0: on every :meth:`add`; infinite: only
    when asked).

    ``clock`` (``time.monotonic``) is replaceable, so tests need no sleeps. :meth:`add` and
    :meth:`tick` may be called from different threads."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        total: int,
        unit: str = "",
        every_s: float = EVERY_S,
        clock: Clock = time.monotonic,
        expected_s: float | None = None,
    ) -> None:
        self.log, self.what, self.total, self.unit, self.every_s = log, what, total, unit, every_s
        self.clock = clock
        self.expected_s = expected_s
        """An estimate of the whole step's seconds: the ETA while nothing is counted yet (a step
        done in one call, such as a native index build)."""
        self.done = 0
        self.start = self.last = clock()
        self._lock = threading.Lock()

    def add(self, count: int = 1) -> None:
        """``count`` more units done; a line when the last one is ``every_s`` old and work is
        left."""
        with self._lock:
            self.done += count
            self._emit_due()

    def tick(self) -> None:
        """A heartbeat: a line when the last one is ``every_s`` old, even if nothing was counted
        since (a unit of work can take longer than ``every_s``). Called by :meth:`watch`'s
        thread."""
        with self._lock:
            self._emit_due()

    def _emit_due(self) -> None:
        now = self.clock()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = (self.clock() if now is None else now) - self.start
        unit = f" {self.unit}" if self.unit else ""
        if self.done <= 0:
            head = f"{self.what}: 0/{self.total:,}{unit}, started {duration(elapsed)} ago"
            if self.expected_s is None:
                return head
            left = duration(max(0.0, self.expected_s - elapsed))
            return f"{head}, ETA {left} (estimated from its measured rate)"
        pct = 100 * self.done / self.total if self.total else 100.0
        head = f"{self.what}: {self.done:,}/{self.total:,}{unit} ({pct:.0f}%)"
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if rate <= 0:
            return f"{head}, ETA ?"
        speed = f"{rate:,.1f}/s" if rate >= 1 else f"{duration(1 / rate)} each"
        return f"{head}, {speed}, ETA {duration(max(0.0, (self.total - self.done) / rate))}"

    def finish(self) -> float:
        with self._lock:
            elapsed = self.clock() - self.start
            unit = f" {self.unit}" if self.unit else ""
            self.log.info("%s: %s%s in %s", self.what, f"{self.done:,}", unit, duration(elapsed))
            self.last = float("inf")  # a heartbeat still running stays quiet
            return elapsed

    @contextlib.contextmanager
    def watch(self, interval: float = 1.0) -> Iterator[Progress]:
        """While inside, a thread calls :meth:`tick` every ``interval`` seconds: a line at least
        every ``every_s`` seconds even while one large unit of work is under way (actors starting,
        one staged file)."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval):
                self.tick()

        thread = threading.Thread(target=beat, name=f"progress: {self.what}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


@contextlib.contextmanager
def stage(log: logging.Logger, what: str) -> Iterator[dict[str, str]]:
    """Log ``what: <details> (<time>)`` when the block ends; the block may put details in the
    yielded dict."""
    start = time.monotonic()
    details: dict[str, str] = {}
    yield details
    extra = ", ".join(f"{k} {v}" for k, v in details.items())
    log.info("%s%s (%s)", what, f": {extra}" if extra else "", duration(time.monotonic() - start))
